"""The ``deployment`` engine: ``run_experiment(cfg, "deployment")`` and ``simulate``.

The wiring (engine name, ``--secure``, the seeded key, the run config the
nodes receive, the results) runs with :class:`DeploymentRuntime` replaced by
a stand-in that starts no process. A real local deployment of the TPSL app,
checked against the in-process engine on the same seeded config, is
``tests/engines/test_engines.py::test_deployment_runtime_runs_tpsl_app`` (``slow``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tpsl_flwr.cli.main import main
from tpsl_flwr.engines.deployment import runtime as deployment
from tpsl_flwr.engines.flwr_cli import CompletedRun
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.ray_run import source_app_dir
from tpsl_flwr.experiments.run import (
    DEPLOYMENT_LOGS,
    check_engine,
    round_trip_seconds,
    run_experiment,
)
from tpsl_flwr.release.store import LabelStore


def test_unknown_engine_lists_every_engine(tmp_path):
    # Arrange
    cfg = ExperimentConfig(dataset="breast-cancer", out_dir=str(tmp_path / "run"))

    # Act / Assert: refused before anything is prepared or started
    with pytest.raises(ConfigError, match=r"valid engines: local, ray, deployment$"):
        check_engine("gpu")
    with pytest.raises(ConfigError, match="unknown engine 'gpu'"):
        run_experiment(cfg, "gpu")
    assert not (tmp_path / "run").exists()


def test_round_trip_seconds_is_the_mean_per_round_trip_of_an_epoch():
    # Arrange: 456 rows, batch 128 -> 4 batches; 4 steps/message -> 1 train
    # round trip + 1 test query per epoch; epochs of 10 s and 30 s
    results = {
        "train_rows": 456,
        "config": {"batch-size": 128, "steps-per-message": 4},
        "history": [
            {"samples": 456, "samples_per_second": 45.6},
            {"samples": 456, "samples_per_second": 15.2},
        ],
    }

    # Act / Assert: the median over epochs of 5 s and 15 s
    assert round_trip_seconds(results) == pytest.approx(10.0)


class _StandInRuntime:
    """Records what the deployment engine asks; writes the ServerApp's results."""

    instances: list[_StandInRuntime] = []

    def __init__(self, num_supernodes: int, log_dir: Path, **options: Any) -> None:
        self.num_supernodes = num_supernodes
        self.log_dir = Path(log_dir)
        self.options = options
        self.runs: list[tuple[Path, dict[str, Any], float]] = []
        self.key_before_run = False
        self.rehearsal_marked = False
        self.launch_id = "stand-in"
        self.started = self.stopped = False
        _StandInRuntime.instances.append(self)

    def __enter__(self) -> _StandInRuntime:
        self.started = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped = True

    def run(
        self,
        app_dir: Path,
        run_config: Mapping[str, Any] | None = None,
        *,
        timeout: float = 600.0,
        check: bool = True,
    ) -> CompletedRun:
        config = dict(run_config or {})
        self.runs.append((Path(app_dir), config, timeout))
        cfg = ExperimentConfig.from_run_config(config)
        store = LabelStore(cfg.label_party_dir)
        self.key_before_run = store.key_path.exists()
        # The engine marked this launch's run a rehearsal, for its ServerApp.
        self.rehearsal_marked = (store.folder / "rehearsal.json").exists()
        out = Path(config["out-dir"])
        results = {
            "engine": "deployment",
            "test_auc": 0.9,
            "epsilon_spent": 1.0,
            "samples_per_second": 45.6,
            "seconds": 12.0,
            "train_rows": 456,
            "config": config,
            "history": [{"epoch": 1, "samples": 456, "samples_per_second": 45.6}],
        }
        (out / "results.json").write_text(json.dumps(results))
        return CompletedRun(
            run_id=1,
            status="finished:completed",
            status_details="",
            returncode=0,
            output="INFO :      epoch 1/1  46 samples/s\n",
            wall_s=15.0,
            log_path=self.log_dir / "flwr-run-1.log",
            launch_id="stand-in",
        )


