"""The randomized labels of a batch: what every mechanism's sampler returns.

All mechanisms but the Gaussian baseline are label randomizers: they map the
label ``y`` to a coefficient vector ``c`` over the ``k`` classes and
GradPerturb outputs ``sum_j c_j g_j`` (Yang et al., Algorithms 2 and 4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["NoisyLabels", "one_hot"]


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
