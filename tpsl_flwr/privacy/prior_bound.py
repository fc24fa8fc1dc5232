"""The AUC ceiling of an attacker who also knows a per-sample prior.

:func:`~tpsl_flwr.privacy.closed_forms.auc_bound` caps the AUC of any attack
on an ``epsilon``-DP label whose only source of label information is the
mechanism's output. A white-box attacker knows more: the top model ``h``, hence
``pi_i = P(y_i = 1 | h(x_i))``, which is learned from *other* samples' noisy
labels and sample ``i``'s features. With ``denoise = "posterior"`` the top model
learns the clean label's probability and every dispatched gradient ``(h(x_i) -
c_i) dh/de`` carries it: still post-processing of the ``epsilon``-DP noisy labels
(the guarantee holds), but across a population its label signal is the
prior's plus the noise's, and e^eps / (1 + e^eps) no longer caps it.

The ceiling for such an attacker: given ``pi_i``, the most informative
``epsilon``-DP view of a binary label is randomized response (it dominates every
other ``epsilon``-DP channel on two inputs, in Blackwell's order), and the best
score is its posterior log-odds ``logit(pi_i) +- epsilon``. Its AUC over the
population, computed exactly here, bounds the AUC of any attack that knows
``pi_i`` and sees an ``epsilon``-DP view of each label, provided ``pi_i`` is
calibrated (a miscalibrated prior mis-weighs the two and understates the
ceiling): :func:`calibrated_log_odds` recalibrates it on the labels first
(Platt scaling), and :func:`prior_aware_ceiling` takes the largest of this, the
prior's own AUC and the plain ceiling. With a constant prior it equals
``auc_bound(epsilon)``.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import expit

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.privacy.closed_forms import auc_bound

__all__ = ["calibrated_log_odds", "prior_aware_auc_bound", "prior_aware_ceiling"]


def prior_aware_auc_bound(
    priors: np.ndarray, labels: np.ndarray, epsilon: float
) -> float:
    """AUC of the best attacker that knows ``priors`` and an ``epsilon``-DP view.

    Parameters
    ----------
    priors
        ``(n,)`` the attacker's ``P(y_i = 1)`` before the mechanism, in (0, 1).
    labels
        ``(n,)`` the true binary labels.
    epsilon
        The labels' privacy budget (``inf``: the ceiling is 1).

    Returns
    -------
    float
        ``P(s_pos > s_neg) + P(s_pos = s_neg) / 2`` over the randomized-response
        scores ``s_i = logit(pi_i) + epsilon * (+1 w.p. e^eps/(1+e^eps) if the
        label is 1, else w.p. 1/(1+e^eps); -1 otherwise)``, exactly (no
        sampling): each sample contributes its two scores with their
        probabilities.

    Examples
    --------
    >>> y = np.array([0, 1, 0, 1])
    >>> round(prior_aware_auc_bound(np.full(4, 0.3), y, 1.0), 4)  # = auc_bound(1)
    0.7311
    >>> round(prior_aware_auc_bound(np.array([.1, .9, .2, .8]), y, 1.0), 4)
    1.0
    """
    pi = np.asarray(priors, dtype=np.float64)
    y = np.asarray(labels)
    if pi.shape != y.shape or pi.ndim != 1:
        raise ConfigError(
            f"priors {pi.shape} and labels {y.shape} must be two (n,) arrays"
        )
    if not np.all((pi > 0) & (pi < 1)):
        raise ConfigError("priors must lie strictly between 0 and 1")
    if not (y == 1).any() or not (y == 0).any():
        raise ConfigError("the prior-aware AUC bound needs both labels")
    return _rr_auc(np.log(pi) - np.log1p(-pi), y, epsilon)


def _rr_auc(base: np.ndarray, y: np.ndarray, epsilon: float) -> float:
    """The exact AUC of ``base +- epsilon`` under randomized response."""
    if math.isinf(epsilon):
        return 1.0
    keep = 1.0 / (1.0 + math.exp(-epsilon))
    pos, neg = base[y == 1], base[y == 0]
    # Each sample: score base + eps with prob (keep if its label agrees), else
    # base - eps.
    pos_scores = np.concatenate((pos + epsilon, pos - epsilon))
    pos_weights = np.concatenate((np.full(pos.size, keep), np.full(pos.size, 1 - keep)))
    neg_scores = np.concatenate((neg + epsilon, neg - epsilon))
    neg_weights = np.concatenate((np.full(neg.size, 1 - keep), np.full(neg.size, keep)))
    order = np.argsort(neg_scores, kind="stable")
    sorted_neg, cumulative = neg_scores[order], np.cumsum(neg_weights[order])
    below = np.searchsorted(sorted_neg, pos_scores, side="left")
    up_to = np.searchsorted(sorted_neg, pos_scores, side="right")
    total = np.concatenate(([0.0], cumulative))
    wins = total[below] + 0.5 * (total[up_to] - total[below])
    return float((pos_weights * wins).sum() / (pos.size * neg.size))


def calibrated_log_odds(priors: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``a logit(pi) + b`` fitted to the labels by logistic regression (Platt).

    A few Newton steps on the two parameters; the result is the log-odds of
    ``P(y = 1 | pi)`` under a logistic model, which is what an attacker who
    knows ``pi`` can learn it means.
    """
    pi = np.clip(np.asarray(priors, dtype=np.float64), 1e-12, 1 - 1e-12)
    y = np.asarray(labels, dtype=np.float64)
    x = np.stack([np.log(pi) - np.log1p(-pi), np.ones_like(pi)], axis=1)
    w = np.array([1.0, 0.0])
    for _ in range(50):
        p = expit(x @ w)
        hessian = (x * (p * (1 - p))[:, None]).T @ x + 1e-9 * np.eye(2)
        step = np.linalg.solve(hessian, x.T @ (y - p))
        w = w + step
        if np.abs(step).max() < 1e-10:
            break
    return np.asarray(x @ w)


def prior_aware_ceiling(
    priors: np.ndarray, labels: np.ndarray, epsilon: float
) -> float:
    """The largest of: the plain ceiling, the prior's AUC, and the calibrated bound.

    An attacker may ignore the prior, ignore the mechanism's output, or combine
    both optimally (:func:`prior_aware_auc_bound` on :func:`calibrated_log_odds`);
    its AUC is at most the largest of the three.
    """
    y = np.asarray(labels)
    combined = _rr_auc(calibrated_log_odds(priors, y), y, epsilon)
    alone = _rr_auc(np.asarray(priors, dtype=np.float64), y, 0.0)
    return max(auc_bound(epsilon), alone, combined)
