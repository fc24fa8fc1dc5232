"""The run-folder rules as one call for any ServerApp; steps per epoch; a resume
with nothing left to do says so.

Issue rows: the run-folder rules, one-line errors and ``FAILED`` marker were
the project CLI's only; ``resume = true`` with nothing left to do finished
silently; ``history["steps"]`` was cumulative, not per epoch.
"""

from __future__ import annotations

import json
import logging
import math
import stat

import numpy as np
import pytest

from tpsl_flwr.engines.inprocess_run import run_inprocess
from tpsl_flwr.errors import ProtocolError, ResumeRefused
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run_folder import FAILED_FILE, read_failure
from tpsl_flwr.simulations import client_app, run_in_folder, server_app

RAY_ERROR = (
    "node 1349 (partition 2) replied with an error: <class 'ray.exceptions."
    "RayTaskError(ClientAppException)'>:<'ray::ClientAppActor.run()\n"
    "Traceback (most recent call last):\n"
    "FileNotFoundError: [Errno 2] No such file or directory: 'party-3.csv'\n'>"
)


def test_a_finished_run_writes_its_results_atomically_and_privately(tmp_path):
    # Prepare: an earlier run's results and a stale FAILED marker
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text('{"old": true}')
    (out / FAILED_FILE).write_text("an old failure\n")
    # Execute: the embedder's one line
    returned = run_in_folder(out, lambda: {"acc": np.float32(0.5), "ids": np.arange(2)})
    # Assert
    assert returned is not None and set(returned) == {"acc", "ids"}
    assert json.loads((out / "results.json").read_text()) == {"acc": 0.5, "ids": [0, 1]}
    assert json.loads((out / "results.previous.json").read_text()) == {"old": True}
    assert not (out / FAILED_FILE).exists()
    assert stat.S_IMODE((out / "results.json").stat().st_mode) == 0o600
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert [p.name for p in out.iterdir() if p.name.endswith(".tmp")] == []


def test_a_failed_run_leaves_failed_with_the_root_cause_in_one_line(tmp_path, caplog):
    # Prepare: a run whose node failed on Ray, and an earlier run's results
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text("{}")

    def fails() -> dict:
        raise ProtocolError(RAY_ERROR)

    # Execute
    with caplog.at_level(logging.ERROR), pytest.raises(ProtocolError):
        run_in_folder(out, fails)
    # Assert: FAILED names node and partition, then the cause; no results
    line = (
        "node 1349 (partition 2) replied with an error: FileNotFoundError: "
        "[Errno 2] No such file or directory: 'party-3.csv'"
    )
    assert read_failure(out) == line
    assert (out / FAILED_FILE).read_text().count("\n") == 1
    assert not (out / "results.json").exists()
    assert (out / "results.previous.json").exists()
    assert f"run failed: {line}" in caplog.text


def test_a_refused_resume_leaves_the_folder_as_it_was(tmp_path, caplog):
    # Prepare: a finished run's results (a ServerApp of `flwr run` that
    # resumes it at other settings than its checkpoints)
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text('{"epochs": 2}')

    def refused() -> dict:
        raise ResumeRefused("cannot resume: the stopped run trained with lr = 0.01")

    # Execute
    with caplog.at_level(logging.ERROR), pytest.raises(ResumeRefused):
        run_in_folder(out, refused)
    # Assert: no FAILED marker, the results where they were
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]
    assert json.loads((out / "results.json").read_text()) == {"epochs": 2}
    assert "run refused, nothing sent or written: cannot resume" in caplog.text


def test_a_resumed_rehearsal_without_dp_is_not_refused_by_the_preflight(tmp_path):
    # Prepare: a data file (labels not public) and max-norm, which states no
    # DP guarantee: a rehearsal (every node the CLI's own) is recorded, never
    # refused, and so is its resume; the preflight must decide as the run.
    from tpsl_flwr.experiments.run import run_experiment
    from tpsl_flwr.testing import write_criteo

    path = write_criteo(tmp_path / "data" / "train.txt", 600, seed=1).path
    common = dict(
        dataset="criteo",
        data_path=str(path),
        mechanism="max-norm",
        lr=1e-3,
        lr_schedule="constant",
        checkpoint=True,
        out_dir=str(tmp_path / "run"),
    )
    run_experiment(ExperimentConfig(epochs=1, **common), "local")
    # Execute
    results = run_experiment(ExperimentConfig(epochs=2, resume=True, **common), "local")
    # Assert
    assert [h["epoch"] for h in results["history"]] == [1, 2]
    assert results["run_kind"] == "rehearsal"


def test_a_run_that_writes_its_own_results_gets_the_rest_of_the_rules(tmp_path):
    out = tmp_path / "run"
    assert run_in_folder(out, lambda: None) is None
    assert sorted(p.name for p in out.iterdir()) == []
    run_in_folder(out, lambda: {"a": 1}, results_file=None)
    assert not (out / "results.json").exists()


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory):
    """The project's ServerApp, in process: 2 epochs, then a resume of them."""
    out = tmp_path_factory.mktemp("resume") / "run"
    cfg = ExperimentConfig(
        dataset="breast-cancer",
        epochs=2,
        batch_size=64,
        checkpoint=True,
        out_dir=str(out),
    )
    run_inprocess(server_app.app, client_app.app, 2, run_config=cfg.to_run_config())
    first = json.loads((out / "results.json").read_text())
    return cfg, out, first


def test_history_records_steps_per_epoch_and_cumulative(two_epochs):
    # Prepare
    _, _, first = two_epochs
    trained = first["train_rows"] - first["validation_rows"]  # the held-out aside
    per_epoch = math.ceil(trained / 64)
    # Assert
    history = first["history"]
    assert [h["steps"] for h in history] == [per_epoch, per_epoch]
    assert [h["steps_cumulative"] for h in history] == [per_epoch, 2 * per_epoch]
    assert first["epochs_trained"] == 2 and first["note"] is None


def test_a_resume_with_nothing_left_to_do_says_so(two_epochs, caplog):
    # Prepare: the same run, resumed with every epoch already done
    cfg, out, first = two_epochs
    resumed = ExperimentConfig(**{**cfg.__dict__, "resume": True})
    # Execute
    with caplog.at_level(logging.INFO):
        run_inprocess(
            server_app.app, client_app.app, 2, run_config=resumed.to_run_config()
        )
    # Assert: a log line and the result say it; no epoch was trained again
    results = json.loads((out / "results.json").read_text())
    assert results["epochs_trained"] == 0
    assert results["note"].startswith("nothing left to do: the resumed run had ")
    assert "nothing left to do" in caplog.text
    assert results["history"] == first["history"]
    assert (out / "results.previous.json").exists()
