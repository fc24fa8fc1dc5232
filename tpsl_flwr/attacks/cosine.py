"""The cosine (direction) attack.

Li et al. 2022, "Label leakage and protection in two-party split learning"
(ICLR 2022, arXiv:2102.08504), Section 3.3: for a binary top model the
cut-layer gradients of the two classes point in opposite directions
(``(sigmoid(z) - y) * dz/de`` changes sign with ``y``), so the cosine
similarity to the gradient of one sample known to be positive separates the
classes almost perfectly, whatever the class balance.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from tpsl_flwr.attacks.signals import as_matrix, reference_vector
from tpsl_flwr.errors import ConfigError


def cosine_scores(gradients: ArrayLike, positive: int | ArrayLike) -> np.ndarray:
    """Cosine similarity to the gradient of a known positive (high means 1).

    Parameters
    ----------
    gradients
        ``(n, d)`` gradients (cosine is scale-free: per-sample or
        batch-averaged gradients give the same scores).
    positive
        Row index of a sample known to have label 1, or its ``(d,)`` gradient
        (for instance from another batch).

    Returns
    -------
    numpy.ndarray
        ``(n,)`` scores in ``[-1, 1]``; a zero gradient scores 0.

    Raises
    ------
    ConfigError
        If the inputs are malformed or the known positive's gradient is zero.

    Examples
    --------
    >>> cosine_scores([[1.0, 0.0], [-2.0, 0.0], [0.0, 3.0]], positive=0)
    array([ 1., -1.,  0.])
    """
    rows = as_matrix(gradients, "gradients")
    reference = reference_vector(positive, rows)
    ref_norm = float(np.linalg.norm(reference))
    if ref_norm == 0.0:
        raise ConfigError("the known positive's gradient is zero: no direction")
    norms = np.linalg.norm(rows, axis=1)
    dots = rows @ (reference / ref_norm)
    out = np.zeros_like(dots)
    np.divide(dots, norms, out=out, where=norms > 0)
    return out
