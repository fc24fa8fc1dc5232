"""The columns and the ground-truth logit of the synthetic CTR table.

Helpers of :func:`~tpsl_flwr.data.synthetic.make_synthetic_ctr`: heavy-tailed
numeric columns, Zipf-like categorical columns, and the feature part of the true
logit. Each draws from the generator it is given, in the order the generator
calls them, so the table is the same bit for bit.

The ground-truth logit is ``s(x) = f(x) + b`` with the feature part

    f(x) = sum_j w_j u_j + sum_j e_j[c_j] + w u_0 u_1 + T[c_0, c_1]

``u_j`` the numeric columns winsorized at 4 population standard deviations and
rescaled to population mean 0 and variance 1 (so an extreme feature value moves
the logit by a bounded amount, as after the log transform CTR pipelines apply),
``e_j`` per-category effects, one numeric-numeric and one
categorical-categorical pairwise interaction (``T`` double-centred under the
category frequencies, so a main-effects model cannot represent it). Every term has
population mean zero and the terms are uncorrelated; each is scaled to a fixed
share of the variance so that ``f`` has population standard deviation
``logit_sd`` for every seed, which keeps the Bayes AUC stable across seeds. The
intercept ``b`` is solved by :mod:`~tpsl_flwr.data.synthetic`.

Examples
--------
>>> pmf = zipf_pmf(4, 1.0)
>>> round(float(pmf.sum()), 12), bool((pmf[:-1] > pmf[1:]).all())
(1.0, True)
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "categorical_columns",
    "feature_logit",
    "numeric_columns",
    "zipf_pmf",
]

_T_DF = 3.0
"""Degrees of freedom of the Student-t numeric columns (finite variance, heavy)."""
_LOGNORMAL_SIGMA = 1.0
"""Log-scale standard deviation of the log-normal numeric columns."""
_CLIP = 4.0
"""The logit sees numeric columns winsorized at this many population sds."""
_T_CLIPPED_SD = 0.8904464171699242
"""Population sd of a standardized t(3) variable clipped to [-4, 4] (mean 0)."""
_LOGNORMAL_CLIPPED_MEAN = -0.02283369993224158
_LOGNORMAL_CLIPPED_SD = 0.8200780113886685
"""Population mean and sd of a standardized log-normal(0, 1) clipped to [-4, 4].

The three constants were computed by numerical integration with scipy; a test
recomputes them.
"""
_VARIANCE_SHARES = {
    "numeric": 0.35,
    "categorical": 0.35,
    "num_pair": 0.15,
    "cat_pair": 0.15,
}
"""Share of the feature logit's variance each term carries (renormalized over the
terms a table has)."""


def numeric_columns(
    rng: np.random.Generator, rows: int, num_numeric: int
) -> tuple[np.ndarray, np.ndarray]:
    """Heavy-tailed raw columns, and the winsorized unit-variance version ``u``.

    ``z`` is a column scaled by its population mean and sd, clipped to
    ``[-_CLIP, _CLIP]``, then centred and scaled again by the clipped variable's
    population moments, so every ``u_j`` has mean 0 and variance 1 exactly.
    """
    n_t = (num_numeric + 1) // 2
    heavy = rng.standard_t(_T_DF, size=(rows, n_t))
    skewed = np.exp(_LOGNORMAL_SIGMA * rng.standard_normal((rows, num_numeric - n_t)))
    numeric = np.empty((rows, num_numeric), dtype=np.float64)
    numeric[:, 0::2] = heavy
    numeric[:, 1::2] = skewed
    s2 = _LOGNORMAL_SIGMA**2
    mean = np.zeros(num_numeric)
    sd = np.full(num_numeric, math.sqrt(_T_DF / (_T_DF - 2.0)))
    mean[1::2] = math.exp(s2 / 2.0)
    sd[1::2] = math.sqrt((math.exp(s2) - 1.0) * math.exp(s2))
    clipped_mean = np.zeros(num_numeric)
    clipped_sd = np.full(num_numeric, _T_CLIPPED_SD)
    clipped_mean[1::2] = _LOGNORMAL_CLIPPED_MEAN
    clipped_sd[1::2] = _LOGNORMAL_CLIPPED_SD
    z = np.clip((numeric - mean) / sd, -_CLIP, _CLIP)
    return numeric, (z - clipped_mean) / clipped_sd


def zipf_pmf(card: int, exponent: float) -> np.ndarray:
    """Category frequencies ``P(v) ~ (v + 1)^-exponent`` for ``v < card``."""
    weights = np.arange(1, card + 1, dtype=np.float64) ** -exponent
    return weights / weights.sum()


def categorical_columns(
    rng: np.random.Generator, rows: int, pmfs: list[np.ndarray]
) -> np.ndarray:
    """Codes drawn from ``pmfs`` by inverse-CDF lookup (one pass a column)."""
    u = rng.random((len(pmfs), rows))
    out = np.empty((rows, len(pmfs)), dtype=np.int64)
    for j, pmf in enumerate(pmfs):
        cdf = np.cumsum(pmf)
        out[:, j] = np.minimum(np.searchsorted(cdf, u[j], side="right"), pmf.size - 1)
    return out


def feature_logit(
    rng: np.random.Generator,
    u: np.ndarray,
    categorical: np.ndarray,
    pmfs: list[np.ndarray],
    logit_sd: float,
) -> np.ndarray:
    """The feature part ``f(x)`` of the logit, with population sd ``logit_sd``.

    Each term is built with population mean zero and its exact population
    variance, then scaled to its share of ``logit_sd**2``.
    """
    rows, num_numeric = u.shape
    terms: dict[str, tuple[np.ndarray, float]] = {}
    if num_numeric:
        w = rng.standard_normal((num_numeric,))
        terms["numeric"] = (u @ w, float(w @ w))
    if pmfs:
        cards = np.array([p.size for p in pmfs])
        effects = [rng.standard_normal((p.size,)) for p in pmfs]
        effects = [e - p @ e for e, p in zip(effects, pmfs, strict=True)]
        var = sum(float(p @ e**2) for e, p in zip(effects, pmfs, strict=True))
        offsets = np.concatenate(([0], np.cumsum(cards)[:-1]))
        flat = np.concatenate(effects)
        terms["categorical"] = (np.take(flat, categorical + offsets).sum(axis=1), var)
    if num_numeric >= 2:
        terms["num_pair"] = (u[:, 0] * u[:, 1], 1.0)
    if len(pmfs) >= 2:
        p0, p1 = pmfs[0], pmfs[1]
        t = rng.standard_normal((p0.size, p1.size))
        t = t - (t @ p1)[:, None]
        t = t - (p0 @ t)[None, :]
        index = categorical[:, 0] * p1.size + categorical[:, 1]
        terms["cat_pair"] = (np.take(t.ravel(), index), float(p0 @ t**2 @ p1))
    total_share = sum(_VARIANCE_SHARES[name] for name in terms)
    logit = np.zeros(rows)
    for name, (values, var) in terms.items():
        if var > 0.0:
            share = _VARIANCE_SHARES[name] / total_share
            logit += values * (logit_sd * math.sqrt(share / var))
    return logit
