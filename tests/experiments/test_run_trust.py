"""Runs a user can trust: this run's progress, one folder per run, one-line errors.

No test here starts Flower: ``flwr run`` is replaced by a stand-in that writes
what the real one writes (its log, the ServerApp's results or ``FAILED``).
"""

from __future__ import annotations

import io
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tpsl_flwr.cli.flower_run import parse_overrides
from tpsl_flwr.cli.main import main
from tpsl_flwr.engines.flwr_cli import CompletedRun
from tpsl_flwr.engines.inprocess import InProcessGrid
from tpsl_flwr.engines.processes import FlowerLaunchError
from tpsl_flwr.errors import ConfigError, ProtocolError
from tpsl_flwr.experiments import ray_run as flower_run
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.ray_run import RUN_LOG, _follow, run_on_ray
from tpsl_flwr.experiments.run import run_experiment
from tpsl_flwr.experiments.run_folder import (
    FAILED_FILE,
    one_line_error,
    prepare_run_folder,
    write_atomic,
)
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.release.store import LabelStore
from tpsl_flwr.simulations import server_app

APP_DIR = Path(__file__).parents[2]
OLD = "\x1b[92mINFO \x1b[0m:      epoch 1/9  OLD RUN LINE"
NEW = "\x1b[92mINFO \x1b[0m:      epoch 1/2  this run"
# What `flwr run --stream` writes when a node raises on Ray (shortened).
RAY_REASON = (
    "node 1349 (partition 2) replied with an error: <class 'ray.exceptions."
    "RayTaskError(ClientAppException)'>:<'\x1b[36mray::ClientAppActor.run()\x1b[39m "
    "(pid=18336, ip=192.0.2.2)\n"
    "FileNotFoundError: [Errno 2] No such file or directory: '/data/party-2'\n\n"
    "During handling of the above exception, another exception occurred:\n\n"
    "Traceback (most recent call last):\n"
    '  File "recorder.py", line 123, in save\n'
    "flwr.clientapp.client_app.ClientAppException: \n"
    "Exception ClientAppException occurred. Message: [Errno 2] No such file'>"
)
FAILED_LOG = [
    NEW,
    "\x1b[91mERROR \x1b[0m:     An exception was raised when processing a message",
    "Traceback (most recent call last):",
    '  File "ray_actor.py", line 59, in run',
    "(ClientAppActor pid=13415) WARNING :   Manually terminating ClientAppActor",
    "FileNotFoundError: [Errno 2] No such file or directory: '/data/party-2'",
]
TINY = {"dataset": "breast-cancer", "epochs": 1, "noise_seed": 0}
TINY_FLAGS = ["--dataset", "breast-cancer", "--epochs", "1", "--noise-seed", "0"]


def _fake_flwr_run(
    lines: list[str], *, ok: bool, failed: str | None = None, delay: float = 0.6
) -> Any:
    """A stand-in for ``run_flwr_simulation``: writes the log as ``flwr run`` does.

    It waits ``delay`` s first, so that a follower that opened the previous
    run's log would have printed it by then.
    """

    def fake(app, num_supernodes, overrides, *, log_dir, **_: Any) -> CompletedRun:
        time.sleep(delay)
        log = Path(log_dir) / RUN_LOG
        with log.open("w", encoding="utf-8") as handle:  # truncates, as before
            for line in lines:
                handle.write(line + "\n")
                handle.flush()
                time.sleep(0.05)
        out = Path(overrides["out-dir"])
        if ok:
            results = {"engine": "ray", "seconds": 1.0, "config": dict(overrides)}
            (out / "results.json").write_text(json.dumps(results))
        if failed is not None:
            (out / FAILED_FILE).write_text(failed + "\n")  # as the ServerApp does
        status = "finished:completed" if ok else "finished:failed"
        details = "" if ok else f"Simulation failed with exception: {RAY_REASON}"
        return CompletedRun(7, status, details, 0, "\n".join(lines), 2.5, log, "id")

    return fake


