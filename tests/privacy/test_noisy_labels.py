import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.privacy.exact_laplace import discrete_laplace_steps
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import (
    LAPLACE_GRID,
    make_mechanism,
    rr_flip_threshold,
    rr_keep_threshold,
)
from tpsl_flwr.privacy.noisy_labels import (
    STREAM_TOP_UPDATE,
    STREAM_TRANSCRIPT,
    draw_noisy_labels,
    one_hot,
    realized_noise,
)

N = 200_000
KEY = NoiseKey.from_seed(1234)


def _labels(k, n=N, seed=0):
    return np.random.default_rng(seed).integers(0, k, size=n)


def test_binary_laplace_noise_has_scale_b_and_lies_on_the_grid():
    # Prepare
    mech = make_mechanism("laplace", epsilon=0.5)
    y = _labels(2)
    # Execute
    c = draw_noisy_labels(mech, y, np.arange(N), KEY).coefficients
    t = c[:, 1]
    u = (t - y) * (1 - 2 * y)
    # Assert: t = y + u(1 - 2y) exactly, u on the grid, u ~ Lap(2).
    np.testing.assert_array_equal(c.sum(axis=1), 1.0)
    steps = u / LAPLACE_GRID
    np.testing.assert_array_equal(steps, np.round(steps))
    # Mean |u| = b with standard error b / sqrt(N); 5 standard errors.
    assert abs(np.abs(u).mean() - 2.0) < 5 * 2.0 / math.sqrt(N)
    assert abs(u.mean()) < 5 * 2.0 * math.sqrt(2) / math.sqrt(N)
    assert stats.kstest(u, stats.laplace(scale=2.0).cdf).pvalue > 1e-3


def test_binary_rr_flip_rate_matches_closed_form():
    mech = make_mechanism("discrete", epsilon=1.0)
    y = _labels(2)
    c = draw_noisy_labels(mech, y, np.arange(N), KEY).coefficients
    flipped = np.argmax(c, axis=1) != y
    p = 1 / (1 + math.e)
    assert abs(flipped.mean() - p) < 5 * math.sqrt(p * (1 - p) / N)
    # Flips do not depend on the label.
    assert abs(flipped[y == 0].mean() - flipped[y == 1].mean()) < 0.01


def test_kary_rr_keeps_with_closed_form_rate_and_spreads_uniformly():
    k = 10
    mech = make_mechanism("discrete", epsilon=2.0, num_classes=k)
    y = _labels(k)
    c = draw_noisy_labels(mech, y, np.arange(N), KEY).coefficients
    out = np.argmax(c, axis=1)
    np.testing.assert_array_equal(c.sum(axis=1), 1.0)
    q = math.exp(2) / (math.exp(2) + k - 1)
    assert abs((out == y).mean() - q) < 5 * math.sqrt(q * (1 - q) / N)
    # Given a change, the offset to the new label is uniform over 1..k-1.
    offsets = ((out - y) % k)[out != y]
    counts = np.bincount(offsets, minlength=k)[1:]
    assert stats.chisquare(counts).pvalue > 1e-3


def test_multiclass_laplace_noise_is_iid_with_scale_two_over_epsilon():
    k = 5
    mech = make_mechanism("laplace", epsilon=1.0, num_classes=k)
    y = _labels(k, n=50_000)
    c = draw_noisy_labels(mech, y, np.arange(y.size), KEY).coefficients
    noise = c - one_hot(y, k)
    assert abs(np.abs(noise).mean() - 2.0) < 0.03
    corr = np.corrcoef(noise.T)
    assert np.max(np.abs(corr - np.eye(k))) < 0.03


def test_gaussian_noise_has_sigma():
    mech = make_mechanism("gaussian", sigma=0.7)
    y = _labels(2)
    noisy = draw_noisy_labels(mech, y, np.arange(N), KEY, additive_dim=3)
    np.testing.assert_array_equal(noisy.coefficients, one_hot(y, 2))
    assert noisy.additive is not None and noisy.additive.shape == (N, 3)
    assert abs(noisy.additive.std() - 0.7) < 0.01
    assert stats.kstest(noisy.additive[:, 0] / 0.7, "norm").pvalue > 1e-3


def test_none_is_one_hot():
    y = np.array([0, 1, 1])
    c = draw_noisy_labels(make_mechanism("none"), y, np.arange(3), KEY).coefficients
    np.testing.assert_array_equal(c, [[1, 0], [0, 1], [0, 1]])


