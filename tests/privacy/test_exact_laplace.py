import itertools
import math
from decimal import Decimal, localcontext

import numpy as np
import pytest

from tpsl_flwr.privacy import exact_laplace
from tpsl_flwr.privacy.exact_laplace import (
    discrete_laplace_steps,
    exact_geometric,
    exp_neg_bounds,
    geometric_bounds,
)
from tpsl_flwr.privacy.keyed_noise import NoiseKey

KEY = NoiseKey.from_seed(99)
SCALES = [1, 2, 3, 7, 2**20, 2**20 + 1, 3145729, 2**40]
DIGITS = 200
"""Decimal digits of the independent reference (~660 bits)."""


with localcontext() as _ctx:
    _ctx.prec = DIGITS + 10
    _LN2 = Decimal(2).ln()


def _floor_checked(x: Decimal) -> int:
    """floor(x), refusing values too close to an integer for the reference."""
    n = math.floor(x)
    assert min(x - n, n + 1 - x) > Decimal(10) ** (40 - DIGITS)
    return n


def _reference_range(prefix: int, bits: int, t: int) -> tuple[int, float]:
    """(min G, max G) over W in [prefix 2^-bits, (prefix + 1) 2^-bits).

    G = #{g >= 1 : g < t E}, E = -ln W; t E ranges over (near, far].
    """
    with localcontext() as ctx:
        ctx.prec = DIGITS
        top = bits * _LN2
        g_min = 0
        if prefix + 1 < 2**bits:
            g_min = _floor_checked(t * (top - Decimal(prefix + 1).ln()))
        if prefix == 0:
            return g_min, math.inf
        far = t * (top - Decimal(prefix).ln())
        return g_min, _floor_checked(far)  # far is irrational: ceil - 1 = floor


def _boundary_word(g: int, t: int) -> int:
    """floor(exp(-g/t) 2^64): the word where G crosses from >= g to < g."""
    with localcontext() as ctx:
        ctx.prec = DIGITS
        return math.floor((-Decimal(g) / t).exp() * 2**64)


def _test_words(t: int, rng: np.random.Generator) -> np.ndarray:
    gs = [*range(61), t, 5 * t, 20 * t, 40 * t, 44 * t]
    near = {b + d for g in gs for b in [_boundary_word(g, t)] for d in range(-3, 4)} | {
        0,
        1,
        2,
        2**64 - 1,
    }
    words = sorted(w for w in near if 0 <= w < 2**64)
    rand = rng.integers(0, 2**64, size=800, dtype=np.uint64)
    return np.concatenate([np.array(words, dtype=np.uint64), rand])


@pytest.mark.parametrize("t", SCALES)
def test_fast_path_is_exact_or_undecided_at_every_threshold(t):
    # Prepare: the words around each threshold exp(-g/t) 2^64, and random ones.
    rng = np.random.default_rng(t % 1000)
    words = _test_words(t, rng)
    # Execute
    lo, hi = geometric_bounds(words, t)
    # Assert: a decided lane has the G of every W of its word's interval.
    decided = lo == hi
    for w, a, b, ok in zip(words.tolist(), lo, hi, decided, strict=True):
        g_min, g_max = _reference_range(w, 64, t)
        assert a <= g_min and g_max <= b
        if ok:
            assert g_min == g_max == a
    # The filter decides nearly all random words (so the check above bites) and
    # leaves words whose interval straddles a threshold undecided.
    assert decided[-800:].mean() > (0.8 if t == 2**40 else 0.999)
    assert not decided.all() or t > 2**30


def _lane(first: int, rng: np.random.Generator, count: int = 7) -> list[int]:
    return [first, *rng.integers(0, 2**64, size=count, dtype=np.uint64).tolist()]


def _reference_g(lane: list[int], t: int) -> int:
    prefix = int.from_bytes(b"".join(w.to_bytes(8, "big") for w in lane), "big")
    g_min, g_max = _reference_range(prefix, 64 * len(lane), t)
    assert g_min == g_max
    return g_min


