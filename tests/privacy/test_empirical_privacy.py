import math

import numpy as np
import pytest
from scipy import stats

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.privacy.empirical import clopper_pearson, epsilon_lower_bound


def test_clopper_pearson_golden_and_edges():
    low, high = clopper_pearson(np.array([0, 10, 5]), np.array([10, 10, 20]), 0.05)
    assert low[0] == 0.0 and high[1] == 1.0
    assert high[0] == pytest.approx(0.3085, abs=1e-4)
    ref = stats.binomtest(5, 20).proportion_ci(0.95, method="exact")
    assert (low[2], high[2]) == pytest.approx((ref.low, ref.high))


def _rr_scores(eps, n, seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=n)
    flip = rng.random(n) < 1 / (1 + math.exp(eps))
    return np.where(flip, 1 - y, y).astype(float), y


def test_lower_bound_is_close_to_but_below_the_true_epsilon():
    scores, y = _rr_scores(1.0, 200_000, 0)
    bound = epsilon_lower_bound(scores, y, 0.95, seed=1)
    assert 0.9 < bound <= 1.0


def test_lower_bound_is_zero_without_leakage():
    rng = np.random.default_rng(3)
    assert epsilon_lower_bound(rng.random(20_000), rng.integers(0, 2, 20_000)) < 0.1


def test_lower_bound_holds_at_its_confidence_over_repeats():
    # Over 40 independent repeats at 90% confidence, expect ~<= 4 exceedances.
    exceed = sum(
        epsilon_lower_bound(*_rr_scores(0.5, 4000, s), 0.9, seed=s) > 0.5
        for s in range(40)
    )
    assert exceed <= 10


def test_bad_inputs():
    with pytest.raises(ConfigError, match="confidence"):
        epsilon_lower_bound(np.zeros(10), np.arange(10) % 2, confidence=1.5)
    with pytest.raises(ConfigError, match="both labels"):
        epsilon_lower_bound(np.zeros(10), np.zeros(10))
