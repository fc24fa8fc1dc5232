"""The ceiling verdict at the boundary, and the ceiling as printed (issue item 7).

e. Randomized response at eps 8 flips a label with probability
``q = 1 / (1 + e^8) = 3.35e-4``; on ``n = 7,956`` rows no label flips with
probability ``(1 - q)^n = 0.069``. The attack's AUC is then exactly 1 and its
Hanley-McNeil standard error 0, and "more than 4 standard errors above the
ceiling" called a correct mechanism a violation. At the boundary an exact
binomial test (the empirical epsilon lower bound at 99.9%) decides instead.

f. Where the top model trains on the posterior the verdict uses the
prior-aware ceiling; the plain eps ceiling is printed beside it.
"""

import math

import numpy as np
import pytest

from tpsl_flwr.attacks import BatchRecord, attack_report
from tpsl_flwr.attacks.ceiling import ABOVE, BELOW, WITHIN, ceiling_verdict
from tpsl_flwr.attacks.mechanism_audit import mechanism_gradients, run_audit
from tpsl_flwr.experiments.run_report import markdown
from tpsl_flwr.experiments.sweep.report import tables_markdown
from tpsl_flwr.privacy.closed_forms import auc_bound
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import make_mechanism
from tpsl_flwr.strategies.epoch_log import progress_line

ROWS = 7_956
NO_FLIP_SEED = 2
"""A seed whose 7,956 labels randomized response at eps 8 leaves unflipped
(an event of probability 0.069, so about 1 seed in 14)."""


def _epoch(mechanism, seed, rows=ROWS, batch=256):
    """The batches a node receives for ``rows`` seeded labels, and the flips."""
    labels = np.random.default_rng(seed).integers(0, 2, size=rows)
    received, candidates, noisy = mechanism_gradients(
        mechanism, labels, NoiseKey.from_seed(seed)
    )
    flips = int(np.count_nonzero(noisy.coefficients.argmax(axis=1) != labels))
    records = [
        BatchRecord(
            ids=np.arange(start, min(start + batch, rows)),
            gradient=received[start : start + batch] / batch,
            labels=labels[start : start + batch],
            candidates=candidates[start : start + batch],
            batch_size=batch,
        )
        for start in range(0, rows, batch)
    ]
    return records, flips


def test_no_flip_is_likely_enough_to_be_consistent_with_eps_8():
    # The closed form the seed stands for.
    q = 1.0 / (1.0 + math.exp(8.0))
    assert (1.0 - q) ** ROWS == pytest.approx(0.069, abs=0.001)


def test_rr_at_eps_8_with_no_label_flipped_is_consistent_not_above():
    # Prepare
    records, flips = _epoch(make_mechanism("discrete", epsilon=8.0), NO_FLIP_SEED)
    assert flips == 0

    # Execute
    report = attack_report(records, auc_bound=auc_bound(8.0))

    # Assert: AUC exactly 1 with SE 0, judged by the exact test.
    assert report["sda"] == 1.0 and report["standard_error"]["sda"] == 0.0
    assert report["ceiling_verdict"]["sda"] == WITHIN


def test_tpsl_flwr_audit_says_ok_on_the_same_boundary_case():
    result = run_audit(
        make_mechanism("discrete", epsilon=8.0), samples=ROWS, seed=NO_FLIP_SEED
    )
    assert result.sda_auc == 1.0 and result.standard_error == 0.0
    assert result.realized_noise["flip_rate"] == 0.0
    assert not result.violation and result.verdict == "ok"
    assert result.ceiling_verdict == WITHIN


def test_rr_at_eps_8_is_never_above_the_ceiling_over_seeds():
    # 12 seeds: each flips about n q = 2.7 labels, some none (AUC 1).
    mechanism = make_mechanism("discrete", epsilon=8.0)
    verdicts, perfect = [], 0
    for seed in range(12):
        records, flips = _epoch(mechanism, seed)
        perfect += flips == 0
        report = attack_report(records, auc_bound=auc_bound(8.0))
        verdicts.append(report["ceiling_verdict"]["sda"])
    assert perfect >= 1  # the boundary case is among them
    assert ABOVE not in verdicts


def test_clean_labels_claimed_as_eps_1_are_still_above_the_ceiling():
    # Prepare: no noise at all, the ceiling of eps 1 claimed.
    records, _ = _epoch(make_mechanism("none"), NO_FLIP_SEED)

    # Execute
    report = attack_report(records, auc_bound=auc_bound(1.0))

    # Assert: AUC 1, SE 0: the exact test's epsilon bound (about 5.5 on 7,956
    # rows at 99.9%) is far above 1.
    assert report["sda"] == 1.0 and report["standard_error"]["sda"] == 0.0
    assert report["ceiling_verdict"]["sda"] == ABOVE


def test_at_the_boundary_the_standard_error_alone_decides_nothing():
    ceiling = auc_bound(8.0)
    assert ceiling_verdict(1.0, 0.0, ceiling) == WITHIN
    assert ceiling_verdict(1.0, 0.0, ceiling, epsilon_lower_bound=8.5) == ABOVE
    assert ceiling_verdict(1.0, 0.0, ceiling, epsilon_lower_bound=5.5) == WITHIN
    # Off the boundary the four-standard-error rule is unchanged.
    assert ceiling_verdict(0.95, 0.0015, auc_bound(1.0)) == ABOVE


# ------------------------------------------------------------ f. printing
PRIOR_AWARE = 0.828
PLAIN = auc_bound(1.0)  # 0.7311


def _attacks():
    return {
        "sda": 0.724,
        "auc_bound": PRIOR_AWARE,
        "auc_bound_without_prior": PLAIN,
        "standard_error": {"sda": 0.02},
        "ceiling_verdict": {"sda": BELOW},
    }


def test_the_progress_line_prints_the_plain_ceiling_beside_the_prior_aware():
    line = progress_line({"samples_per_second": 900.0, "attack_auc": _attacks()})
    assert "(ceiling 0.731 at eps 1; 0.828 with the label prior)" in line


def test_report_md_and_tables_print_both_ceilings():
    # Prepare
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
        "samples_per_second": 900.0,
        "history": [{"epoch": 1, "test_auc": 0.9, "attack_auc": _attacks()}],
    }
    row = {
        "run": "r0",
        "dataset": "breast-cancer",
        "mechanism": "discrete",
        "epsilon": 1.0,
        "seed": 0,
        "test_auc": 0.9,
        "sda": 0.724,
        "auc_bound": PRIOR_AWARE,
        "auc_bound_without_prior": PLAIN,
    }

    # Execute
    report, tables = markdown(results), tables_markdown([row])

    # Assert
    assert "| 0.7311; 0.8280 with the label prior |" in report
    assert "| 0.731; 0.828 with the label prior |" in tables