def test_simulate_engine_deployment_secure_wiring(tmp_path, monkeypatch, capsys):
    # Arrange: no process is started
    _StandInRuntime.instances.clear()
    monkeypatch.setattr(deployment, "DeploymentRuntime", _StandInRuntime)
    out = tmp_path / "run"
    argv = ["simulate", "--engine", "deployment", "--secure"]
    argv += ["--dataset", "breast-cancer", "--epochs", "1", "--batch-size", "128"]
    argv += ["--steps-per-message", "4", "--noise-seed", "7", "--out-dir", str(out)]

    # Act
    status = main(argv)

    # Assert: one runtime of num-parties SuperNodes, secure, logs under out-dir
    assert status == 0
    (runtime,) = _StandInRuntime.instances
    assert runtime.num_supernodes == 2
    assert runtime.log_dir == out.resolve() / DEPLOYMENT_LOGS
    assert runtime.options["secure"] is True
    assert runtime.options["executor"] is True  # the default: a warm executor
    assert runtime.started and runtime.stopped
    # this project's app, the config's run config (absolute out-dir), no seed
    ((app_dir, run_config, _),) = runtime.runs
    assert app_dir == source_app_dir()
    expected = ExperimentConfig(
        dataset="breast-cancer",
        epochs=1,
        batch_size=128,
        steps_per_message=4,
        audit=True,  # simulate's default
        out_dir=str(out.resolve()),
    ).to_run_config()
    assert run_config == expected
    assert not any("seed" in key and key != "seed" for key in run_config)
    # the seeded key was in the label party's folder before the run
    assert runtime.key_before_run
    assert runtime.rehearsal_marked  # taken by the run's ServerApp, else removed
    assert not (tmp_path / "run" / "label-party" / "rehearsal.json").exists()
    # results: engine and round trip (1 train round trip + 1 test query)
    results = json.loads((out / "results.json").read_text())
    assert results["engine"] == "deployment"
    assert results["round_trip_seconds"] == pytest.approx(456 / 45.6 / 2)
    assert results["flower_wall_seconds"] == 15.0
    assert "5.00 s per round trip" in capsys.readouterr().out


def test_simulate_without_secure_runs_plaintext(tmp_path, monkeypatch):
    # Arrange
    _StandInRuntime.instances.clear()
    monkeypatch.setattr(deployment, "DeploymentRuntime", _StandInRuntime)
    argv = ["simulate", "--engine", "deployment", "--dataset", "breast-cancer"]
    argv += ["--epochs", "1", "--out-dir", str(tmp_path / "run")]

    # Act / Assert
    assert main(argv) == 0
    assert _StandInRuntime.instances[0].options["secure"] is False


def test_no_executor_keeps_the_process_per_message_path(tmp_path, monkeypatch):
    # Arrange
    _StandInRuntime.instances.clear()
    monkeypatch.setattr(deployment, "DeploymentRuntime", _StandInRuntime)
    argv = ["simulate", "--engine", "deployment", "--dataset", "breast-cancer"]
    argv += ["--epochs", "1", "--out-dir", str(tmp_path / "run"), "--no-executor"]

    # Act
    assert main(argv) == 0

    # Assert: Flower's flwr-clientapp per message, nothing else beside it
    options = _StandInRuntime.instances[0].options
    assert options == {"secure": False, "executor": False}
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["executor"] is False


def test_the_executor_secret_is_private_and_gone_after_stop(tmp_path: Path) -> None:
    # Prepare: the secret as start() makes it, under a permissive umask
    import os
    import stat

    runtime = deployment.DeploymentRuntime(1, tmp_path / "logs")
    runtime.log_dir.mkdir(parents=True)
    old = os.umask(0)
    try:
        secret = runtime._executor_secret()
    finally:
        os.umask(old)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(secret.parent.stat().st_mode) == 0o700

    # Execute
    runtime.stop()

    # Assert: nothing left that a later reader of the logs could use
    assert not secret.exists()


def test_every_log_and_run_config_of_a_deployment_is_private_whatever_the_umask(
    tmp_path: Path,
) -> None:
    # Prepare: a permissive umask, and an earlier run's superlink.log that a
    # looser umask left readable by all.
    import os
    import stat
    import sys

    from tpsl_flwr.engines.deployment.faults import open_log as faults_open_log
    from tpsl_flwr.engines.flower_env import write_run_config
    from tpsl_flwr.engines.flwr_cli import _run_cli

    runtime = deployment.DeploymentRuntime(1, tmp_path / "logs")
    logs = runtime.log_dir
    logs.mkdir(parents=True)
    (logs / "superlink.log").write_text("an earlier run's metrics\n")
    os.chmod(logs / "superlink.log", 0o644)
    say = [sys.executable, "-c", "print('written')"]
    old = os.umask(0)
    try:
        # Execute: every file the runtime writes, the way it writes it: its
        # processes' logs, the `flwr run` log, the run config
        for name in ("superlink.log", "supernode-0.log", "executor-0.log"):
            runtime._popen(say, logs / name).wait(timeout=60)
        _run_cli(say, dict(os.environ), logs / "flwr-run-1.log", 60, "a run")
        write_run_config({"epochs": 1}, logs / "run-1-config.toml")
        with faults_open_log(logs / "supernode-0-restarted.log") as log:
            log.write("restarted\n")
    finally:
        os.umask(old)

    # Assert: 0600 each, the earlier log replaced (and tightened), none empty
    written = sorted(p.name for p in logs.iterdir())
    assert written == [
        "executor-0.log",
        "flwr-run-1.log",
        "run-1-config.toml",
        "superlink.log",
        "supernode-0-restarted.log",
        "supernode-0.log",
    ]
    for path in logs.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name
        assert path.read_text().strip(), path.name
    assert (logs / "superlink.log").read_text() == "written\n"
