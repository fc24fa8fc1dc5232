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
on the input, which breaks DP. Here the Laplace noise is the *discrete*
Laplace law on the grid ``LAPLACE_GRID * Z``, ``P(u = m L) ~ exp(-|m| / t)``,
drawn EXACTLY (:mod:`tpsl_flwr.exact_laplace`): ``m = G1 - G2`` for two
geometrics, each decided from the keyed words by a ``float64`` filter with a
rigorous error bound, or, for the rare lanes the filter cannot decide, by
exact integer comparisons that read further words. Floats only choose the
route; the law of ``m`` is exact. The scale ``t`` is an integer number of grid
steps, ``t = ceil(2^20 / epsilon)`` (binary) or ``ceil(2^21 / epsilon)``
(multi-class, l1 shift 2), so neighbouring labels differ by at most
``exp(2^20 / t) <= e^epsilon`` (resp. ``exp(2^21 / t)``): rounding ``t`` up
only adds noise. Every value is a whole number of grid steps and every sum
``y + u`` is exact in float64. Coefficients are clamped to ``+-2^31`` (a
post-processing, so still ``(epsilon, 0)``-DP; reached with probability below
``exp(-2^11)``). Epsilons needing ``t > 2^40`` are refused by
:class:`~tpsl_flwr.mechanisms.LaplacePerturb`. What remains approximate: the
realized scale is ``t L >= b`` (slightly more noise than nominal); randomized
response compares raw 64-bit words with integer thresholds rounded in the
safe direction (see :func:`rr_flip_threshold`); the Gaussian baseline claims
no pure DP and uses plain inverse-CDF sampling. The randomness is AES as a PRF
(computational, as before).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.exact_laplace import discrete_laplace_steps
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
_CLAMP_STEPS = 2**51
"""Coefficients are clamped to ``+-2^51`` grid steps (``+-2^31``): exact doubles."""


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
    one = 1 << LaplacePerturb.GRID_BITS
    width = 1 if mech.is_binary else k
    steps = discrete_laplace_steps(key, ids, stream, mech.scale_steps, width)
    if mech.is_binary:
        t = y * one + steps[:, 0] * (1 - 2 * y)
        steps = np.stack([one - t, t], axis=1)
    else:
        steps = steps + one * one_hot(y, k).astype(np.int64)
    clamped = np.clip(steps, -_CLAMP_STEPS, _CLAMP_STEPS)
    return clamped.astype(np.float64) * LAPLACE_GRID


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
