"""The prior-aware AUC ceiling: exact, equal to the plain one for a flat prior."""

import math
import warnings

import numpy as np
import pytest

from tpsl_flwr import ConfigError
from tpsl_flwr.metrics.auc import binary_auc
from tpsl_flwr.privacy.closed_forms import auc_bound
from tpsl_flwr.privacy.prior_bound import (
    calibrated_log_odds,
    prior_aware_auc_bound,
    prior_aware_ceiling,
)


@pytest.mark.parametrize("epsilon", [0.25, 1.0, 3.0])
def test_a_flat_prior_gives_the_plain_ceiling(epsilon):
    labels = np.random.default_rng(0).integers(0, 2, 1000)
    got = prior_aware_auc_bound(np.full(1000, 0.2), labels, epsilon)
    assert got == pytest.approx(auc_bound(epsilon), abs=1e-12)


def test_randomized_response_with_a_calibrated_prior_attains_it():
    """Monte Carlo: logit(prior) +- eps under RR(eps), 200 draws, within 4 SE."""
    rng = np.random.default_rng(1)
    n, epsilon = 5000, 1.0
    # A calibrated prior: labels drawn from it
    priors = 1 / (1 + np.exp(-rng.normal(0.0, 2.0, size=n)))
    labels = (rng.random(n) < priors).astype(np.int64)
    bound = prior_aware_auc_bound(priors, labels, epsilon)
    keep = 1 / (1 + math.exp(-epsilon))
    aucs = []
    for _ in range(200):
        agrees = rng.random(n) < keep
        sign = np.where(agrees, 2 * labels - 1, 1 - 2 * labels)
        score = np.log(priors / (1 - priors)) + epsilon * sign
        aucs.append(binary_auc(labels, score))
    se = np.std(aucs) / math.sqrt(len(aucs))
    assert abs(np.mean(aucs) - bound) < 4 * se
    # The prior carries information: the ceiling rises above the plain one,
    # and above the prior's own AUC
    assert bound > auc_bound(epsilon)
    assert bound > binary_auc(labels, priors)
    assert prior_aware_ceiling(priors, labels, epsilon) == pytest.approx(
        bound, abs=0.002
    )


def test_a_miscalibrated_prior_is_recalibrated_first():
    """A prior three times too flat gives the calibrated prior's ceiling."""
    rng = np.random.default_rng(2)
    n, epsilon = 20_000, 1.0
    log_odds = rng.normal(0.0, 2.0, size=n)
    labels = (rng.random(n) < 1 / (1 + np.exp(-log_odds))).astype(np.int64)
    flat = 1 / (1 + np.exp(-log_odds / 3))
    right = prior_aware_auc_bound(1 / (1 + np.exp(-log_odds)), labels, epsilon)
    assert prior_aware_auc_bound(flat, labels, epsilon) < right - 0.005
    assert prior_aware_ceiling(flat, labels, epsilon) == pytest.approx(right, abs=0.002)


def test_a_separating_prior_is_recalibrated_without_overflow():
    """Labels the prior separates drive Platt's slope up; no warning, finite."""
    # Prepare: the prior splits the labels at 0.5 exactly, and priors at 1e-15
    rng = np.random.default_rng(3)
    separable = rng.uniform(0.3, 0.7, size=200)
    extreme = np.array([1e-15, 1e-13, 0.5, 1 - 1e-13, 1 - 1e-15] * 20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for priors in (separable, extreme):
            labels = (priors > 0.5).astype(np.int64)
            # Execute
            log_odds = calibrated_log_odds(priors, labels)
            ceiling = prior_aware_ceiling(priors, labels, 1.0)
            # Assert: finite, the prior's order kept, and a perfect ceiling
            assert np.isfinite(log_odds).all()
            order = np.argsort(priors, kind="stable")
            assert (np.diff(log_odds[order]) >= 0).all()
            assert ceiling == 1.0


def test_bad_inputs_are_refused():
    y = np.array([0, 1])
    with pytest.raises(ConfigError, match="strictly"):
        prior_aware_auc_bound(np.array([0.0, 0.5]), y, 1.0)
    with pytest.raises(ConfigError, match="both labels"):
        prior_aware_auc_bound(np.array([0.2, 0.5]), np.array([1, 1]), 1.0)
    assert prior_aware_auc_bound(np.array([0.2, 0.5]), y, float("inf")) == 1.0
