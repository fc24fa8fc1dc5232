"""Which output may go to whom: the allow-listed public summary and file modes."""

import json
import os
import stat
from typing import Any

import pytest

from tpsl_flwr.experiments.audience import (
    PUBLIC_FIELDS,
    PUBLIC_MODE,
    PUBLIC_RUN_COLUMNS,
    PUBLIC_SUMMARY,
    allowed,
    is_seeded_key,
    private_folder,
    public_summary,
)
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run import run_experiment
from tpsl_flwr.experiments.run_folder import mark_failed, write_atomic
from tpsl_flwr.experiments.sweep.run import CSV_COLUMNS, write_csv, write_public_csv

SECRET = 0.123456789
"""A value only the clean-label statistics of :func:`_every_field` hold."""
CLEAN_LABEL_KEYS = {
    "positive_rate",
    "train_positive_rate",
    "test_positive_rate",
    "target_positive_rate",
    "intercept",
    "bayes_test_auc",
    "test_auc",
    "test_accuracy",
    "test_logloss",
    "history",
    "attack_auc",
    "norm",
    "cosine",
    "spectral",
    "sda",
    "sda_top1",
    "validation_loss",
    "best_epoch",
    "evaluation_labels",
    "label_set",
}


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def _keys(value):
    """Every dict key anywhere in ``value``."""
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def _every_field():
    """A results dict with every field a run writes, label statistics = SECRET."""
    epoch = {
        "epoch": 1,
        "samples": 455,
        "seconds": 0.5,
        "samples_per_second": 910.0,
        "test_auc": SECRET,
        "test_accuracy": SECRET,
        "test_logloss": SECRET,
        "validation_loss": SECRET,
        "attack_auc": {
            "norm": SECRET,
            "cosine": SECRET,
            "spectral": SECRET,
            "sda": SECRET,
            "sda_top1": SECRET,
            "auc_bound": 0.73,
            "standard_error": {"sda": SECRET},
            "ceiling_verdict": {"sda": "below the ceiling"},
        },
    }
    return {
        "engine": "local",
        "mechanism": "laplace",
        "epsilon": 1.0,
        "sigma": None,
        "placement": "logits",
        "epochs": 1,
        "epsilon_spent": 1.0,
        "epsilon_total": 3.0,
        "ledger": {
            "label_set": "fingerprint-of-the-labels",
            "epsilon_spent": 1.0,
            "total": {"releases": 2, "epsilon": 3.0, "epsilon_at_delta": None},
            "earlier_releases": 1,
            "public_labels": False,
            "acknowledged": True,
            "folder": "/somewhere/ledger",
        },
        "privacy": {"epsilon": 1.0, "delta": 1e-5, "releases": 1, "notes": []},
        "samples_per_second": 910.0,
        "seconds": 2.0,
        "num_parties": 2,
        "noise_key": {
            "secure": False,
            "origin": "seed",
            "fingerprint": "ab12cd34",
            "note": "seeded",
        },
        "config": {"dataset": "breast-cancer", "epochs": 1, "seed": 0},
        "history": [epoch],
        "best_epoch": 1,
        "validation_rows": 0,
        "dataset": "breast-cancer",
        "num_classes": 2,
        "train_rows": 456,
        "test_rows": 113,
        "data_info": {
            "rows": 569,
            "train_rows": 456,
            "test_rows": 113,
            "num_classes": 2,
            "num_numeric": 30,
            "num_categorical": 0,
            "seed": 0,
            "positive_rate": SECRET,
            "train_positive_rate": SECRET,
            "test_positive_rate": SECRET,
            "bayes_test_auc": SECRET,
            "target_positive_rate": SECRET,
            "intercept": SECRET,
            "cache_path": "/somewhere/cache",
        },
        "test_auc": SECRET,
        "test_accuracy": SECRET,
        "test_logloss": SECRET,
        "evaluation_labels": "/somewhere/evaluation-train-labels.npy",
        "flower_wall_seconds": 3.0,
        "round_trip_seconds": 0.01,
        "executor": False,
    }


def test_public_summary_holds_no_clean_label_statistic():
    # Execute
    summary = public_summary(_every_field())
    text = json.dumps(summary)

    # Assert
    assert not _keys(summary) & CLEAN_LABEL_KEYS
    assert str(SECRET) not in text
    assert "positive_rate" not in text and "validation_loss" not in text
    assert "/somewhere" not in text  # machine paths stay out too
    assert not {k for k in _keys(summary) if k.startswith("validation")} - {
        "validation_rows"
    }


def test_public_summary_keeps_what_may_be_shared():
    # Execute
    summary = public_summary(_every_field())

    # Assert
    assert summary["mechanism"] == "laplace" and summary["placement"] == "logits"
    assert summary["epsilon_spent"] == 1.0 and summary["epsilon_total"] == 3.0
    assert summary["ledger"]["total"]["releases"] == 2
    assert summary["noise_key"] == {
        "secure": False,
        "origin": "seed",
        "fingerprint": "ab12cd34",
        "note": "seeded",
    }
    assert summary["seeded_key"] is True and "seeded_key_note" in summary
    assert summary["data_info"]["rows"] == 569
    assert summary["num_classes"] == 2 and summary["train_rows"] == 456
    assert summary["config"] == {"dataset": "breast-cancer", "epochs": 1, "seed": 0}
    assert summary["samples_per_second"] == 910.0
    assert "results.json" in summary["label_party_only"]