# ---------------------------------------------------------------- 1. progress
def test_flower_run_shows_only_this_runs_progress_never_the_last_runs(
    tmp_path, monkeypatch
):
    # Prepare: the previous run's log is still in out-dir.
    out, scratch = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    scratch.mkdir()
    (out / RUN_LOG).write_text(OLD + "\n" * 3)
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setattr(
        flower_run, "run_flwr_simulation", _fake_flwr_run([NEW], ok=True)
    )
    echo = io.StringIO()
    # Execute
    results = run_on_ray({"out-dir": str(out)}, app_dir=APP_DIR, echo=echo)
    # Assert
    assert "OLD RUN LINE" not in echo.getvalue()
    assert "this run" in echo.getvalue()
    assert results["flower_wall_seconds"] == 2.5 and results["engine"] == "ray"
    assert list(scratch.iterdir()) == []  # FLWR_HOME removed


def test_the_follower_reads_a_replaced_log_from_its_start(tmp_path):
    # Prepare
    path, stop, out = tmp_path / RUN_LOG, threading.Event(), io.StringIO()
    path.write_text("INFO : first file\n")
    follower = threading.Thread(target=_follow, args=(path, stop, out))
    follower.start()
    time.sleep(0.5)
    # Execute: the file is replaced by a new one (another inode)
    path.unlink()
    path.write_text("INFO : second file\n")
    time.sleep(0.5)
    stop.set()
    follower.join(5)
    # Assert
    assert out.getvalue() == "INFO : first file\nINFO : second file\n"


# ----------------------------------------------------------- 2. run folders
def test_simulate_refuses_an_out_dir_holding_a_run_and_overwrite_replaces_it(
    tmp_path, capsys
):
    # Prepare: a finished run
    argv = ["simulate", *TINY_FLAGS, "--out-dir", str(tmp_path)]
    assert main(argv) == 0
    first = (tmp_path / "results.json").read_text()
    capsys.readouterr()
    # Execute: the same out-dir again
    refused = main(argv)
    err = capsys.readouterr().err
    # Assert: one line, nothing touched
    assert refused == 2 and err.count("\n") == 1
    assert f"out-dir {tmp_path} already holds a run (" in err
    assert "--overwrite" in err and "--resume" in err
    assert (tmp_path / "results.json").read_text() == first
    # Execute: --overwrite, over a stale FAILED marker
    (tmp_path / FAILED_FILE).write_text("old failure\n")
    assert main([*argv, "--overwrite"]) == 0
    out = capsys.readouterr().out
    # Assert: a fresh run, its summary names the results
    assert not (tmp_path / FAILED_FILE).exists()
    assert json.loads((tmp_path / "results.json").read_text())["engine"] == "local"
    assert out.splitlines()[-1].startswith("tpsl-flwr simulate: test_auc ")
    assert f"results in {tmp_path / 'results.json'}" in out.splitlines()[-1]
    assert "training " in out and "s (label party)" in out
    assert not list(tmp_path.glob(".*tmp*"))  # atomic writes leave no temp file


def test_a_key_left_for_the_next_run_does_not_count_as_a_run(tmp_path):
    # Prepare: `tpsl-flwr keygen out/label-party --seed 4`
    LabelStore(tmp_path / "label-party").provide_key(NoiseKey.from_seed(4), "seed")
    # Execute / Assert: nothing to refuse, nothing removed even with overwrite
    prepare_run_folder(tmp_path)
    prepare_run_folder(tmp_path, overwrite=True)
    assert (tmp_path / "label-party" / "noise-key.json").exists()


def test_overwrite_removes_what_a_run_wrote_and_nothing_else(tmp_path):
    # Prepare
    for name in ("results.json", "report.md", FAILED_FILE, "flwr-run.log"):
        (tmp_path / name).write_text("old")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "label-party").mkdir()
    (tmp_path / "label-party" / "checkpoint.pt").write_text("old")
    (tmp_path / "transcript").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    # Execute
    prepare_run_folder(tmp_path, overwrite=True, extra=[tmp_path / "transcript"])
    # Assert
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_resume_keeps_the_folder_and_retires_the_last_results(tmp_path):
    # Prepare
    (tmp_path / "results.json").write_text("{}")
    (tmp_path / "checkpoints").mkdir()
    # Execute
    prepare_run_folder(tmp_path, resume=True)
    # Assert: never shown as the resumed run's own
    assert not (tmp_path / "results.json").exists()
    assert (tmp_path / "results.previous.json").read_text() == "{}"
    assert (tmp_path / "checkpoints").is_dir()
    with pytest.raises(ConfigError, match="exclude each other"):
        prepare_run_folder(tmp_path, resume=True, overwrite=True)


