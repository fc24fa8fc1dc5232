"""Running on a Ray cluster: the cluster joined, node actor resources, paths.

The fast tests check :mod:`tpsl_flwr.engines.ray_cluster` and the launchers'
use of it without starting Ray. The slow test starts a two-raylet local Ray
cluster (own temp folder and ports, every process marked and ended by PID:
never ``ray stop``, which ends every Ray process on the host), runs the TPSL
app on it through ``simulate --engine ray``'s path with one raylet and through
``tpsl-flwr flower-run`` with two, and checks where the node actors ran and
that the test AUC is the same.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from tpsl_flwr.cli.main import main
from tpsl_flwr.engines import ray_cluster, simulation
from tpsl_flwr.engines.flower_env import free_ports
from tpsl_flwr.engines.flwr_cli import CompletedRun
from tpsl_flwr.engines.processes import (
    LAUNCH_ID_ENV,
    find_launched_processes,
    terminate_launched,
)
from tpsl_flwr.engines.ray_cluster import (
    RayTarget,
    client_resources,
    ray_address_file,
    resolve_ray_target,
)
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments import ray_run as flower_run
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.experiment import RESULTS_FILE
from tpsl_flwr.experiments.ray_run import absolute_paths, run_on_ray
from tpsl_flwr.experiments.run import run_experiment

APP_DIR = Path(__file__).parents[2]


@pytest.fixture
def listening() -> Iterator[str]:
    """A ``host:port`` that accepts TCP connections (a stand-in GCS)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield f"127.0.0.1:{server.getsockname()[1]}"


def _closed_address() -> str:
    """A ``host:port`` nothing listens on (free a moment ago)."""
    return f"127.0.0.1:{free_ports(1)[0]}"


# ------------------------------------------------------------- the target


def test_no_address_and_no_ray_start_means_a_new_local_instance(tmp_path):
    assert resolve_ray_target({"RAY_TMPDIR": str(tmp_path)}) == RayTarget(None, "local")
    target = resolve_ray_target({"RAY_ADDRESS": "local"})
    assert not target.joins_cluster


def test_ray_address_that_answers_is_joined(listening, tmp_path):
    target = resolve_ray_target({"RAY_ADDRESS": listening})
    assert target == RayTarget(listening, "RAY_ADDRESS")
    assert target.joins_cluster
    assert listening in target.describe()


def test_unreachable_ray_address_is_one_clear_error():
    address = _closed_address()
    with pytest.raises(ConfigError) as err:
        resolve_ray_target({"RAY_ADDRESS": address}, timeout=1.0)
    message = str(err.value)
    assert f"RAY_ADDRESS {address!r} is not reachable" in message
    assert "\n" not in message


@pytest.mark.parametrize("bad", ["head", "head:port", ":6379", "head:0", "h:70000"])
def test_malformed_ray_address_is_named(bad):
    with pytest.raises(ConfigError, match=f"RAY_ADDRESS '{bad}' is not a Ray GCS"):
        resolve_ray_target({"RAY_ADDRESS": bad})


def test_ray_client_address_is_refused():
    with pytest.raises(ConfigError, match="Ray Client address"):
        resolve_ray_target({"RAY_ADDRESS": "ray://head:10001"})


def test_latest_ray_start_on_this_host_is_joined(listening, tmp_path):
    record = ray_address_file({"RAY_TMPDIR": str(tmp_path)})
    record.parent.mkdir(parents=True)
    record.write_text(listening + "\n")
    env = {"RAY_TMPDIR": str(tmp_path)}
    assert resolve_ray_target(env) == RayTarget(listening, "ray start")
    assert resolve_ray_target({**env, "RAY_ADDRESS": "auto"}).address == listening
    # RAY_ADDRESS=local still starts a new instance, as Ray does
    assert not resolve_ray_target({**env, "RAY_ADDRESS": "local"}).joins_cluster