def test_public_summary_keeps_only_the_last_part_of_machine_paths():
    results = {
        "config": {
            "dataset": "criteo",
            "data-path": "/home/alice/criteo/day_0.gz",
            "out-dir": "/home/alice/runs/a",
            "label-dir": "/home/alice/runs/a/label-party",
            "transcript-dir": "",
        }
    }
    config = public_summary(results)["config"]
    assert config == {
        "dataset": "criteo",
        "data-path": "day_0.gz",
        "out-dir": "a",
        "label-dir": "label-party",
        "transcript-dir": "",
    }
    assert "alice" not in json.dumps(public_summary(results))


def test_a_new_field_stays_private_until_allowed():
    # Prepare: fields no allow-list names, at the top and inside allowed blocks.
    results = {
        **_every_field(),
        "new_statistic": SECRET,
        "noise_key": {"origin": "os", "secure": True, "new": SECRET},
        "privacy": {"epsilon": 1.0, "new": SECRET},
        "data_info": {"rows": 10, "label_counts": [SECRET]},
    }

    # Execute
    summary = public_summary(results)

    # Assert
    assert str(SECRET) not in json.dumps(summary)
    assert "new_statistic" not in summary and "label_counts" not in json.dumps(summary)
    assert summary["seeded_key"] is False and "seeded_key_note" not in summary


def test_allow_list_drops_values_of_unexpected_shape():
    # A block that should be a dict but is a number is not published.
    assert allowed({"ledger": SECRET}, {"ledger": {"total": None}}) == {"ledger": None}
    assert set(PUBLIC_FIELDS) >= {"mechanism", "epsilon_spent", "noise_key"}
    assert not set(PUBLIC_FIELDS) & CLEAN_LABEL_KEYS


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ({"origin": "seed", "secure": False}, True),
        ({"origin": "os", "secure": True}, False),
        ({"origin": "seed"}, True),
        ({}, None),
    ],
)
def test_seeded_key_is_read_from_the_key(key, expected):
    assert is_seeded_key({"noise_key": key} if key else {}) is expected


def test_run_writes_private_results_and_a_public_summary(tmp_path):
    # Prepare
    out = tmp_path / "run"
    cfg = ExperimentConfig(
        dataset="breast-cancer",
        epochs=1,
        batch_size=256,
        noise_seed=0,
        checkpoint=False,
        out_dir=str(out),
    )

    # Execute
    results = run_experiment(cfg)

    # Assert: the label party's files are 0600 in a 0700 folder.
    assert _mode(out) == 0o700
    for name in ("results.json", "report.md", "report.png"):
        assert _mode(out / name) == 0o600, name
    assert _mode(out / PUBLIC_SUMMARY) == PUBLIC_MODE
    # The summary says where the key came from, and no label statistic.
    summary = json.loads((out / PUBLIC_SUMMARY).read_text())
    assert summary["noise_key"]["origin"] == "seed" and summary["seeded_key"] is True
    assert summary["noise_key"]["fingerprint"] == results["noise_key"]["fingerprint"]
    assert summary["epsilon_spent"] == results["epsilon_spent"]
    assert "train_positive_rate" in results["data_info"]
    assert not _keys(summary) & CLEAN_LABEL_KEYS
    assert summary["data_info"]["rows"] == results["data_info"]["rows"]


def test_failed_marker_is_private(tmp_path):
    # Execute
    path = mark_failed(tmp_path / "run", ValueError("label column holds 2"))

    # Assert
    assert _mode(path) == 0o600


def test_rewriting_a_private_file_keeps_it_private(tmp_path):
    # Prepare: results.json as the label party writes it, then an engine
    # adds its wall time (as the Ray and deployment engines do).
    path = write_atomic(tmp_path / "results.json", "{}", mode=0o600)

    # Execute
    write_atomic(path, '{"flower_wall_seconds": 1.0}')

    # Assert
    assert _mode(path) == 0o600 and "flower_wall_seconds" in path.read_text()


def test_private_folder_tightens_an_existing_folder(tmp_path):
    # Prepare
    folder = tmp_path / "out"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)

    # Execute
    private_folder(folder)

    # Assert
    assert _mode(folder) == 0o700


def test_sweep_csvs_split_by_audience(tmp_path):
    # Prepare
    row: dict[str, Any] = dict.fromkeys(CSV_COLUMNS, SECRET)
    row |= {"run": "a", "mechanism": "laplace", "key_origin": "seed"}
    row["seeded_key"] = True

    # Execute
    write_csv([row], tmp_path / "runs.csv")
    public = write_public_csv([row], tmp_path / "runs-public.csv")

    # Assert
    assert _mode(tmp_path) == 0o700 and _mode(tmp_path / "runs.csv") == 0o600
    assert _mode(public) == PUBLIC_MODE
    header, line = public.read_text().splitlines()
    assert header.split(",") == [c for c in CSV_COLUMNS if c in PUBLIC_RUN_COLUMNS]
    assert "test_auc" not in header and "sda" not in header.split(",")
    assert "seed,True" in line  # key_origin, seeded_key