def test_a_failed_run_leaves_failed_and_no_earlier_results(tmp_path, monkeypatch):
    # Prepare: an earlier run's results, and a run whose node fails
    (tmp_path / "results.json").write_text('{"test_auc": 0.99}')

    def failing(cfg, timeout):
        raise ProtocolError(
            "node 5 (partition 1) replied with an error: "
            "<class 'OSError'>:<'disk full'>"
        )

    monkeypatch.setattr("tpsl_flwr.experiments.run.run_inprocess_experiment", failing)
    # Execute
    with pytest.raises(ProtocolError):
        run_experiment(ExperimentConfig(out_dir=str(tmp_path)), overwrite=True)
    # Assert
    assert not (tmp_path / "results.json").exists()
    assert (tmp_path / FAILED_FILE).read_text() == (
        "node 5 (partition 1) replied with an error: OSError: disk full\n"
    )


def test_write_atomic_replaces_the_whole_file(tmp_path):
    path = write_atomic(tmp_path / "results.json", "new")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == [
        "results.json"
    ]


def test_flower_run_refuses_a_used_out_dir_before_anything_starts(
    tmp_path, monkeypatch, capsys
):
    # Prepare
    (tmp_path / "results.json").write_text("{}")
    monkeypatch.setattr(flower_run, "run_on_ray", pytest.fail)
    # Execute
    code = main(["flower-run", str(APP_DIR), "--run-config", f'out-dir="{tmp_path}"'])
    # Assert
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "already holds a run (results.json)" in err
    assert "--overwrite" in err and "--run-config resume=true" in err


# -------------------------------------------------------- 3. one-line errors
def test_a_node_error_inside_flower_reaches_the_user_as_one_line(
    tmp_path, monkeypatch, capsys
):
    # Prepare: the ServerApp's FAILED line, the log full of tracebacks
    failed = "node 1349 (partition 2) replied with an error: FileNotFoundError: x"
    fake = _fake_flwr_run(FAILED_LOG, ok=False, failed=failed, delay=0.0)
    monkeypatch.setattr(flower_run, "run_flwr_simulation", fake)
    # Execute
    code = main(["flower-run", str(APP_DIR), "--run-config", f'out-dir="{tmp_path}"'])
    # Assert
    out, err = capsys.readouterr()
    assert code == 1
    assert err == (
        f"tpsl-flwr flower-run: error: {failed} (details: {tmp_path / RUN_LOG})\n"
    )
    assert "Traceback" not in out and "ERROR" not in out and "ClientApp" not in out
    assert "this run" in out  # progress lines still shown
    assert (tmp_path / FAILED_FILE).read_text().strip() == failed


def test_without_a_failed_marker_flowers_status_is_cut_to_its_cause(
    tmp_path, monkeypatch
):
    fake = _fake_flwr_run(FAILED_LOG, ok=False, delay=0.0)
    monkeypatch.setattr(flower_run, "run_flwr_simulation", fake)
    with pytest.raises(FlowerLaunchError) as raised:
        run_on_ray({"out-dir": str(tmp_path)}, app_dir=APP_DIR, echo=None)
    assert str(raised.value) == (
        "node 1349 (partition 2) replied with an error: FileNotFoundError: [Errno 2] "
        f"No such file or directory: '/data/party-2' (details: {tmp_path / RUN_LOG})"
    )
    assert (tmp_path / FAILED_FILE).read_text().count("\n") == 1


def test_one_line_error_keeps_the_root_cause_of_a_ray_traceback():
    assert one_line_error(RAY_REASON) == (
        "node 1349 (partition 2) replied with an error: FileNotFoundError: "
        "[Errno 2] No such file or directory: '/data/party-2'"
    )


def test_the_server_app_names_the_failing_node_in_failed(tmp_path):
    # Prepare: the app's ClientApp, but partition 1 fails in training
    from tpsl_flwr.simulations.client_app import app as client_app

    def flaky(message, context):
        if message.metadata.message_type == "train" and (
            context.node_config["partition-id"] == 1
        ):
            raise OSError("disk full")
        return client_app(message, context)

    cfg = ExperimentConfig(**TINY, out_dir=str(tmp_path))
    grid = InProcessGrid(flaky, 2, run_config=cfg.to_run_config())
    # Execute
    with pytest.raises(ProtocolError):
        grid.run_server(server_app.app)
    # Assert
    failed = (tmp_path / FAILED_FILE).read_text()
    assert failed.count("\n") == 1 and "(partition 1)" in failed
    assert failed.endswith("replied with an error: OSError: disk full\n")
    assert not (tmp_path / "results.json").exists()


