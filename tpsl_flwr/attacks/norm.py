"""The norm attack.

Li et al. 2022, "Label leakage and protection in two-party split learning"
(ICLR 2022, arXiv:2102.08504), Section 3.2: with a sigmoid/BCE top layer the
logit gradient is ``sigmoid(z) - y``, whose magnitude is close to 1 for a
misclassified sample and small for a well-classified one. In class-imbalanced
data (CTR) the model scores the rare positives low early in training, so
positives receive larger gradients, and the per-sample l2 norm of the
cut-layer gradient alone ranks them above the negatives.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from tpsl_flwr.attacks.signals import as_matrix


def norm_scores(gradients: ArrayLike) -> np.ndarray:
    """Per-sample gradient l2 norm (high means label 1).

    Parameters
    ----------
    gradients
        ``(n, d)`` per-sample gradients (see
        :func:`~tpsl_flwr.attacks.signals.per_sample_gradients`; within one
        batch the batch-averaged ones rank the same).

    Returns
    -------
    numpy.ndarray
        ``(n,)`` scores.

    Raises
    ------
    ConfigError
        If ``gradients`` is not a finite 1-D or 2-D array.

    Examples
    --------
    >>> norm_scores([[3.0, 4.0], [0.0, -1.0]])
    array([5., 1.])
    """
    return np.linalg.norm(as_matrix(gradients, "gradients"), axis=1)