def test_a_ray_start_record_others_can_write_is_not_followed(listening, tmp_path):
    # Another local user could point it at their own cluster: refuse, naming it.
    record = ray_address_file({"RAY_TMPDIR": str(tmp_path)})
    record.parent.mkdir(parents=True)
    record.write_text(listening + "\n")
    record.chmod(0o666)
    with pytest.raises(ConfigError, match=r"cluster belongs to uid .*0o666"):
        resolve_ray_target({"RAY_TMPDIR": str(tmp_path)})
    record.chmod(0o644)
    assert resolve_ray_target({"RAY_TMPDIR": str(tmp_path)}).address == listening


def test_a_ray_start_record_of_another_user_is_not_followed(
    listening, tmp_path, monkeypatch
):
    record = ray_address_file({"RAY_TMPDIR": str(tmp_path)})
    record.parent.mkdir(parents=True)
    record.write_text(listening + "\n")
    monkeypatch.setattr(ray_cluster.os, "getuid", lambda: record.stat().st_uid + 1)
    with pytest.raises(ConfigError, match="RAY_ADDRESS=<head-ip>:<gcs-port>"):
        resolve_ray_target({"RAY_TMPDIR": str(tmp_path)})


def test_the_checked_target_is_pinned_for_the_runs_processes(tmp_path, monkeypatch):
    # Without a cluster the run's ray.init() gets RAY_ADDRESS=local, so a record
    # written after the check cannot redirect it.
    seen: dict[str, Any] = {}

    def fake_flwr_run(app, federation, args, env, log, timeout):
        seen["env"] = env
        return None, 1, "", 0.0

    monkeypatch.setattr(simulation, "flwr_run", fake_flwr_run)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "no-config"))
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "empty"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    simulation.run_flwr_simulation(APP_DIR, 2, {}, tmp_path / "home", check=False)
    assert seen["env"]["RAY_ADDRESS"] == "local"


def test_stale_ray_start_record_is_one_clear_error(tmp_path):
    record = ray_address_file({"RAY_TMPDIR": str(tmp_path)})
    record.parent.mkdir(parents=True)
    record.write_text(_closed_address())
    with pytest.raises(ConfigError, match="the latest `ray start` on this host"):
        resolve_ray_target({"RAY_TMPDIR": str(tmp_path)}, timeout=1.0)


def test_auto_without_ray_start_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="RAY_ADDRESS=auto but no `ray start`"):
        resolve_ray_target({"RAY_ADDRESS": "auto", "RAY_TMPDIR": str(tmp_path)})


# ------------------------------------------------------- client resources


def _flower_config(home: Path, resources: dict[str, Any]) -> dict[str, str]:
    config = {
        "superlink": {
            "default": "local",
            "local": {"options": {"backend": {"client-resources": resources}}},
        }
    }
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(tomli_w.dumps(config))
    return {"FLWR_HOME": str(home)}


def test_client_resources_follow_the_flower_config(tmp_path):
    env = _flower_config(tmp_path, {"num-cpus": 3, "num-gpus": 0.5})
    expected = {"client-resources-num-cpus": 3, "client-resources-num-gpus": 0.5}
    assert client_resources(RayTarget(None, "local"), env) == expected
    assert client_resources(RayTarget("h:1", "RAY_ADDRESS"), env) == expected


def test_client_resources_default_to_one_cpu_only_on_a_cluster(tmp_path):
    env = {"FLWR_HOME": str(tmp_path)}  # no config.toml there
    assert client_resources(RayTarget("h:1", "RAY_ADDRESS"), env) == {
        "client-resources-num-cpus": 1
    }
    assert client_resources(RayTarget(None, "local"), env) == {}


@pytest.mark.parametrize(
    ("resources", "match"),
    [
        ({"num-cpus": 0.5}, "num-cpus must be an integer >= 1"),
        ({"num-cpus": 0}, "num-cpus must be an integer >= 1"),
        ({"num-gpus": -1}, "num-gpus must be >= 0"),
        ({"memory": 10}, r"unknown client resources \['memory'\]"),
    ],
)
def test_bad_client_resources_are_named(tmp_path, resources, match):
    env = _flower_config(tmp_path, resources)
    with pytest.raises(ConfigError, match=match):
        client_resources(RayTarget(None, "local"), env)