# --------------------------------------------------------- 4. --run-config
def test_repeated_run_config_flags_merge_in_order(tmp_path, monkeypatch):
    # Prepare
    seen: dict[str, Any] = {}

    def fake(overrides, **_: Any):
        seen.update(overrides)
        raise FlowerLaunchError("stop here")

    monkeypatch.setattr(flower_run, "run_on_ray", fake)
    # Execute
    main(
        [
            "flower-run",
            str(APP_DIR),
            "--run-config",
            "epochs=3",
            f'out-dir="{tmp_path}"',
            "--run-config",
            'mechanism="discrete" epochs=4',
        ]
    )
    # Assert
    assert seen["epochs"] == 4 and seen["mechanism"] == "discrete"
    assert seen["out-dir"] == str(tmp_path)


def test_the_merged_run_config_is_validated_before_anything_starts(monkeypatch, capsys):
    monkeypatch.setattr(flower_run, "run_on_ray", pytest.fail)
    argv = ["flower-run", str(APP_DIR), "--run-config", "epsilon=2"]
    assert main([*argv, "--run-config", "epsilon=-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "epsilon must be > 0" in err


def test_parse_overrides_reads_a_toml_file_and_later_values_win(tmp_path):
    conf = tmp_path / "x.toml"
    conf.write_text('epochs = 5\nmechanism = "gaussian"\n')
    assert parse_overrides([str(conf), "epochs=6"]) == {
        "epochs": 6,
        "mechanism": "gaussian",
    }


# ---------------------------------------------------------------- 5. names
def test_each_flower_runtime_has_one_engine_name():
    from flwr.superlink.grid import HttpGrid, InMemoryGrid

    assert server_app.engine_of(object.__new__(InMemoryGrid)) == "ray"
    assert server_app.engine_of(object.__new__(HttpGrid)) == "deployment"
    assert server_app.engine_of(InProcessGrid(lambda m, c: m, 1)) == "local"


def test_results_and_report_say_the_same_engine(tmp_path):
    results = run_experiment(ExperimentConfig(**TINY, out_dir=str(tmp_path)))
    assert results["engine"] == "local"
    assert "- engine: local;" in (tmp_path / "report.md").read_text()


def test_not_a_flower_app_folder_is_one_line_naming_it(tmp_path, capsys):
    assert main(["flower-run", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{tmp_path} is not a Flower app folder" in err
    assert "pyproject.toml with a [tool.flwr.app] table" in err


# ------------------------------------------------------------ 6. leftovers
def test_a_failed_load_leaves_no_cache_folder_beside_the_file(tmp_path):
    from tpsl_flwr.data import load_criteo

    # Prepare: a file with no click at all
    path = tmp_path / "train.txt"
    path.write_text("0\t1" + "\t" * 38 + "\n" + "0\t2" + "\t" * 38 + "\n")
    # Execute
    with pytest.raises(ConfigError, match="no positive labels"):
        load_criteo(path, hash_buckets=8)
    # Assert
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.txt"]


def test_a_failed_uncached_load_removes_its_scratch_folder(tmp_path, monkeypatch):
    from tpsl_flwr.data import load_criteo

    # Prepare: scratch folders go to a folder of ours
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    path = tmp_path / "train.txt"
    path.write_text("0\t1" + "\t" * 38 + "\n")
    # Execute
    with pytest.raises(ConfigError):
        load_criteo(path, hash_buckets=8, cache=False)
    # Assert
    assert list(scratch.iterdir()) == []


def test_a_failed_generator_leaves_no_half_written_file(tmp_path, monkeypatch):
    from tpsl_flwr.testing import ctr_generator, write_criteo

    def broken(fields, sep):
        raise OSError("disk full")

    monkeypatch.setattr(ctr_generator, "join_rows", broken)
    with pytest.raises(OSError, match="disk full"):
        write_criteo(tmp_path / "train.txt", 100, seed=1)
    assert list(tmp_path.iterdir()) == []
