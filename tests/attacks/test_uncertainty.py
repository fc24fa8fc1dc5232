"""Every attack AUC carries its standard error and one stated ceiling verdict."""

import math

import numpy as np
import pytest

from tpsl_flwr.attacks import BatchRecord, attack_report
from tpsl_flwr.attacks.ceiling import (
    ABOVE,
    BELOW,
    SIGMAS_OF_TOLERANCE,
    WITHIN,
    ceiling_test,
    ceiling_verdict,
)
from tpsl_flwr.attacks.mechanism_audit import run_audit
from tpsl_flwr.attacks.transcript_audit import TranscriptAudit
from tpsl_flwr.experiments.run_report import markdown
from tpsl_flwr.experiments.sweep.report import tables_markdown, write_tables
from tpsl_flwr.experiments.sweep.run import csv_columns, run_row
from tpsl_flwr.experiments.sweep.stats import cell
from tpsl_flwr.metrics.auc import auc_standard_error
from tpsl_flwr.privacy.closed_forms import auc_bound
from tpsl_flwr.privacy.mechanisms import make_mechanism
from tpsl_flwr.strategies.epoch_log import progress_line

CEILING = auc_bound(1.0)  # 0.7311


def _flipped_epoch(n_pos: int, n_neg: int, flip_pos: int, flip_neg: int, batch=256):
    """Batches whose received gradient is the candidate of a (flipped) label.

    The SDA then guesses the received label exactly, so its AUC is
    ``(TPR + TNR) / 2 = 1 - (flip_pos / n_pos + flip_neg / n_neg) / 2``.
    """
    rng = np.random.default_rng(0)
    labels = np.r_[np.ones(n_pos, int), np.zeros(n_neg, int)]
    flipped = np.r_[np.arange(n_pos) < flip_pos, np.arange(n_neg) < flip_neg].astype(
        int
    )
    order = rng.permutation(labels.size)
    labels, flipped = labels[order], flipped[order]
    sent = labels ^ flipped
    records = []
    for start in range(0, labels.size, batch):
        y = labels[start : start + batch]
        n = y.size
        z = rng.integers(-3, 4, size=(n, 1)).astype(float)  # exact arithmetic
        candidates = np.stack([np.c_[z, 1 + z], np.c_[z - 1, z]], axis=1)  # (n, 2, 2)
        received = candidates[np.arange(n), sent[start : start + n]]
        records.append(
            BatchRecord(
                ids=np.arange(start, start + n),
                gradient=received / batch,  # a power of two: exact
                labels=y,
                candidates=candidates,
                batch_size=batch,
            )
        )
    return records


def test_the_reviewers_breast_cancer_case_is_within_sampling_error():
    # Prepare: 456 training samples (286 positive), SDA just above 0.7311
    batches = _flipped_epoch(286, 170, flip_pos=76, flip_neg=45)
    # Execute
    report = attack_report(batches, auc_bound=CEILING)
    # Assert
    sda = report["sda"]
    assert CEILING < sda < 0.74
    se = report["standard_error"]["sda"]
    assert se == pytest.approx(auc_standard_error(sda, 286, 170))
    assert 0.015 < se < 0.03
    assert report["ceiling_verdict"]["sda"] == WITHIN
    assert ceiling_verdict(0.7332, se, 0.7311) == WITHIN


def test_a_broken_mechanism_is_above_the_ceiling():
    # Prepare: 20,000 samples whose labels are flipped only 5% of the time
    batches = _flipped_epoch(10_000, 10_000, flip_pos=500, flip_neg=500)
    # Execute
    report = attack_report(batches, auc_bound=0.73)
    # Assert
    assert report["sda"] == pytest.approx(0.95)
    assert report["standard_error"]["sda"] < 0.005
    assert report["ceiling_verdict"]["sda"] == ABOVE


