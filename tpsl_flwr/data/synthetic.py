"""A synthetic click-through-rate (CTR) table with a known ground truth.

Shaped like Criteo/Avazu-style data: numeric columns with heavy tails, categorical
columns with Zipf-like category frequencies, and a rare positive class. Labels come
from a known logit, so the Bayes-optimal score (the true probability) is available
and a model's test AUC can be compared with the best achievable one.

The ground-truth logit is ``s(x) = f(x) + b``; the columns and the feature part
``f`` (winsorized numeric terms, per-category effects, two pairwise interactions,
population sd ``logit_sd``) are built in :mod:`~tpsl_flwr.data.synthetic_terms`.
Every feature is drawn before anything about the labels, so
:func:`make_synthetic_features` stops there and a non-label party can compute its
columns without a label.

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

from tpsl_flwr.data.synthetic_terms import (
    categorical_columns,
    feature_logit,
    numeric_columns,
    zipf_pmf,
)
from tpsl_flwr.errors import ConfigError

__all__ = [
    "SyntheticCTR",
    "SyntheticFeatures",
    "make_synthetic_ctr",
    "make_synthetic_features",
]


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
    numeric, u = numeric_columns(rng, rows, num_numeric)
    low, high = cardinality_range
    cards = rng.integers(low, high + 1, size=num_categorical)
    pmfs = tuple(zipf_pmf(int(c), zipf_exponent) for c in cards)
    categorical = categorical_columns(rng, rows, list(pmfs))
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
    logit = feature_logit(rng, feats.u, feats.categorical, list(feats.pmfs), logit_sd)
    # y = 1[L < logit + b]: choose b between the K-th and (K+1)-th smallest L - logit.
    slack = rng.logistic(size=rows) - logit
    k = round(positive_rate * rows)
    lo_hi = np.partition(slack, [k - 1, k])
    intercept = float(0.5 * (lo_hi[k - 1] + lo_hi[k]))
    labels = (slack < intercept).astype(np.int64)
    logit += intercept
    return labels, logit, intercept


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
