"""Sampling GradPerturb noise: labels in, noisy coefficient vectors out.

All mechanisms but the Gaussian baseline are label randomizers: they map the
label ``y`` to a coefficient vector ``c`` over the ``k`` classes and
GradPerturb outputs ``sum_j c_j g_j`` (see :mod:`tpsl_flwr.mechanisms`).
Because the whole transcript is then a function of ``c`` alone, reusing one
``c`` per sample across epochs keeps the run ``(epsilon, 0)``-DP (Yang et al.,
Section 6). The draws come from :class:`~tpsl_flwr.keyed_noise.NoiseKey`, so
"reuse" needs no storage.

Floating-point safety (Mironov, "On significance of the least significant bits
for differential privacy", CCS 2012): textbook Laplace sampling
``-b sign(U) ln(1 - 2|U|)`` yields a porous set of doubles whose holes depend
on the input, which breaks DP. Here the Laplace noise is instead the *discrete*
Laplace distribution on the grid ``LAPLACE_GRID * Z`` (the difference of two
geometric variables, Canonne, Kamath and Steinke 2020): ``P(u = m L) ~
exp(-|m| L / b)``. The label shift (1, or 2 in l1 for multi-class) is a whole
number of grid steps and every sum ``y + u`` is exact in float64, so both
neighbouring labels have the same support and the density ratio is at most
``e^epsilon`` exactly. What remains approximate: the geometric draws use the
inverse CDF with 53-bit uniforms, so each grid probability is exact up to a
relative error of about ``2^-50`` and the tail beyond ``36.7 b`` (probability
``2^-53``) is cut. Randomized response compares raw 64-bit words with integer
thresholds rounded in the safe direction (flip probability never below the
nominal one; see :func:`rr_flip_threshold`). The Gaussian baseline claims no
pure DP and uses plain inverse-CDF sampling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.keyed_noise import NoiseKey, open_uniforms, uniforms53
from tpsl_flwr.mechanisms import (
    GaussianPerturb,
    LaplacePerturb,
    Mechanism,
    NoProtection,
    RandomizedResponse,
)
from tpsl_flwr.validation import check_labels, check_sample_ids

LAPLACE_GRID = 2.0**-20
"""Resolution of the discrete Laplace noise (a power of two)."""

STREAM_TRANSCRIPT = 1
"""Stream of the noise behind the gradients sent to the non-label parties."""
STREAM_TOP_UPDATE = 2
"""Stream of the separate top-model noise of the cut-layer placement."""
STREAM_CUT_GAUSSIAN = 3
"""Stream of the Gaussian baseline's noise at the cut layer."""

_TWO_POW_64 = 2**64


@dataclass(frozen=True)
class NoisyLabels:
    """The randomized labels of one batch.

    Attributes
    ----------
    coefficients
        ``(n, k)`` float64: GradPerturb's output is ``sum_j c_ij g_ij``.
    additive
        ``(n, m)`` float64 Gaussian noise added to ``g_y`` (Gaussian baseline
        only, in per-sample gradient units), else ``None``.
    """

    coefficients: np.ndarray
    additive: np.ndarray | None = None