@pytest.mark.parametrize(
    ("name", "param"), [("laplace", 1.0), ("discrete", 1.0), ("gaussian", None)]
)
def test_noise_is_reused_across_epochs_and_restarts(name, param):
    # Prepare: the same sample ids in two epochs, different batch orders.
    mech = (
        make_mechanism(name, sigma=1.0)
        if name == "gaussian"
        else make_mechanism(name, epsilon=param)
    )
    y = _labels(2, n=1000)
    ids = np.arange(1000)
    epoch1 = draw_noisy_labels(mech, y, ids, KEY)
    order = np.random.default_rng(5).permutation(1000)
    restarted = NoiseKey.from_hex(KEY.to_hex(), secure=False)
    # Execute: epoch 2, shuffled, in batches of 100, after a "restart".
    batches = [
        draw_noisy_labels(mech, y[part], ids[part], restarted)
        for part in np.array_split(order, 10)
    ]
    # Assert
    epoch2 = np.concatenate([b.coefficients for b in batches])
    np.testing.assert_array_equal(epoch2, epoch1.coefficients[order])
    if epoch1.additive is not None:
        add2 = np.concatenate([b.additive for b in batches])
        np.testing.assert_array_equal(add2, epoch1.additive[order])


def test_top_update_stream_is_independent_of_transcript_stream():
    mech = make_mechanism("laplace", epsilon=1.0)
    y = _labels(2, n=20_000)
    ids = np.arange(y.size)
    a = draw_noisy_labels(mech, y, ids, KEY, STREAM_TRANSCRIPT).coefficients[:, 1]
    b = draw_noisy_labels(mech, y, ids, KEY, STREAM_TOP_UPDATE).coefficients[:, 1]
    ua, ub = (a - y) * (1 - 2 * y), (b - y) * (1 - 2 * y)
    assert abs(np.corrcoef(ua, ub)[0, 1]) < 0.03


def test_rr_thresholds_round_in_the_safe_direction():
    for eps in [0.1, 1.0, 3.0, 20.0]:
        p = 1 / (1 + math.exp(eps))
        assert rr_flip_threshold(p) / 2**64 >= p
        q = 1 / (1 + 9 * math.exp(-eps))
        assert rr_keep_threshold(q) / 2**64 <= q


def test_discrete_laplace_has_integer_steps_and_exact_sums():
    mech = make_mechanism("laplace", epsilon=0.01)
    y = _labels(2, n=10_000)
    c = draw_noisy_labels(mech, y, np.arange(y.size), KEY).coefficients
    u = (c[:, 1] - y) * (1 - 2 * y)
    steps = u / LAPLACE_GRID
    np.testing.assert_array_equal(steps, np.trunc(steps))
    # y + u is exact in float64: subtracting y gives u back bit for bit.
    np.testing.assert_array_equal((1.0 - u) - 1.0, -u)


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("eps", [0.5, 1.0, 4.0])
def test_laplace_steps_follow_exp_minus_abs_m_over_t(eps, binary):
    # Prepare: ~1e6 draws; P(|m| in bin) and E|m| in closed form for r = e^(-1/t).
    k = 2 if binary else 3
    mech = make_mechanism("laplace", epsilon=eps, num_classes=k)
    t = mech.scale_steps
    width = 1 if binary else k
    n = 1_000_000 // width
    # Execute
    m = discrete_laplace_steps(KEY, np.arange(n), 11, t, width).ravel()
    # Assert: coarse bins |m| in [j t, (j+1) t) have mass ~ e^-j (1 - e^-1) (zero
    # folded into the first bin: its mass is ~1/(2t)); chi-square p > 1e-4 with
    # the fixed key, and the sign is fair.
    r = math.exp(-1 / t)
    p_zero = (1 - r) / (1 + r)
    edges = [0] + [j * t for j in range(1, 10)] + [np.inf]
    observed = np.histogram(np.abs(m), bins=edges)[0]
    tail = [2 * p_zero * r**a / (1 - r) for a in edges[1:-1]] + [0.0]
    mass = np.array([1 - tail[0]] + [tail[j] - tail[j + 1] for j in range(9)])
    assert stats.chisquare(observed, mass * m.size).pvalue > 1e-4
    # E|m| = 2r / (1 - r^2), E m^2 = 2r / (1 - r)^2; within 5 standard errors.
    expected_abs = 2 * r / (1 - r**2)
    std_abs = math.sqrt(2 * r / (1 - r) ** 2 - expected_abs**2)
    assert abs(np.abs(m).mean() - expected_abs) < 5 * std_abs / math.sqrt(m.size)
    assert abs(np.mean(m > 0) - np.mean(m < 0)) < 5 / math.sqrt(m.size)


