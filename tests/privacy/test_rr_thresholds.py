"""Randomized response thresholds: exact on the 64-bit word scale (issue 20, item 7).

The realized channel of the sampler (``K`` keep words out of ``N = 2^64``,
replacement bins of ``c_min``/``c_max`` words) has ``e^eps_r = max(K N / ((N
- K) c_min), (N - K) c_max / (K N), c_max / c_min)``; these tests compare it
with ``e^eps`` exactly, against a 200-digit reference.
"""

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import RandomizedResponse
from tpsl_flwr.privacy.mechanisms.randomized_response import (
    RRThresholds,
    replacement_index,
    rr_thresholds,
)
from tpsl_flwr.privacy.noisy_labels import draw_noisy_labels

N = 2**64
DIGITS = 200
"""Decimal digits of the independent reference of ``e^eps``."""
CLASSES = [2, 3, 10, 100]
EPSILONS = [1e-3, 0.01, 0.1, 0.3, 0.5, 1.0, 2.0, 4.0, 8.0, 9.89, 10.0] + [
    round(0.37 * i, 2) for i in range(1, 55)
]
"""A grid up to 20; 9.89 is where the old 10-class thresholds were 2.6e-13 over."""
GAP_AT_MOST_10 = 2e-15
"""``eps - eps_r < 1/K + 1/(N - K - 1)``; for ``eps <= 10``, ``k <= 100`` this
is below ``(k + 1 + e^10) 2^-64 = 1.2e-15``."""


def _exp_enclosure(eps: float) -> tuple[Fraction, Fraction]:
    """Rationals ``lo <= e^eps <= hi`` from correctly rounded 200-digit Decimal."""
    with localcontext() as ctx:
        ctx.prec = DIGITS
        value = Decimal(eps).exp()
    slack = Fraction(1, 10 ** (DIGITS - 5))
    return Fraction(value) * (1 - slack), Fraction(value) * (1 + slack)


def _ln(ratio: Fraction) -> Decimal:
    with localcontext() as ctx:
        ctx.prec = DIGITS
        return (Decimal(ratio.numerator) / ratio.denominator).ln()


def _gap(eps: float, ratio: Fraction) -> Decimal:
    """``eps - ln(ratio)`` to 200 digits."""
    with localcontext() as ctx:
        ctx.prec = DIGITS
        return Decimal(eps) - _ln(ratio)


