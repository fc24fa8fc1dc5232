"""Sampling GradPerturb noise: labels in, noisy coefficient vectors out.

Each mechanism's sampler returns its labels' coefficient vectors ``c`` as
:class:`~tpsl_flwr.privacy.mechanisms.base.NoisyLabels`; this module draws them
with the label party's key. Because the whole transcript is a function of ``c``
alone (all mechanisms but the Gaussian baseline), reusing one
``c`` per sample across epochs keeps the run ``(epsilon, 0)``-DP (Yang et al.,
Section 6). The draws come from :class:`~tpsl_flwr.privacy.keyed_noise.NoiseKey`, so
"reuse" needs no storage.

Floating-point safety (Mironov, "On significance of the least significant bits
for differential privacy", CCS 2012): textbook Laplace sampling
``-b sign(U) ln(1 - 2|U|)`` yields a porous set of doubles whose holes depend
on the input, which breaks DP. Here the Laplace noise is the *discrete*
Laplace law on the grid ``LAPLACE_GRID * Z``, ``P(u = m L) ~ exp(-|m| / t)``,
drawn EXACTLY (:mod:`tpsl_flwr.privacy.exact_laplace`): ``m = G1 - G2`` for two
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
:class:`~tpsl_flwr.privacy.mechanisms.LaplacePerturb`. What remains approximate: the
realized scale is ``t L >= b`` (slightly more noise than nominal); randomized
response compares raw 64-bit words with exact integer thresholds whose
realized epsilon is never above the nominal one (see :func:`rr_thresholds`);
the Gaussian baseline claims
no pure DP and uses plain inverse-CDF sampling. The randomness is AES as a PRF
(computational, as before).
"""

from __future__ import annotations

import numpy as np

from tpsl_flwr._util.checks import check_labels, check_sample_ids
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import LAPLACE_GRID, Mechanism
from tpsl_flwr.privacy.mechanisms.base import NoisyLabels, one_hot

__all__ = [
    "LAPLACE_GRID",
    "STREAM_CUT_GAUSSIAN",
    "STREAM_TOP_UPDATE",
    "STREAM_TRANSCRIPT",
    "NoisyLabels",
    "draw_noisy_labels",
    "one_hot",
    "realized_noise",
]

STREAM_TRANSCRIPT = 1
"""Stream of the noise behind the gradients sent to the non-label parties."""
STREAM_TOP_UPDATE = 2
"""Stream of the separate top-model noise of the cut-layer placement."""
STREAM_CUT_GAUSSIAN = 3
"""Stream of the Gaussian baseline's noise at the cut layer."""


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
        The mechanism; its own ``sample`` method draws the noise
        (:class:`~tpsl_flwr.privacy.mechanisms.base.Mechanism`).
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
    y = check_labels(labels, mechanism.num_classes)
    ids = check_sample_ids(sample_ids, expected_length=y.size)
    return mechanism.sample(y, ids, key, stream, additive_dim)


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