def one_hot(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Return the ``(n, k)`` float64 one-hot encoding of ``labels``."""
    out = np.zeros((labels.size, num_classes), dtype=np.float64)
    out[np.arange(labels.size), labels] = 1.0
    return out


def draw_noisy_labels(
    mechanism: Mechanism,
    labels: object,
    sample_ids: object,
    key: NoiseKey,
    stream: int = STREAM_TRANSCRIPT,
    additive_dim: int | None = None,
) -> NoisyLabels:
    """Randomize a batch of labels with the mechanism's keyed noise.

    Parameters
    ----------
    mechanism
        The mechanism description.
    labels
        ``(n,)`` integer labels in ``[0, k)``.
    sample_ids
        ``(n,)`` sample ids; the same id always gets the same noise.
    key
        The label party's secret noise key.
    stream
        Which independent noise stream to use.
    additive_dim
        Width of the Gaussian baseline's noise vector (the number of logits,
        or the cut-layer width); ignored by the other mechanisms.

    Returns
    -------
    NoisyLabels
        The coefficient vectors (and the Gaussian noise, if any).

    Raises
    ------
    ConfigError
        For labels outside ``[0, k)``, empty batches or ids and labels of
        different lengths.
    """
    k = mechanism.num_classes
    y = check_labels(labels, k)
    ids = check_sample_ids(sample_ids, expected_length=y.size)
    if isinstance(mechanism, NoProtection):
        return NoisyLabels(one_hot(y, k))
    if isinstance(mechanism, LaplacePerturb):
        return NoisyLabels(_laplace_coefficients(mechanism, y, ids, key, stream))
    if isinstance(mechanism, RandomizedResponse):
        return NoisyLabels(_rr_coefficients(mechanism, y, ids, key, stream))
    if isinstance(mechanism, GaussianPerturb):
        width = (
            (1 if mechanism.is_binary else k) if additive_dim is None else additive_dim
        )
        if width < 1:
            raise ConfigError(f"additive_dim must be >= 1, got {width}")
        normals = ndtri(open_uniforms(key.words(ids, stream, width)))
        return NoisyLabels(one_hot(y, k), mechanism.sigma * normals)
    raise ConfigError(f"no sampler for mechanism {mechanism!r}")


def discrete_laplace(
    words_a: np.ndarray, words_b: np.ndarray, scale: float
) -> np.ndarray:
    """Discrete Laplace noise on the grid ``LAPLACE_GRID * Z`` from random words.

    ``P(u = m L) ~ exp(-|m| L / scale)``: the difference of two geometric
    variables, each ``floor(E * scale / L)`` for an exponential ``E``.

    Parameters
    ----------
    words_a, words_b
        Independent 64-bit random words of equal shape.
    scale
        The Laplace scale ``b``.

    Returns
    -------
    numpy.ndarray
        float64 noise, every value an exact multiple of ``LAPLACE_GRID``.
    """
    steps = scale / LAPLACE_GRID
    exp_a = -np.log1p(-uniforms53(words_a))
    exp_b = -np.log1p(-uniforms53(words_b))
    return (np.floor(exp_a * steps) - np.floor(exp_b * steps)) * LAPLACE_GRID


def rr_flip_threshold(flip_probability: float) -> int:
    """Integer threshold ``T``: a 64-bit word ``w`` flips the label iff ``w < T``.

    ``T = ceil(p 2^64)`` so the realized flip probability ``T / 2^64`` is never
    below ``p`` and the realized epsilon never above the nominal one.
    """
    return min(math.ceil(flip_probability * _TWO_POW_64), _TWO_POW_64 - 1)


def rr_keep_threshold(keep_probability: float) -> int:
    """Integer threshold ``T``: a word ``w`` keeps the label iff ``w < T``.

    ``T = floor(q 2^64)``: the realized keep probability is never above ``q``.
    """
    return math.floor(keep_probability * _TWO_POW_64)


def _laplace_coefficients(
    mech: LaplacePerturb, y: np.ndarray, ids: np.ndarray, key: NoiseKey, stream: int
) -> np.ndarray:
    k = mech.num_classes
    if mech.is_binary:
        words = key.words(ids, stream, 2)
        u = discrete_laplace(words[:, 0], words[:, 1], mech.scale)
        t = y + u * (1 - 2 * y)
        return np.stack([1.0 - t, t], axis=1)
    words = key.words(ids, stream, 2 * k)
    noise = discrete_laplace(words[:, :k], words[:, k:], mech.scale)
    return one_hot(y, k) + noise


def _rr_coefficients(
    mech: RandomizedResponse, y: np.ndarray, ids: np.ndarray, key: NoiseKey, stream: int
) -> np.ndarray:
    k = mech.num_classes
    if mech.is_binary:
        word = key.words(ids, stream, 1)[:, 0]
        flip = word < np.uint64(rr_flip_threshold(mech.flip_probability))
        return one_hot(np.where(flip, 1 - y, y), k)
    words = key.words(ids, stream, 2)
    keep = words[:, 0] < np.uint64(rr_keep_threshold(mech.keep_probability))
    other = np.floor(uniforms53(words[:, 1]) * (k - 1)).astype(np.int64)
    other = other + (other >= y)
    return one_hot(np.where(keep, y, other), k)


def realized_noise(labels: np.ndarray, noisy: NoisyLabels) -> dict[str, float]:
    """Summarize the noise actually drawn for a set of labels.

    Returns
    -------
    dict
        ``flip_rate``: fraction of samples whose noisy coefficients point at
        another label (``argmax c != y``; for the Gaussian baseline, whose
        noise is additive, 0); ``mean_abs_noise``: mean absolute deviation of
        ``c`` from ``e_y`` per coordinate that moved (``|u|`` for binary
        Laplace), or of the additive noise.
    """
    y = np.asarray(labels, dtype=np.int64)
    if noisy.additive is not None:
        return {
            "flip_rate": 0.0,
            "mean_abs_noise": float(np.abs(noisy.additive).mean()),
        }
    c = noisy.coefficients
    deviation = c - one_hot(y, c.shape[1])
    flip_rate = float(np.mean(np.argmax(c, axis=1) != y))
    if c.shape[1] == 2:
        mean_abs = float(np.abs(deviation[:, 1]).mean())
    else:
        mean_abs = float(np.abs(deviation).mean())
    return {"flip_rate": flip_rate, "mean_abs_noise": mean_abs}
