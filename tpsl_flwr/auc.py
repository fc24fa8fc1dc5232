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
    order = np.argsort(s, kind="stable")
    sorted_scores = s[order]
    first = np.r_[True, sorted_scores[1:] != sorted_scores[:-1]]
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], s.size]
    ranks = np.empty(s.size)
    ranks[order] = ((starts + ends + 1) / 2.0)[np.cumsum(first) - 1]
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


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