def test_the_rule_is_four_standard_errors_or_a_strict_epsilon_bound():
    se = 0.01
    assert ceiling_verdict(CEILING - 0.001, se, CEILING) == BELOW
    assert ceiling_verdict(CEILING + 0.039, se, CEILING) == WITHIN
    assert ceiling_verdict(CEILING + 0.041, se, CEILING) == ABOVE
    assert SIGMAS_OF_TOLERANCE == 4.0
    strict = ceiling_test(
        value=0.70,
        standard_error=se,
        ceiling=CEILING,
        epsilon=1.0,
        epsilon_lower_bound=1.2,
    )
    assert strict.verdict == ABOVE and "epsilon lower bound 1.2000" in strict.reasons[0]
    assert ceiling_verdict(math.nan, se, CEILING) is None
    assert ceiling_verdict(0.7, se, None) is None


def test_a_flipped_orientation_is_reported_as_one_minus_auc_and_inverted():
    # The ceiling bounds a score and its negation alike: an SDA of 0.05 is an
    # attack of 0.95 pointed the wrong way round.
    batches = _flipped_epoch(10_000, 10_000, flip_pos=9_500, flip_neg=9_500)
    report = attack_report(batches, auc_bound=0.73)
    assert report["sda"] == pytest.approx(0.95)
    assert report["direction"]["sda"] == "inverted"
    assert report["per_batch"]["sda"]["mean"] > 0.9  # the batches turned too
    assert report["ceiling_verdict"]["sda"] == ABOVE
    upright = attack_report(_flipped_epoch(10_000, 10_000, 500, 500))
    assert upright["sda"] == pytest.approx(0.95)
    assert upright["direction"]["sda"] == "as scored"


def test_every_binary_attack_has_a_standard_error_and_multiclass_top1_too():
    binary = attack_report(_flipped_epoch(300, 700, 30, 70))
    assert set(binary["standard_error"]) == {
        "norm",
        "cosine",
        "spectral",
        "sda",
        "sda_pooled",
        "sda_residual",
    }
    assert set(binary["direction"]) == set(binary["standard_error"])
    assert "ceiling_verdict" not in binary  # no ceiling given
    rng = np.random.default_rng(1)
    y = rng.integers(0, 3, size=200)
    cand = rng.normal(size=(200, 3, 4))
    multi = attack_report(
        [BatchRecord(np.arange(200), cand[np.arange(200), y] / 200, y, cand)]
    )
    assert multi["sda_top1"] == 1.0
    assert multi["standard_error"] == {"sda_top1": 0.0}


def test_the_transcript_audit_passes_the_ceiling_to_every_party():
    audit = TranscriptAudit([(0, 2)])
    for record in _flipped_epoch(286, 170, 76, 45):
        audit.add_batch([record])
    report = audit.epoch_report(CEILING)
    assert report["ceiling_verdict"]["sda"] == WITHIN
    assert report["by_party"][0]["standard_error"]["sda"] > 0


def test_the_audit_uses_the_same_rule():
    result = run_audit(make_mechanism("discrete", epsilon=1.0), samples=20_000)
    assert result.ceiling_verdict in (BELOW, WITHIN)
    assert not result.violation
    assert result.to_dict()["ceiling_verdict"] == result.ceiling_verdict


def _entry(sda=0.7332, verdict=WITHIN):
    return {
        "epoch": 1,
        "samples_per_second": 900.0,
        "test_auc": 0.9,
        "attack_auc": {
            "norm": 0.61,
            "cosine": 0.6,
            "spectral": 0.62,
            "sda": sda,
            "auc_bound": CEILING,
            "standard_error": {
                "norm": 0.026,
                "cosine": 0.02,
                "spectral": 0.02,
                "sda": 0.0231,
            },
            "ceiling_verdict": {
                "norm": BELOW,
                "cosine": BELOW,
                "spectral": BELOW,
                "sda": verdict,
            },
        },
    }


def test_the_progress_line_shows_the_error_and_the_verdict():
    line = progress_line(_entry())
    assert "sda 0.733 ± 0.023 (ceiling 0.731, within sampling error)" in line
    assert "norm 0.610 ± 0.026" in line
    quiet = progress_line(_entry(sda=0.70, verdict=BELOW))
    assert "sda 0.700 ± 0.023 (ceiling 0.731)" in quiet
    assert "sampling error" not in quiet