def _keep_ratio(keep: int, k: int) -> Fraction:
    """``K N / ((N - K) c_min)``: keep vs. the rarest replacement."""
    return Fraction(keep * N, (N - keep) * (N // (k - 1)))


def _old_thresholds(eps: float, k: int) -> RRThresholds:
    """The pre-fix rule: thresholds rounded from float probabilities."""
    if k == 2:
        flip = 1 / (1 + math.exp(eps))
        return RRThresholds(N - min(math.ceil(flip * N), N - 1), 2)
    keep = 1 / (1 + (k - 1) * math.exp(-eps))
    return RRThresholds(math.floor(keep * N), k)


def _over_nominal(thresholds: RRThresholds, eps: float) -> bool:
    low, _ = _exp_enclosure(eps)
    return thresholds.realized_ratio > low


@pytest.mark.parametrize("k", CLASSES)
def test_realized_epsilon_never_exceeds_nominal_and_gap_is_tiny(k):
    for eps in EPSILONS:
        # Execute
        thresholds = rr_thresholds(eps, k)
        # Assert: e^eps_r <= e^eps exactly (ratio below a lower bound of e^eps).
        assert not _over_nominal(thresholds, eps), (eps, k)
        keep = thresholds.keep_count
        gap = _gap(eps, thresholds.realized_ratio)
        # Proven bound: K + 1 would break the rule, so the gap is below this.
        assert 0 <= gap < Decimal(1) / keep + Decimal(1) / (N - keep - 1), (eps, k)
        if eps <= 10:
            assert gap < Decimal(GAP_AT_MOST_10), (eps, k, gap)
        assert thresholds.realized_epsilon <= eps


@pytest.mark.parametrize("k", CLASSES)
def test_keep_count_is_the_largest_that_respects_epsilon(k):
    for eps in EPSILONS:
        keep = rr_thresholds(eps, k).keep_count
        _, high = _exp_enclosure(eps)
        # One more keep word would put the keep ratio above e^eps.
        assert _keep_ratio(keep + 1, k) > high, (eps, k)


def test_old_float_thresholds_exceed_nominal_epsilon():
    # The check above, run on the pre-fix rule, fails (the report).
    over = {
        (eps, k): float(-_gap(eps, _old_thresholds(eps, k).realized_ratio))
        for k in CLASSES
        for eps in EPSILONS
        if _over_nominal(_old_thresholds(eps, k), eps)
    }
    assert over, "the old thresholds should break the realized-epsilon check"
    # The 10-class case from the issue: 2.6e-13 over at eps = 9.89.
    assert 2e-13 < over[(9.89, 10)] < 3e-13
    assert not _over_nominal(rr_thresholds(9.89, 10), 9.89)


@settings(max_examples=200, deadline=None)
@given(
    st.floats(min_value=1e-6, max_value=60.0),
    st.integers(min_value=2, max_value=5000),
)
def test_realized_epsilon_property(eps, k):
    thresholds = rr_thresholds(eps, k)
    low, high = _exp_enclosure(eps)
    assert thresholds.realized_ratio <= low
    keep = thresholds.keep_count
    assert keep == N - 1 or _keep_ratio(keep + 1, k) > high


@pytest.mark.parametrize("n", [1, 2, 3, 9, 99, 1000, 2**32 - 1])
def test_replacement_index_is_exact_at_bin_edges(n):
    # Prepare: the first and last word of random bins, and the extremes.
    rng = np.random.default_rng(n)
    bins = {0, n - 1, *rng.integers(0, n, size=200).tolist()}
    edges = {0, N - 1}
    for i in bins:
        start = -(-i * N // n)
        edges.update({start, -(-(i + 1) * N // n) - 1})
    words = np.array(sorted(edges), dtype=np.uint64)
    # Execute
    got = replacement_index(words, n)
    # Assert: floor(w n / N) in exact integers.
    assert got.tolist() == [int(w) * n // N for w in words.tolist()]


def test_mechanism_exposes_realized_epsilon_and_uses_the_thresholds():
    rr = RandomizedResponse(num_classes=10, eps=9.89)
    assert rr.thresholds == rr_thresholds(9.89, 10)
    assert rr.realized_epsilon <= rr.eps
    assert rr.realized_epsilon == pytest.approx(rr.eps, abs=GAP_AT_MOST_10)


@pytest.mark.parametrize(("eps", "k"), [(1e-19, 10), (1e-300, 3)])
def test_epsilon_below_word_resolution_is_refused_by_name(eps, k):
    with pytest.raises(ConfigError, match=f"epsilon {eps!r}"):
        RandomizedResponse(num_classes=k, eps=eps)


def test_too_many_classes_are_refused_by_name():
    with pytest.raises(ConfigError, match=str(2**32 + 1)):
        rr_thresholds(1.0, 2**32 + 1)


@pytest.mark.parametrize(("eps", "k"), [(0.5, 3), (3.0, 100), (1.0, 2)])
def test_empirical_keep_rate_matches_realized_probability(eps, k):
    # Prepare: fixed key and labels; 200k draws.
    n = 200_000
    labels = np.random.default_rng(11).integers(0, k, size=n)
    rr = RandomizedResponse(num_classes=k, eps=eps)
    # Execute
    out = draw_noisy_labels(rr, labels, np.arange(n), NoiseKey.from_seed(5))
    kept = np.argmax(out.coefficients, axis=1) == labels
    # Assert: within 5 standard errors of K / N (= the closed form to 1e-15).
    q = float(rr.thresholds.realized_keep_probability)
    assert q == pytest.approx(rr.keep_probability, abs=1e-15)
    assert abs(kept.mean() - q) < 5 * math.sqrt(q * (1 - q) / n)