# ------------------------------------------------------------ the launchers


def _launch_refused(*_args: Any, **_kwargs: Any) -> Any:
    pytest.fail("nothing may be launched")


def test_simulation_checks_the_cluster_before_launching(tmp_path, monkeypatch):
    monkeypatch.setattr(simulation, "flwr_run", _launch_refused)
    monkeypatch.setenv("RAY_ADDRESS", _closed_address())
    with pytest.raises(ConfigError, match="is not reachable"):
        simulation.run_flwr_simulation(APP_DIR, 2, {}, tmp_path / "home")


def test_simulation_refuses_init_args_on_a_cluster(tmp_path, monkeypatch, listening):
    monkeypatch.setattr(simulation, "flwr_run", _launch_refused)
    with pytest.raises(ConfigError, match=r"\['init-args-num-cpus'\] cannot apply"):
        simulation.run_flwr_simulation(
            APP_DIR,
            2,
            {},
            tmp_path / "home",
            federation_config={"init-args-num-cpus": 2},
            ray_target=RayTarget(listening, "RAY_ADDRESS"),
        )


def test_simulation_passes_client_resources_on_a_cluster(
    tmp_path, monkeypatch, listening
):
    seen: dict[str, Any] = {}

    def fake_flwr_run(app, federation, args, env, log, timeout):
        seen["args"], seen["env"] = args, env
        return None, 1, "", 0.0

    monkeypatch.setattr(simulation, "flwr_run", fake_flwr_run)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "no-config"))
    monkeypatch.setenv("RAY_ADDRESS", listening)
    simulation.run_flwr_simulation(APP_DIR, 2, {}, tmp_path / "home", check=False)
    federation = seen["args"][seen["args"].index("--federation-config") + 1]
    assert federation == "num-supernodes=2 client-resources-num-cpus=1"
    assert seen["env"]["RAY_ADDRESS"] == listening  # reaches flwr-simulation


def test_absolute_paths_resolve_against_the_callers_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = {
        "out-dir": "runs/a",
        "label-dir": "",
        "data-path": "~/day_0.gz",
        "transcript-dir": "t",
    }
    resolved = absolute_paths(config, {"epochs": 1})
    assert resolved == {
        "epochs": 1,
        "out-dir": str(tmp_path / "runs" / "a"),
        "data-path": str(Path("~/day_0.gz").expanduser()),
        "transcript-dir": str(tmp_path / "t"),
    }


def test_run_on_ray_passes_absolute_paths_and_names_the_cluster(
    tmp_path, monkeypatch, listening
):
    # Prepare: a stand-in for flwr run that writes the ServerApp's results
    monkeypatch.chdir(tmp_path)
    (tmp_path / "day_0.txt").write_text("")
    seen: dict[str, Any] = {}

    def fake(app, n, overrides, **kwargs: Any) -> CompletedRun:
        seen.update(overrides=overrides, target=kwargs["ray_target"])
        out = Path(overrides["out-dir"])
        (out / RESULTS_FILE).write_text(json.dumps({"engine": "ray"}))
        return CompletedRun(1, "finished:completed", "", 0, "", 2.0, out, "x")

    monkeypatch.setattr(flower_run, "run_flwr_simulation", fake)
    monkeypatch.setenv("RAY_ADDRESS", listening)
    echo = io.StringIO()

    # Execute
    results = run_on_ray(
        {"out-dir": "out", "dataset": "criteo", "data-path": "day_0.txt"},
        app_dir=APP_DIR,
        echo=echo,
    )

    # Assert
    assert seen["overrides"]["data-path"] == str(tmp_path / "day_0.txt")
    assert seen["overrides"]["out-dir"] == str(tmp_path / "out")
    assert seen["target"] == RayTarget(listening, "RAY_ADDRESS")
    assert echo.getvalue().splitlines()[0] == (
        f"Ray: joining the cluster at {listening} (RAY_ADDRESS)"
    )
    assert results["ray_address"] == listening