@pytest.mark.parametrize("t", [1, 2, 3])
def test_laplace_steps_match_the_law_value_by_value_at_small_scale(t):
    # At tiny t every value has its own cell: P(m) = (1 - r)/(1 + r) r^|m|.
    m = discrete_laplace_steps(KEY, np.arange(500_000), 12, t, 2).ravel()
    r = math.exp(-1 / t)
    cut = 6 * t
    values = np.arange(-cut, cut + 1)
    probs = (1 - r) / (1 + r) * r ** np.abs(values)
    observed = [np.sum(m < -cut)] + [np.sum(m == v) for v in values]
    observed.append(np.sum(m > cut))
    beyond = r ** (cut + 1) / (1 + r)
    expected = np.array([beyond, *probs, beyond]) * m.size
    assert stats.chisquare(observed, expected).pvalue > 1e-4


@pytest.mark.parametrize(
    "eps", [1e-5, 0.1, 1 / 3, 0.5, 1.0, 7.3, 20.0, 2.0**-20, 1e6, math.pi]
)
@pytest.mark.parametrize("k", [2, 3])
def test_integer_scale_never_exceeds_epsilon(eps, k):
    if k > 2 and eps < 2.0**-19:
        pytest.skip("below the multi-class minimum")
    mech = make_mechanism("laplace", epsilon=eps, num_classes=k)
    t = mech.scale_steps
    sens = mech.sensitivity_steps
    # Neighbouring ratio exp(sens / t) <= e^eps, checked in exact rationals...
    assert Fraction(sens, t) <= Fraction(eps)
    # ...and t is the smallest such integer, or one more (scale rounded up).
    assert t <= math.ceil(Fraction(sens) / Fraction(eps)) + 1
    assert sens / t <= eps


def test_laplace_refuses_epsilon_below_the_sampler_minimum():
    with pytest.raises(ConfigError, match=r"epsilon 1e-07 .* >= 9\.5367431640625e-07"):
        make_mechanism("laplace", epsilon=1e-7)
    with pytest.raises(ConfigError, match=r"1\.9073486328125e-06"):
        make_mechanism("laplace", epsilon=1.5e-6, num_classes=4)
    make_mechanism("laplace", epsilon=2.0**-20)


def test_subset_of_ids_gives_subset_of_laplace_values():
    mech = make_mechanism("laplace", epsilon=0.7, num_classes=4)
    y = _labels(4, n=2000)
    ids = np.arange(2000) * 13
    full = draw_noisy_labels(mech, y, ids, KEY).coefficients
    part = np.random.default_rng(1).choice(2000, 100, replace=False)
    sub = draw_noisy_labels(mech, y[part], ids[part], KEY).coefficients
    np.testing.assert_array_equal(sub, full[part])


@settings(max_examples=50, deadline=None)
@given(
    st.integers(min_value=2, max_value=12),
    st.floats(min_value=0.05, max_value=10.0),
    st.sampled_from(["laplace", "discrete"]),
)
def test_coefficient_sum_rules(k, eps, name):
    y = _labels(k, n=200, seed=k)
    c = draw_noisy_labels(
        make_mechanism(name, epsilon=eps, num_classes=k), y, np.arange(200), KEY
    ).coefficients
    assert c.shape == (200, k)
    if name == "discrete" or k == 2:
        np.testing.assert_allclose(c.sum(axis=1), 1.0)
    if name == "discrete":
        assert set(np.unique(c)) <= {0.0, 1.0}


def test_realized_noise_summary():
    mech = make_mechanism("discrete", epsilon=1.0)
    y = _labels(2, n=50_000)
    noisy = draw_noisy_labels(mech, y, np.arange(y.size), KEY)
    summary = realized_noise(y, noisy)
    assert summary["flip_rate"] == pytest.approx(1 / (1 + math.e), abs=0.01)
    assert summary["mean_abs_noise"] == pytest.approx(summary["flip_rate"])


@pytest.mark.parametrize(
    ("labels", "ids", "match"),
    [
        ([0, 2], [0, 1], r"labels must lie in \[0, 2\), got 2"),
        ([0, -1], [0, 1], "got -1"),
        ([0.5, 1.0], [0, 1], "labels must be integers, got 0.5"),
        ([], [], "empty"),
        ([0, 1, 1], [0, 1], "same length, got 2 ids and 3 labels"),
        ([[0, 1]], [0], "1-D"),
        (["a", "b"], [0, 1], "integers"),
    ],
)
def test_bad_labels_and_ids(labels, ids, match):
    mech = make_mechanism("laplace", epsilon=1.0)
    with pytest.raises(ConfigError, match=match):
        draw_noisy_labels(mech, np.array(labels), np.array(ids, dtype=np.int64), KEY)
