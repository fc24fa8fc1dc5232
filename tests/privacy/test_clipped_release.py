"""The clipped, debiased reading of a Laplace release: unbiased, less noisy."""

import math

import numpy as np
import pytest

from tpsl_flwr import ConfigError, NoiseKey, make_mechanism
from tpsl_flwr.metrics.auc import binary_auc
from tpsl_flwr.privacy.clipped_release import (
    clip_moments,
    clipped_unbiased,
    clipped_variance,
)
from tpsl_flwr.privacy.closed_forms import sda_auc_laplace
from tpsl_flwr.privacy.mechanisms import LAPLACE_GRID
from tpsl_flwr.privacy.noisy_labels import STREAM_TRANSCRIPT, draw_noisy_labels
from tpsl_flwr.privacy.posterior import unbiased_coefficients

DRAWS = 200_000


def _release(mechanism, label: int, seed: int) -> np.ndarray:
    return draw_noisy_labels(
        mechanism,
        np.full(DRAWS, label, dtype=np.int64),
        np.arange(DRAWS, dtype=np.int64),
        NoiseKey.from_seed(seed),
        STREAM_TRANSCRIPT,
    ).coefficients


@pytest.mark.parametrize(
    ("epsilon", "k"), [(0.5, 2), (1.0, 2), (2.0, 2), (4.0, 2), (1.0, 3)]
)
def test_unbiased_with_the_closed_form_variance_on_the_real_sampler(epsilon, k):
    """200k exact discrete-Laplace draws a label: mean e_y (4 SE), variance (3%)."""
    mechanism = make_mechanism("laplace", epsilon=epsilon, num_classes=k)
    b = mechanism.scale_steps * LAPLACE_GRID
    closed = clipped_variance(b)
    for y in range(k):
        t = unbiased_coefficients(
            mechanism=mechanism, coefficients=_release(mechanism, y, 11 + y)
        )
        se = np.sqrt(closed / DRAWS)
        assert np.all(np.abs(t.mean(axis=0) - np.eye(k)[y]) < 4 * se)
        np.testing.assert_allclose(t.var(axis=0), closed, rtol=0.03)
    # ... and below the unclipped release's 2 b^2 by a third or more
    assert closed < 0.67 * 2 * b * b


def test_two_class_rows_still_sum_to_one():
    mechanism = make_mechanism("laplace", epsilon=1.0)
    release = _release(mechanism, 1, 3)
    t = unbiased_coefficients(mechanism=mechanism, coefficients=release)
    np.testing.assert_allclose(t.sum(axis=1), 1.0, atol=1e-12)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0])
def test_the_clipped_release_is_as_revealing_as_the_release(epsilon):
    """Sufficiency: ranking by t gives the SDA's closed form, as ranking by y~ does.

    The AUC of separating y = 1 from y = 0 by ``t_1`` (ties counted half) over
    2 x 200k draws, against ``1 - (2 + eps) e^-eps / 4``, within 4 standard
    errors (an AUC's SE is at most ``sqrt(1 / (12 n))`` per class size ``n``
    under the null, ~0.001 here; 0.003 allowed).
    """
    mechanism = make_mechanism("laplace", epsilon=epsilon)
    raw = [_release(mechanism, y, 21 + y)[:, 1] for y in (0, 1)]
    scores = np.concatenate(raw)
    labels = np.repeat([0, 1], DRAWS)
    t = clipped_unbiased(np.stack([1 - scores, scores], 1), 1.0 / epsilon)[:, 1]
    expected = sda_auc_laplace(epsilon)
    assert abs(binary_auc(labels, t) - expected) < 0.003
    assert abs(binary_auc(labels, scores) - expected) < 0.003


def test_moments_against_numerical_integration():
    """``m`` and ``w`` against a midpoint rule on the Laplace density (1e-6)."""
    for b in (0.05, 0.3, 1.0, 7.0):
        grid = (np.arange(2_000_000) + 0.5) / 2_000_000  # (0, 1)
        density = np.exp(-grid / b) / (2 * b) / 2_000_000
        tail = 0.5 * math.exp(-1 / b)  # P(U > 1): clipped to 1
        mean = float((grid * density).sum()) + tail
        second = float((grid**2 * density).sum()) + tail
        m, w = clip_moments(b)
        assert m == pytest.approx(mean, abs=1e-6)
        assert w == pytest.approx(second - mean**2, abs=1e-6)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_scales_are_refused_by_name(scale):
    with pytest.raises(ConfigError, match="Laplace scale"):
        clip_moments(scale)


def test_non_finite_coefficients_are_refused_not_clipped():
    from tpsl_flwr import PrivacyError

    with pytest.raises(PrivacyError, match="not finite"):
        clipped_unbiased(np.array([[0.0, np.inf]]), 1.0)