def test_flower_run_with_unreachable_cluster_exits_with_one_line(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(flower_run, "run_flwr_simulation", _launch_refused)
    address = _closed_address()
    monkeypatch.setenv("RAY_ADDRESS", address)
    status = main(
        ["flower-run", "--run-config", f"out-dir='{tmp_path / 'out'}'", "epochs=1"]
    )
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert err.startswith("tpsl-flwr flower-run: error: RAY_ADDRESS")
    assert address in err and "\n" not in err


# ------------------------------------------------- a real two-raylet cluster

_PROBE = '''"""Test-only ClientApp: the project's, noting the raylet of each message."""

import json
import os
from pathlib import Path

import ray
from flwr.clientapp import ClientApp

from tpsl_flwr.simulations.client_app import app as project_app

_RAYLET = {}


def _raylet():
    if not _RAYLET:
        node = ray.get_runtime_context().get_node_id()
        for info in ray.nodes():
            if info["NodeID"] == node:
                names = [k for k in info["Resources"] if k.startswith("raylet_")]
                _RAYLET.update(node=node, raylet=",".join(sorted(names)))
    return _RAYLET


class PlacementProbe(ClientApp):
    def __call__(self, message, context):
        line = {
            **_raylet(),
            "partition": int(context.node_config["partition-id"]),
            "pid": os.getpid(),
        }
        record = Path(str(context.run_config["out-dir"])) / "placement.jsonl"
        with record.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\\n")
        return project_app(message, context)


app = PlacementProbe()
'''


def _probe_app(folder: Path) -> Path:
    """This project's Flower app with :data:`_PROBE` as its ClientApp."""
    folder.mkdir()
    pyproject = (APP_DIR / "pyproject.toml").read_text(encoding="utf-8")
    component = 'clientapp = "tpsl_flwr.simulations.client_app:app"'
    assert component in pyproject
    probe = 'clientapp = "ray_placement_probe:app"'
    (folder / "pyproject.toml").write_text(pyproject.replace(component, probe))
    (folder / "ray_placement_probe.py").write_text(_PROBE)
    return folder


class LocalRayCluster:
    """Raylets started with ``ray start`` on this host, ended by PID.

    Every process carries a launch marker (``TPSL_FLWR_LAUNCH_ID``) and is
    ended with :func:`~tpsl_flwr.engines.processes.terminate_launched`; the
    cluster has its own temp folder (its ``ray_current_cluster`` record stays
    there, so no other ``ray.init()`` on the host joins it) and its own ports.
    """

    def __init__(self) -> None:
        self.marker = f"ray-cluster-{uuid.uuid4().hex}"
        # Short: Ray's Unix socket paths live under it (108-byte limit).
        self.temp_dir = Path(tempfile.mkdtemp(prefix="tpsl-ray-"))
        self.address = ""
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")
        }
        self.env.update({LAUNCH_ID_ENV: self.marker, "RAY_USAGE_STATS_ENABLED": "0"})

    def _ray_start(self, args: list[str], resources: dict[str, float]) -> None:
        ports = free_ports(6)
        command = [
            str(Path(sys.executable).parent / "ray"),
            "start",
            *args,
            "--num-cpus=1",
            f"--resources={json.dumps(resources)}",
            f"--temp-dir={self.temp_dir}",
            "--node-ip-address=127.0.0.1",  # the test's cluster stays on loopback
            f"--node-manager-port={ports[0]}",
            f"--object-manager-port={ports[1]}",
            f"--metrics-export-port={ports[2]}",
            f"--dashboard-agent-listen-port={ports[3]}",
            f"--dashboard-agent-grpc-port={ports[4]}",
            f"--runtime-env-agent-port={ports[5]}",
            f"--object-store-memory={100 * 1024**2}",
            "--disable-usage-stats",
        ]
        done = subprocess.run(
            command, env=self.env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]

    def start_head(self, resources: dict[str, float]) -> None:
        """``ray start --head`` on free ports; ``address`` is its GCS."""
        gcs, client, dashboard = free_ports(3)
        self._ray_start(
            [
                "--head",
                f"--port={gcs}",
                f"--ray-client-server-port={client}",
                f"--dashboard-port={dashboard}",
                "--include-dashboard=false",
            ],
            resources,
        )
        self.address = (self.temp_dir / "ray_current_cluster").read_text().strip()

    def add_raylet(self, resources: dict[str, float]) -> None:
        """``ray start --address`` of another raylet on this host."""
        self._ray_start([f"--address={self.address}"], resources)

    def stop(self) -> None:
        """End every process of the cluster by PID, then its temp folder."""
        try:
            terminate_launched(self.marker, grace_s=2.0)
            assert find_launched_processes(self.marker) == []
        finally:
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def _placements(out_dir: Path) -> list[dict[str, Any]]:
    lines = (out_dir / "placement.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_raylet_cluster_spreads_node_actors_same_auc(tmp_path, monkeypatch):
    # Prepare: breast-cancer (~410 training rows), 2 nodes, 1 epoch of 4 steps,
    # Laplace eps 1 with a seeded key; every setting explicit for both runs.
    cfg = ExperimentConfig(
        dataset="breast-cancer",
        epochs=1,
        batch_size=128,
        steps_per_message=4,
        num_parties=2,
        checkpoint=False,
        audit=False,
        noise_seed=0,
        out_dir=str(tmp_path / "one-raylet"),
    )
    shared = {k: v for k, v in cfg.to_run_config().items() if k != "out-dir"}
    (tmp_path / "run.toml").write_text(tomli_w.dumps(shared))
    app = _probe_app(tmp_path / "app")
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))  # no config.toml
    cluster = LocalRayCluster()
    marks = [time.perf_counter()]
    try:
        cluster.start_head({"raylet_a": 1})
        marks.append(time.perf_counter())
        monkeypatch.setenv("RAY_ADDRESS", cluster.address)

        # Execute: one raylet, through `simulate --engine ray`'s path
        one = run_experiment(cfg, "ray", echo=None, timeout=240)
        marks.append(time.perf_counter())
        # ... then two raylets, through `tpsl-flwr flower-run` with the probe
        cluster.add_raylet({"raylet_b": 1})
        marks.append(time.perf_counter())
        two_dir = tmp_path / "two-raylets"
        status = main(
            [
                "flower-run",
                str(app),
                "--noise-seed=0",
                "--timeout=240",
                "--run-config",
                str(tmp_path / "run.toml"),
                f"out-dir='{two_dir}'",
            ]
        )
        assert status == 0
        two = json.loads((two_dir / RESULTS_FILE).read_text(encoding="utf-8"))
        marks.append(time.perf_counter())
    finally:
        cluster.stop()
    marks.append(time.perf_counter())

    print(  # the measured numbers, for the docs (pytest -s)
        f"one raylet: test_auc {one['test_auc']:.6f}, "
        f"flwr run {one['flower_wall_seconds']:.1f} s; two raylets: test_auc "
        f"{two['test_auc']:.6f}, flwr run {two['flower_wall_seconds']:.1f} s; "
        "seconds per phase (head, run 1, raylet, run 2, stop): "
        + " ".join(f"{b - a:.1f}" for a, b in itertools.pairwise(marks))
    )
    # Assert: both runs joined the cluster
    assert one["ray_address"] == two["ray_address"] == cluster.address
    # Node actors ran on both raylets, each raylet serving messages, and every
    # partition's messages were handled
    placed = _placements(two_dir)
    assert {p["raylet"] for p in placed} == {"raylet_a", "raylet_b"}
    assert {p["partition"] for p in placed} == {0, 1}
    assert len({p["node"] for p in placed}) == 2
    # The same model as on one raylet (same seeded key, same data, one torch
    # thread per actor): actor placement changes nothing but where it ran
    assert two["test_auc"] == pytest.approx(one["test_auc"], abs=1e-9)
    assert two["history"][0]["samples"] == one["history"][0]["samples"]