def test_report_md_shows_standard_errors_and_the_verdict():
    results = {
        "mechanism": "discrete",
        "epsilon": 1.0,
        "dataset": "breast-cancer",
        "engine": "local",
        "num_parties": 2,
        "placement": "logits",
        "epochs": 1,
        "epsilon_spent": 1.0,
        "noise_key": {"secure": True},
        "test_auc": 0.9,
        "samples_per_second": 900.0,
        "history": [_entry()],
    }
    text = markdown(results)
    assert "| epoch | test_auc | norm | cosine | spectral | sda | ceiling |" in text
    assert "0.7332 ± 0.0231" in text
    assert "| sda: within sampling error |" in text
    assert "4 standard errors" in text


def test_an_inverted_attack_reads_one_minus_auc_and_inverted_everywhere():
    # Prepare: an epoch whose spectral attack scored 0.387 the wrong way round.
    entry = _entry()
    entry["attack_auc"]["spectral"] = 0.613
    entry["attack_auc"]["direction"] = {
        "norm": "as scored",
        "cosine": "as scored",
        "spectral": "inverted",
        "sda": "as scored",
    }
    results = {
        "mechanism": "discrete",
        "epsilon": 1.0,
        "dataset": "breast-cancer",
        "engine": "local",
        "num_parties": 2,
        "placement": "logits",
        "epochs": 1,
        "epsilon_spent": 1.0,
        "noise_key": {"secure": True},
        "test_auc": 0.9,
        "samples_per_second": 900.0,
        "history": [entry],
        "config": {},
    }
    # Execute / Assert: the progress line, report.md and the runs.csv row.
    assert "spectral 0.613 ± 0.020 inverted" in progress_line(entry)
    assert "| 0.6130 ± 0.0200 (inverted) |" in markdown(results)
    row = run_row("r0", results)
    assert row["spectral"] == 0.613
    assert row["spectral_direction"] == "inverted"
    assert row["norm_direction"] == "as scored"
    assert "spectral_direction" in csv_columns([row])
    # The sweep tables name the inversion, and say nothing of "as scored".
    assert cell([row], "spectral") == "0.613 (SE 0.020) [inverted]"
    assert cell([row], "norm") == "0.610 (SE 0.026)"


def _row(seed, sda, verdict, se=0.02):
    return {
        "run": f"r{seed}",
        "dataset": "breast-cancer",
        "mechanism": "discrete",
        "epsilon": 1.0,
        "sigma": None,
        "seed": seed,
        "rows": 0,
        "test_auc": 0.9,
        "norm": 0.6,
        "cosine": 0.6,
        "spectral": 0.6,
        "sda": sda,
        "sda_se": se,
        "auc_bound": CEILING,
        "sda_verdict": verdict,
    }


def test_sweep_tables_show_a_single_runs_error_and_the_verdicts():
    one = tables_markdown([_row(0, 0.7332, WITHIN, 0.0231)])
    assert "0.733 (SE 0.023)" in one
    assert "| within sampling error (1/1) |" in one
    three = tables_markdown(
        [_row(0, 0.72, BELOW), _row(1, 0.7332, WITHIN), _row(2, 0.80, ABOVE)]
    )
    assert "SDA vs ceiling" in three
    assert "ABOVE THE CEILING (1/3); within sampling error (1/3)" in three


def test_sweep_tables_read_the_errors_from_each_runs_results(tmp_path):
    import json

    # Prepare: a row as runs.csv holds it, and its run's results.json
    run = tmp_path / "runs" / "r0"
    run.mkdir(parents=True)
    attacks = _entry()["attack_auc"]
    (run / "results.json").write_text(
        json.dumps({"history": [{"attack_auc": attacks}]})
    )
    row = {
        k: v
        for k, v in _row(0, 0.7332, None).items()
        if k not in ("sda_se", "sda_verdict")
    }
    # Execute
    text = write_tables([row], tmp_path / "tables.md").read_text()
    # Assert
    assert "0.733 (SE 0.023)" in text and "within sampling error (1/1)" in text
