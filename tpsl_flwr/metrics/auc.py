"""The one ROC AUC of the project, and its standard error.

Test utility at the label party, attack AUCs, the mechanism audit and the
Bayes AUC of synthetic data all use :func:`binary_auc`: the Mann-Whitney
statistic with ties counted one half, equal to
``sklearn.metrics.roc_auc_score`` (a test checks it) but numpy-only, so the
data layer and a node's process never import scikit-learn's metrics.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["auc_standard_error", "binary_auc"]


def binary_auc(labels: ArrayLike, scores: ArrayLike) -> float:
    """ROC AUC of ``scores`` for 0/1 ``labels`` (ties averaged); NaN for one class.

    Parameters
    ----------
    labels
        ``(n,)`` labels in ``{0, 1}``.
    scores
        ``(n,)`` real scores, larger meaning "more likely 1".

    Returns
    -------
    float
        The probability that a random positive outscores a random negative,
        ties counting one half; NaN if only one class is present.

    Examples
    --------
    >>> binary_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8]))
    0.75
    """
    y = np.asarray(labels)
    s = np.asarray(scores, dtype=np.float64)
    pos = y == 1
    n_pos = int(pos.sum())
    n_neg = s.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((_rank_sum(s, pos) - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def _rank_sum(scores: np.ndarray, selected: np.ndarray) -> float:
    """Sum of the mid-ranks (1-based, ties averaged) of ``scores[selected]``.

    Each temporary is freed as soon as it is used and the tie groups' mid-ranks
    are built in place, so at most about five ``n``-value arrays are alive at
    once (the test set grows with the rows, issue 22). The ranks and their
    summation order are those of ``ranks[selected].sum()`` over the full rank
    vector, so the AUC is bitwise the same as building it whole.
    """
    n = scores.size
    order = np.argsort(scores, kind="stable")
    first = np.empty(n, dtype=bool)  # first of its tie group, in sorted order
    first[0] = True
    sorted_scores = scores[order]
    np.not_equal(sorted_scores[1:], sorted_scores[:-1], out=first[1:])
    del sorted_scores
    group = np.cumsum(first)
    group -= 1
    starts = np.flatnonzero(first)
    del first
    mid = np.empty(starts.size)  # (start + end + 1) / 2, exact in float64
    mid[:-1] = starts[1:]
    mid[-1] = n
    mid += starts
    del starts
    mid += 1
    mid /= 2.0
    ranks_sorted = mid[group]
    del mid, group
    ranks = np.empty(n)
    ranks[order] = ranks_sorted
    del order, ranks_sorted
    return float(ranks[selected].sum())


def auc_standard_error(auc: float, n_pos: int, n_neg: int) -> float:
    """Hanley and McNeil (1982) standard error of an AUC over ``n_pos + n_neg``.

    Examples
    --------
    >>> round(auc_standard_error(0.75, 100, 900), 4)
    0.0291
    """
    q1 = auc / (2.0 - auc)
    q2 = 2.0 * auc**2 / (1.0 + auc)
    var = (
        auc * (1 - auc) + (n_pos - 1) * (q1 - auc**2) + (n_neg - 1) * (q2 - auc**2)
    ) / (n_pos * n_neg)
    return math.sqrt(max(var, 0.0))