@pytest.mark.parametrize("t", SCALES)
def test_slow_path_is_exact_for_undecided_and_random_words(t):
    # Prepare: every undecided word of the threshold set, plus random words,
    # each followed by 7 more words of the lane.
    rng = np.random.default_rng(t % 997)
    words = _test_words(t, rng)
    lo, hi = geometric_bounds(words, t)
    undecided = np.flatnonzero(lo != hi)
    picks = np.concatenate([undecided[:60], np.arange(words.size - 40, words.size)])
    for i in picks.tolist():
        lane = _lane(int(words[i]), rng)
        want = _reference_g(lane, t)
        # Execute / Assert: with the float guess, a wrong guess, and none.
        assert exact_geometric(iter(lane), t, (lo[i], hi[i])) == want
        assert exact_geometric(iter(lane), t, (want + 5, want + 9)) == want
        assert exact_geometric(iter(lane), t, (0, 0)) == want
        assert exact_geometric(iter(lane), t) == want


@pytest.mark.parametrize("t", [1, 3, 2**20 + 1, 2**40])
def test_slow_path_handles_leading_zero_words(t):
    # W < 2^-64 (and < 2^-128): the guess comes from the first nonzero words.
    rng = np.random.default_rng(7)
    for zeros in [1, 2]:
        for first in [1, 2, 3, 2**40, 2**64 - 1]:
            lane = [0] * zeros + _lane(first, rng, count=5)
            assert exact_geometric(iter(lane), t) == _reference_g(lane, t)


@pytest.mark.parametrize("prec", [16, 64, 200, 520])
def test_exp_bounds_are_rigorous_and_tight(prec):
    # Prepare: q = num / den over small, odd, huge and random denominators.
    rng = np.random.default_rng(prec)
    cases = [(0, 1), (1, 1), (60, 1), (1, 2**40), (2**40 - 1, 2**40)]
    for den in [1, 3, 7, 2**20 + 1, 3145729, 2**40]:
        for _ in range(25):
            cases.append((int(rng.integers(0, 60 * den)), den))
    for num, den in cases:
        # Execute
        lo, hi = exp_neg_bounds(num, den, prec)
        # Assert: lo <= exp(-q) 2^prec <= hi against a 200-digit reference.
        with localcontext() as ctx:
            ctx.prec = DIGITS
            exact = (-Decimal(num) / den).exp() * Decimal(2) ** prec
        assert lo <= exact <= hi
        assert 0 <= hi - lo <= 2, (num, den, hi - lo)


def test_sampler_reads_each_lane_as_documented():
    # m[i, j] = G(lane 2j) - G(lane 2j+1); word n of lane l = word l + 2 width n.
    t, width = 3, 3
    ids = np.arange(150) * 31
    got = discrete_laplace_steps(KEY, ids, 4, t, width)
    lanes = KEY.words_at(
        np.repeat(ids, 2 * width),
        4,
        np.tile(np.arange(2 * width), ids.size),
        count=4,
        stride=2 * width,
    )
    g = np.array([_reference_g(row, t) for row in lanes.tolist()]).reshape(-1, width, 2)
    np.testing.assert_array_equal(got, g[:, :, 0] - g[:, :, 1])


@pytest.mark.parametrize(("t", "width"), [(1, 1), (7, 2), (2**20 + 1, 3), (2**40, 1)])
def test_forced_slow_path_gives_the_fast_path_values(monkeypatch, t, width):
    # Prepare
    ids = np.arange(120) * 17 + 5
    fast = discrete_laplace_steps(KEY, ids, 2, t, width)
    # Execute: a huge delta leaves every lane to the exact path.
    monkeypatch.setattr(exact_laplace, "_SLACK", 2.0**33)
    words = KEY.words(ids, 2, 2 * width)
    lo, hi = geometric_bounds(words, t, exact_laplace._SLACK)
    assert not np.any(lo == hi)
    slow = discrete_laplace_steps(KEY, ids, 2, t, width)
    # Assert
    np.testing.assert_array_equal(slow, fast)


def test_long_lanes_fetch_further_words_from_the_key():
    # A lane's 4th and later words come from words_at: same as the batch layout.
    width, ids = 2, np.array([3, 8])
    words = iter(exact_laplace._lane_words(KEY, 8, 1, 3, 2 * width, [10, 11, 12]))
    got = list(itertools.islice(words, 6))
    seq = KEY.words(ids, 1, 6 * 2 * width)[1]
    assert got == [10, 11, 12, *seq[3 + 3 * 2 * width :: 2 * width][:3].tolist()]
