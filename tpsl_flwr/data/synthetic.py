"""A synthetic click-through-rate (CTR) table with a known ground truth.

Shaped like Criteo/Avazu-style data: numeric columns with heavy tails, categorical
columns with Zipf-like category frequencies, and a rare positive class. Labels come
from a known logit, so the Bayes-optimal score (the true probability) is available
and a model's test AUC can be compared with the best achievable one.

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
``logit_sd`` for every seed, which keeps the Bayes AUC stable across seeds.

Labels are ``y = 1[L < s(x)]`` with ``L`` standard-logistic noise, i.e.
Bernoulli(sigmoid(s)). The intercept ``b`` is the quantile of ``L - f(x)`` that
makes exactly ``round(positive_rate * rows)`` labels positive: the exact, O(n)
equivalent of solving for ``b`` by bisection on the realized positive rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import expit

from tpsl_flwr.errors import ConfigError

__all__ = [
    "SyntheticCTR",
    "SyntheticFeatures",
    "make_synthetic_ctr",
    "make_synthetic_features",
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


@dataclass(frozen=True)
class SyntheticCTR:
    """A raw (unsplit, unscaled) synthetic CTR table and its ground truth.

    Parameters
    ----------
    numeric : np.ndarray
        ``(rows, num_numeric)`` float64 raw features: even columns Student-t
        (3 degrees of freedom), odd columns log-normal.
    categorical : np.ndarray
        ``(rows, num_categorical)`` int64 codes; code 0 is the most frequent.
    cardinalities : tuple of int
        Categories per categorical column.
    labels : np.ndarray
        ``(rows,)`` int64 labels in ``{0, 1}``.
    logits : np.ndarray
        ``(rows,)`` float64 true logit ``s(x)``, intercept included.
    probabilities : np.ndarray
        ``(rows,)`` float64 true ``P(y = 1 | x)`` (the Bayes-optimal score).
    intercept : float
        The solved intercept ``b``.
    numeric_names, categorical_names : tuple of str
        ``num_0, ...`` and ``cat_0, ...``.
    """

    numeric: np.ndarray
    categorical: np.ndarray
    cardinalities: tuple[int, ...]
    labels: np.ndarray
    logits: np.ndarray
    probabilities: np.ndarray
    intercept: float
    numeric_names: tuple[str, ...]
    categorical_names: tuple[str, ...]


def make_synthetic_ctr(
    rows: int = 20_000,
    num_numeric: int = 8,
    num_categorical: int = 8,
    cardinality_range: tuple[int, int] = (3, 100),
    positive_rate: float = 0.1,
    seed: int | np.random.Generator = 0,
    *,
    logit_sd: float = 1.5,
    zipf_exponent: float = 1.1,
) -> SyntheticCTR:
    """Generate a synthetic CTR table with a known logit.

    Parameters
    ----------
    rows : int
        Number of rows (at least 2).
    num_numeric, num_categorical : int
        Column counts; each >= 0 and together >= 1.
    cardinality_range : tuple of int
        Inclusive ``(low, high)`` range the cardinalities are drawn from,
        ``2 <= low <= high``.
    positive_rate : float
        Target fraction of positive labels in ``(0, 1)`` (CTR-like: 0.01-0.5).
        The realized count is exactly ``round(positive_rate * rows)``.
    seed : int or np.random.Generator
        Seed of, or the generator for, every random draw.
    logit_sd : float
        Population standard deviation of the feature part of the logit (>= 0):
        larger means an easier problem and a higher Bayes AUC (the default gives
        about 0.80 at ``positive_rate=0.1``); 0 makes labels independent of the
        features.
    zipf_exponent : float
        Exponent ``a`` of the category frequencies ``P(code = v) ~ (v + 1)^-a``
        (>= 0; 0 is uniform).

    Returns
    -------
    SyntheticCTR
        Raw features, labels, true probabilities and the intercept.

    Raises
    ------
    ConfigError
        If an argument is out of range (the message names it), or ``rows`` is too
        small for ``positive_rate`` to give at least one row of each class.

    Examples
    --------
    >>> d = make_synthetic_ctr(rows=1000, positive_rate=0.2, seed=1)
    >>> d.numeric.shape, d.categorical.shape, int(d.labels.sum())
    ((1000, 8), (1000, 8), 200)
    """
    _check_args(
        rows,
        num_numeric,
        num_categorical,
        cardinality_range,
        positive_rate,
        logit_sd,
        zipf_exponent,
    )
    rng = np.random.default_rng(seed)
    feats = _draw_features(
        rng, rows, num_numeric, num_categorical, cardinality_range, zipf_exponent
    )
    labels, logit, intercept = _draw_labels(rng, feats, positive_rate, logit_sd)
    return SyntheticCTR(
        numeric=feats.numeric,
        categorical=feats.categorical,
        cardinalities=feats.cardinalities,
        labels=labels,
        logits=logit,
        probabilities=expit(logit),
        intercept=intercept,
        numeric_names=feats.numeric_names,
        categorical_names=feats.categorical_names,
    )


def make_synthetic_features(
    rows: int = 20_000,
    num_numeric: int = 8,
    num_categorical: int = 8,
    cardinality_range: tuple[int, int] = (3, 100),
    seed: int | np.random.Generator = 0,
    *,
    zipf_exponent: float = 1.1,
) -> SyntheticFeatures:
    """Generate only the features of :func:`make_synthetic_ctr`, never a label.

    The generator draws every feature before anything about the labels, so this
    stops there and returns bitwise the features the full generator returns for
    the same arguments: what a non-label party may compute on its own.

    Parameters
    ----------
    rows, num_numeric, num_categorical, cardinality_range, seed, zipf_exponent
        As for :func:`make_synthetic_ctr` (``positive_rate`` and ``logit_sd``
        only shape the labels, so they are not taken).

    Returns
    -------
    SyntheticFeatures
        Raw features and their names.

    Raises
    ------
    ConfigError
        If an argument is out of range (the message names it).

    Examples
    --------
    >>> f = make_synthetic_features(rows=1000, seed=1)
    >>> full = make_synthetic_ctr(rows=1000, positive_rate=0.2, seed=1)
    >>> bool((f.numeric == full.numeric).all()), f.categorical_names[:2]
    (True, ('cat_0', 'cat_1'))
    """
    _check_feature_args(
        rows, num_numeric, num_categorical, cardinality_range, zipf_exponent
    )
    rng = np.random.default_rng(seed)
    return _draw_features(
        rng, rows, num_numeric, num_categorical, cardinality_range, zipf_exponent
    )


@dataclass(frozen=True)
class SyntheticFeatures:
    """The raw features of a synthetic CTR table, without labels.

    Parameters
    ----------
    numeric, categorical, cardinalities, numeric_names, categorical_names
        As in :class:`SyntheticCTR`.
    u : np.ndarray
        ``(rows, num_numeric)`` winsorized unit-variance numeric columns (what
        the true logit sees).
    pmfs : tuple of np.ndarray
        Category frequencies of every categorical column.
    """

    numeric: np.ndarray
    categorical: np.ndarray
    cardinalities: tuple[int, ...]
    numeric_names: tuple[str, ...]
    categorical_names: tuple[str, ...]
    u: np.ndarray
    pmfs: tuple[np.ndarray, ...]


def _draw_features(
    rng: np.random.Generator,
    rows: int,
    num_numeric: int,
    num_categorical: int,
    cardinality_range: tuple[int, int],
    zipf_exponent: float,
) -> SyntheticFeatures:
    """Every feature draw, in the generator's order (before any label draw)."""
    numeric, u = _numeric_columns(rng, rows, num_numeric)
    low, high = cardinality_range
    cards = rng.integers(low, high + 1, size=num_categorical)
    pmfs = tuple(_zipf_pmf(int(c), zipf_exponent) for c in cards)
    categorical = _categorical_columns(rng, rows, list(pmfs))
    return SyntheticFeatures(
        numeric=numeric,
        categorical=categorical,
        cardinalities=tuple(int(c) for c in cards),
        numeric_names=tuple(f"num_{j}" for j in range(num_numeric)),
        categorical_names=tuple(f"cat_{j}" for j in range(num_categorical)),
        u=u,
        pmfs=pmfs,
    )


