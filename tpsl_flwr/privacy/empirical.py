"""Empirical lower bounds on epsilon from an attack's outcomes.

A distinguishing test ``S`` on the mechanism's output gives, for an
``epsilon``-DP mechanism, ``P(S | y=1) <= e^eps P(S | y=0)``. With
Clopper-Pearson bounds on both rates, ``ln(TPR_low / FPR_high)`` is a
high-confidence lower bound on the epsilon actually achieved (Jagielski et al.,
"Auditing differentially private machine learning", NeurIPS 2020). The test's
threshold is chosen on one half of the samples and evaluated on the other, so
the choice does not bias the bound.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from tpsl_flwr.errors import ConfigError


def clopper_pearson(
    successes: np.ndarray, trials: np.ndarray, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided ``1 - alpha`` Clopper-Pearson interval for binomial rates.

    Examples
    --------
    >>> low, high = clopper_pearson(np.array([50]), np.array([100]), 0.05)
    >>> round(float(low[0]), 3), round(float(high[0]), 3)
    (0.398, 0.602)
    """
    x = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        low = np.where(x > 0, stats.beta.ppf(alpha / 2, x, n - x + 1), 0.0)
        high = np.where(x < n, stats.beta.ppf(1 - alpha / 2, x + 1, n - x), 1.0)
    return low, high


def _test_counts(
    scores: np.ndarray, positive: np.ndarray, thresholds: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Hit counts of the tests ``s > t`` (first half) and ``s <= t`` (second)."""
    pos = np.sort(scores[positive])
    neg = np.sort(scores[~positive])
    above_pos = pos.size - np.searchsorted(pos, thresholds, side="right")
    above_neg = neg.size - np.searchsorted(neg, thresholds, side="right")
    # "s > t" favours label 1; "s <= t" favours label 0 (roles swapped).
    hits_for = np.concatenate([above_pos, neg.size - above_neg])
    hits_against = np.concatenate([above_neg, pos.size - above_pos])
    return hits_for, hits_against, pos.size, neg.size


def epsilon_lower_bound(
    scores: np.ndarray,
    labels: np.ndarray,
    confidence: float = 0.95,
    seed: int = 0,
    num_thresholds: int = 256,
) -> float:
    """A ``confidence``-level lower bound on epsilon from binary attack scores.

    Parameters
    ----------
    scores
        ``(n,)`` attack scores, high meaning label 1.
    labels
        ``(n,)`` true labels in ``{0, 1}``.
    confidence
        Confidence of the bound (e.g. 0.95).
    seed
        Seed of the random split into selection and evaluation halves.
    num_thresholds
        Number of candidate thresholds (quantiles of the scores).

    Returns
    -------
    float
        The bound (0 when the attack shows no leakage).
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels).astype(bool)
    if s.shape != y.shape or s.ndim != 1:
        raise ConfigError(
            f"scores and labels must be equal 1-D arrays, got {s.shape}, {y.shape}"
        )
    if not 0.0 < confidence < 1.0:
        raise ConfigError(f"confidence must be in (0, 1), got {confidence}")
    order = np.random.default_rng(seed).permutation(s.size)
    select, evaluate = order[: s.size // 2], order[s.size // 2 :]
    if (
        min(
            y[select].sum(), (~y[select]).sum(), y[evaluate].sum(), (~y[evaluate]).sum()
        )
        == 0
    ):
        raise ConfigError("both labels must occur in both halves of the audit sample")
    alpha = 1.0 - confidence
    thresholds = np.unique(
        np.quantile(s[select], np.linspace(0.0, 1.0, num_thresholds))
    )
    # Pick the test on the selection half, by its own lower bound.
    hits_for, hits_against, n_for, n_against = _test_counts(
        s[select], y[select], thresholds
    )
    n_pos = np.concatenate(
        [np.full(thresholds.size, n_for), np.full(thresholds.size, n_against)]
    )
    n_neg = np.concatenate(
        [np.full(thresholds.size, n_against), np.full(thresholds.size, n_for)]
    )
    bounds = _log_ratio_lower_vec(hits_for, n_pos, hits_against, n_neg, alpha)
    best = int(np.argmax(bounds))
    # Evaluate that one test on the held-out half.
    hits_for, hits_against, n_for, n_against = _test_counts(
        s[evaluate], y[evaluate], thresholds
    )
    n_pos = np.concatenate(
        [np.full(thresholds.size, n_for), np.full(thresholds.size, n_against)]
    )
    n_neg = np.concatenate(
        [np.full(thresholds.size, n_against), np.full(thresholds.size, n_for)]
    )
    held_out = _log_ratio_lower_vec(
        hits_for[best : best + 1],
        n_pos[best : best + 1],
        hits_against[best : best + 1],
        n_neg[best : best + 1],
        alpha,
    )
    value = float(held_out[0])
    return max(0.0, value) if math.isfinite(value) else 0.0


def _log_ratio_lower_vec(
    hit_pos: np.ndarray,
    n_pos: np.ndarray,
    hit_neg: np.ndarray,
    n_neg: np.ndarray,
    alpha: float,
) -> np.ndarray:
    # Each two-sided interval leaves alpha / 2 on the side used, so the bound
    # holds with probability >= 1 - alpha (Bonferroni over the two rates).
    pos_low, _ = clopper_pearson(hit_pos, n_pos, alpha)
    _, neg_high = clopper_pearson(hit_neg, n_neg, alpha)
    return np.log(np.maximum(pos_low, 1e-300)) - np.log(np.maximum(neg_high, 1e-300))
