"""The spectral attack.

Tran, Li and Madry 2018, "Spectral signatures in backdoor attacks" (NeurIPS
2018): two sub-populations that differ in their mean separate along the top
singular vector of the centered data. Sun et al. 2021, "Defending against
label leakage in vertical federated learning" (arXiv:2112.05409), apply this
to split learning: the cut-layer gradients of a batch, centered and projected
on their top singular vector, split the two labels.

The projection tells the two groups apart but not which one is label 1. Two
ways to orient it:

* **by cluster size (default, no label needed):** the projections are split
  into two clusters with the exact one-dimensional 2-means (the threshold that
  minimises the within-cluster sum of squares), and the *smaller* cluster is
  taken as label 1. This is right when positives are the minority, as in
  click-through-rate data, and a coin flip on balanced data;
* **by one known positive:** the sign that gives the known positive a
  positive score (the cosine attack's assumption). The size rule is the
  fallback when the known positive projects exactly on the centre. Under
  label DP this is brittle: the known positive's own gradient is perturbed,
  and when its label was effectively flipped the whole orientation is wrong.

A batch of a few dozen samples holds too few positives for the size rule to
be reliable under heavy-tailed (Laplace) noise; :func:`spectral_direction` of
a whole epoch, passed as ``direction``, orients each batch instead.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from tpsl_flwr.attacks.signals import as_matrix, reference_vector
from tpsl_flwr.errors import ConfigError


def top_singular_vector(centered: np.ndarray) -> np.ndarray:
    """The top right singular vector, its largest component made positive.

    Parameters
    ----------
    centered
        ``(n, d)`` centered rows.

    Returns
    -------
    numpy.ndarray
        A unit ``(d,)`` vector, deterministic in sign (as scikit-learn's
        ``svd_flip``); zero if every row is zero.
    """
    if not np.any(centered):
        return np.zeros(centered.shape[1])
    # The top right singular vector of X is the top eigenvector of X^T X: a
    # (d, d) problem, much cheaper than the SVD of a tall (n, d) batch.
    _, vectors = np.linalg.eigh(centered.T @ centered)
    top = vectors[:, -1]
    return top if top[np.argmax(np.abs(top))] >= 0 else -top


def smaller_cluster_is_low(projection: np.ndarray) -> bool | None:
    """Whether the smaller of the two 1-D 2-means clusters is the low side.

    Parameters
    ----------
    projection
        ``(n,)`` values.

    Returns
    -------
    bool or None
        ``True`` if the cluster below the optimal threshold is the smaller,
        ``False`` if the one above is, ``None`` if they are equal in size or
        all values are equal.

    Examples
    --------
    >>> smaller_cluster_is_low(np.array([-5.0, 0.0, 0.1, 0.2]))
    True
    """
    values = np.sort(np.asarray(projection, dtype=np.float64))
    n = values.size
    sizes = np.arange(1, n)
    if sizes.size == 0:
        return None
    prefix = np.cumsum(values)[:-1]
    total = values.sum()
    # Between-cluster term of the split after each position; maximising it
    # minimises the within-cluster sum of squares.
    between = prefix**2 / sizes + (total - prefix) ** 2 / (n - sizes)
    between[values[1:] <= values[:-1]] = -np.inf  # split only between distinct values
    if not np.isfinite(between).any():
        return None
    low = int(sizes[np.argmax(between)])
    if 2 * low == n:
        return None
    return 2 * low < n


def _oriented(
    rows: np.ndarray, positive: int | ArrayLike | None, direction: ArrayLike | None
) -> tuple[np.ndarray, np.ndarray]:
    if positive is not None and direction is not None:
        raise ConfigError("give a known positive or a direction, not both")
    reference = None if positive is None else reference_vector(positive, rows)
    guide = (
        None if direction is None else reference_vector(direction, rows, "direction")
    )
    mean = rows.mean(axis=0)
    top = top_singular_vector(rows - mean)
    sign = 0.0
    if reference is not None:
        sign = float(np.sign((reference - mean) @ top))
    elif guide is not None:
        sign = float(np.sign(guide @ top))
    if sign == 0.0:
        sign = -1.0 if smaller_cluster_is_low((rows - mean) @ top) else 1.0
    return mean, sign * top


def spectral_direction(
    gradients: ArrayLike, positive: int | ArrayLike | None = None
) -> np.ndarray:
    """The top singular direction of the centered gradients, oriented to label 1.

    Parameters
    ----------
    gradients
        ``(n, d)`` gradients (at least 2 rows), e.g. a whole epoch's.
    positive
        As in :func:`spectral_scores`: ``None`` orients by cluster size.

    Returns
    -------
    numpy.ndarray
        A unit ``(d,)`` vector along which label 1 scores high; pass it as
        ``direction`` to orient :func:`spectral_scores` on single batches.

    Raises
    ------
    ConfigError
        If the inputs are malformed.
    """
    rows = as_matrix(gradients, "gradients", min_rows=2)
    return _oriented(rows, positive, None)[1]


def spectral_scores(
    gradients: ArrayLike,
    positive: int | ArrayLike | None = None,
    *,
    direction: ArrayLike | None = None,
) -> np.ndarray:
    """Projection of the centered gradients on their top singular vector.

    Parameters
    ----------
    gradients
        ``(n, d)`` gradients of one batch (or of any set of samples; the
        scores are in the units of the input, so pass per-sample gradients
        when pooling batches of different sizes).
    positive
        ``None`` (default) orients the scores by cluster size: the smaller
        cluster scores high. Otherwise a row index of a sample known to have
        label 1, or its ``(d,)`` gradient, which is made to score above the
        batch mean.
    direction
        Instead of ``positive``: a ``(d,)`` vector (e.g.
        :func:`spectral_direction` of the whole epoch) the batch's own top
        singular vector is signed to agree with; no label needed.

    Returns
    -------
    numpy.ndarray
        ``(n,)`` scores, high means label 1.

    Raises
    ------
    ConfigError
        If the inputs are malformed, there are fewer than 2 samples, or both
        ``positive`` and ``direction`` are given.

    Examples
    --------
    >>> g = np.array([[-1.0, 0.0], [0.1, 0.0], [0.2, 0.0], [0.1, 0.0]])
    >>> int(np.argmax(spectral_scores(g)))
    0
    """
    rows = as_matrix(gradients, "gradients", min_rows=2)
    mean, top = _oriented(rows, positive, direction)
    return (rows - mean) @ top