def _draw_labels(
    rng: np.random.Generator,
    feats: SyntheticFeatures,
    positive_rate: float,
    logit_sd: float,
) -> tuple[np.ndarray, np.ndarray, float]:
    """The true logit, intercept and labels, drawn after the features."""
    rows = feats.numeric.shape[0]
    logit = _feature_logit(rng, feats.u, feats.categorical, list(feats.pmfs), logit_sd)
    # y = 1[L < logit + b]: choose b between the K-th and (K+1)-th smallest L - logit.
    slack = rng.logistic(size=rows) - logit
    k = round(positive_rate * rows)
    lo_hi = np.partition(slack, [k - 1, k])
    intercept = float(0.5 * (lo_hi[k - 1] + lo_hi[k]))
    labels = (slack < intercept).astype(np.int64)
    logit += intercept
    return labels, logit, intercept


def _numeric_columns(
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


def _zipf_pmf(card: int, exponent: float) -> np.ndarray:
    """Category frequencies ``P(v) ~ (v + 1)^-exponent`` for ``v < card``."""
    weights = np.arange(1, card + 1, dtype=np.float64) ** -exponent
    return weights / weights.sum()


def _categorical_columns(
    rng: np.random.Generator, rows: int, pmfs: list[np.ndarray]
) -> np.ndarray:
    """Codes drawn from ``pmfs`` by inverse-CDF lookup (one pass a column)."""
    u = rng.random((len(pmfs), rows))
    out = np.empty((rows, len(pmfs)), dtype=np.int64)
    for j, pmf in enumerate(pmfs):
        cdf = np.cumsum(pmf)
        out[:, j] = np.minimum(np.searchsorted(cdf, u[j], side="right"), pmf.size - 1)
    return out


def _feature_logit(
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


def _check_args(
    rows: int,
    num_numeric: int,
    num_categorical: int,
    cardinality_range: tuple[int, int],
    positive_rate: float,
    logit_sd: float,
    zipf_exponent: float,
) -> None:
    """Raise :class:`ConfigError` naming the first out-of-range argument."""
    _check_feature_args(
        rows, num_numeric, num_categorical, cardinality_range, zipf_exponent
    )
    if not isinstance(positive_rate, int | float) or not 0.0 < positive_rate < 1.0:
        raise ConfigError(f"positive_rate must be in (0, 1), got {positive_rate!r}")
    k = round(positive_rate * rows)
    if not 1 <= k <= rows - 1:
        raise ConfigError(
            f"rows={rows} is too few for positive_rate={positive_rate}: {k} positives"
        )
    if not isinstance(logit_sd, int | float) or not 0.0 <= logit_sd < math.inf:
        raise ConfigError(f"logit_sd must be finite and >= 0, got {logit_sd!r}")


def _check_feature_args(
    rows: int,
    num_numeric: int,
    num_categorical: int,
    cardinality_range: tuple[int, int],
    zipf_exponent: float,
) -> None:
    """Validate the arguments that shape the features."""
    for name, value in (
        ("rows", rows),
        ("num_numeric", num_numeric),
        ("num_categorical", num_categorical),
    ):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise ConfigError(f"{name} must be an int, got {value!r}")
        if value < 0:
            raise ConfigError(f"{name} must be >= 0, got {value}")
    if rows < 2:
        raise ConfigError(f"rows must be >= 2, got {rows}")
    if num_numeric + num_categorical < 1:
        raise ConfigError(
            f"need at least one column, got num_numeric={num_numeric}, "
            f"num_categorical={num_categorical}"
        )
    if (
        len(cardinality_range) != 2
        or not all(isinstance(c, int | np.integer) for c in cardinality_range)
        or not 2 <= cardinality_range[0] <= cardinality_range[1]
    ):
        raise ConfigError(
            f"cardinality_range must be (low, high) ints with 2 <= low <= high, "
            f"got {cardinality_range!r}"
        )
    if (
        not isinstance(zipf_exponent, int | float)
        or not 0.0 <= zipf_exponent < math.inf
    ):
        raise ConfigError(
            f"zipf_exponent must be finite and >= 0, got {zipf_exponent!r}"
        )
