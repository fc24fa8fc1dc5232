"""Turn raw arrays into a :class:`~tpsl_flwr.data.tabular.DatasetSplit`.

A seeded stratified train/test split, then numeric columns standardized with the
*train* mean and standard deviation (test rows never inform the scaling).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tpsl_flwr.data.tabular import DatasetSplit, TabularData
from tpsl_flwr.errors import ConfigError

__all__ = ["binary_auc", "make_split", "standardize", "stratified_split"]


def stratified_split(
    labels: np.ndarray, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Split row positions into train and test, class by class.

    Each class with ``n_c >= 2`` rows sends ``round(test_fraction * n_c)`` of them
    (at least 1, at most ``n_c - 1``) to test; a class with one row stays in train.

    Parameters
    ----------
    labels : np.ndarray
        ``(n,)`` integer labels.
    test_fraction : float
        Fraction of each class sent to test, in ``(0, 1)``.
    rng : np.random.Generator
        Source of the permutation.

    Returns
    -------
    train_idx, test_idx : np.ndarray
        Sorted int64 row positions; disjoint, together all of ``range(n)``.

    Raises
    ------
    ConfigError
        If ``test_fraction`` is not in ``(0, 1)``.

    Examples
    --------
    >>> tr, te = stratified_split(np.array([0, 0, 1, 1]), 0.5, np.random.default_rng(0))
    >>> len(tr), len(te)
    (2, 2)
    """
    _check_fraction(test_fraction)
    test_parts: list[np.ndarray] = []
    for c in np.unique(labels):
        rows = np.flatnonzero(labels == c)
        n_c = rows.size
        if n_c < 2:
            continue
        n_test = min(max(round(test_fraction * n_c), 1), n_c - 1)
        test_parts.append(rng.permutation(rows)[:n_test])
    is_test = np.zeros(labels.shape[0], dtype=bool)
    if test_parts:
        is_test[np.concatenate(test_parts)] = True
    return np.flatnonzero(~is_test), np.flatnonzero(is_test)


def standardize(
    train: np.ndarray, test: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Scale columns to zero mean, unit variance with the train statistics.

    Columns constant on train (zero standard deviation) are only centred.

    Parameters
    ----------
    train, test : np.ndarray
        ``(n_train, d)`` and ``(n_test, d)`` numeric arrays.

    Returns
    -------
    train_z, test_z : np.ndarray
        The scaled arrays, float32.
    mean, std : np.ndarray
        ``(d,)`` float64 train mean and the standard deviation used (zeros as 1).
    """
    mean = train.mean(axis=0, dtype=np.float64)
    std = train.std(axis=0, dtype=np.float64)
    std = np.where(std > 0, std, 1.0)
    train_z = ((train - mean) / std).astype(np.float32)
    test_z = ((test - mean) / std).astype(np.float32)
    return train_z, test_z, mean, std


def make_split(
    name: str,
    numeric: np.ndarray,
    categorical: np.ndarray,
    cardinalities: Sequence[int],
    labels: np.ndarray,
    num_classes: int,
    numeric_names: Sequence[str],
    categorical_names: Sequence[str],
    test_fraction: float,
    rng: np.random.Generator,
    *,
    bayes_scores: np.ndarray | None = None,
) -> DatasetSplit:
    """Split raw arrays (stratified), standardize numeric columns, record facts.

    Parameters
    ----------
    name : str
        Dataset name stored on the split.
    numeric : np.ndarray
        ``(n, n_num)`` raw numeric features (any float dtype).
    categorical : np.ndarray
        ``(n, n_cat)`` integer codes.
    cardinalities : sequence of int
        Categories per categorical column.
    labels : np.ndarray
        ``(n,)`` integer labels in ``[0, num_classes)``.
    num_classes : int
        Number of classes.
    numeric_names, categorical_names : sequence of str
        Column names.
    test_fraction : float
        Fraction of each class sent to test, in ``(0, 1)``.
    rng : np.random.Generator
        Source of the split.
    bayes_scores : np.ndarray, optional
        ``(n,)`` ground-truth ``P(y = 1 | x)`` of a binary synthetic table, or any
        increasing function of it such as the true logit; its test AUC is
        recorded as ``info["bayes_test_auc"]``.

    Returns
    -------
    DatasetSplit
        With ``info`` keys ``rows``, ``train_rows``, ``test_rows``,
        ``num_classes``, ``num_numeric``, ``num_categorical``; for binary labels
        also ``positive_rate``, ``train_positive_rate``, ``test_positive_rate``;
        with ``bayes_scores`` also ``bayes_test_auc``.

    Raises
    ------
    ConfigError
        If ``test_fraction`` is not in ``(0, 1)``, the split leaves train or test
        empty, or the arrays are inconsistent.
    """
    _check_fraction(test_fraction)
    labels = np.asarray(labels, dtype=np.int64)
    train_idx, test_idx = stratified_split(labels, test_fraction, rng)
    if train_idx.size == 0 or test_idx.size == 0:
        raise ConfigError(
            f"{labels.shape[0]} rows are too few to split with "
            f"test_fraction={test_fraction}: train {train_idx.size}, "
            f"test {test_idx.size}"
        )
    num = np.asarray(numeric, dtype=np.float64)
    num_train, num_test, _, _ = standardize(num[train_idx], num[test_idx])
    cat = np.asarray(categorical, dtype=np.int64)
    tables = [
        TabularData(
            numeric=z,
            categorical=cat[idx],
            cardinalities=tuple(cardinalities),
            labels=labels[idx],
            num_classes=num_classes,
            numeric_names=tuple(numeric_names),
            categorical_names=tuple(categorical_names),
        )
        for z, idx in ((num_train, train_idx), (num_test, test_idx))
    ]
    info: dict[str, float] = {
        "rows": int(labels.shape[0]),
        "train_rows": int(train_idx.size),
        "test_rows": int(test_idx.size),
        "num_classes": int(num_classes),
        "num_numeric": int(num.shape[1]),
        "num_categorical": int(cat.shape[1]),
    }
    if num_classes == 2:
        info["positive_rate"] = float(labels.mean())
        info["train_positive_rate"] = float(tables[0].labels.mean())
        info["test_positive_rate"] = float(tables[1].labels.mean())
    if bayes_scores is not None:
        if num_classes != 2:
            raise ConfigError(
                f"bayes_scores needs binary labels, got num_classes={num_classes}"
            )
        test_y = tables[1].labels
        if np.unique(test_y).size == 2:
            scores = np.asarray(bayes_scores, dtype=np.float64)[test_idx]
            info["bayes_test_auc"] = binary_auc(test_y, scores)
    return DatasetSplit(train=tables[0], test=tables[1], name=name, info=info)


def binary_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC of ``scores`` for 0/1 ``labels`` (Mann-Whitney U, ties averaged).

    Equal to ``sklearn.metrics.roc_auc_score`` but numpy-only, so loading a
    dataset does not import scikit-learn's metrics (about a second).

    Parameters
    ----------
    labels : np.ndarray
        ``(n,)`` labels in ``{0, 1}``, both present.
    scores : np.ndarray
        ``(n,)`` real scores, larger meaning "more likely 1".

    Returns
    -------
    float
        The probability that a random positive outscores a random negative,
        ties counting one half.

    Examples
    --------
    >>> binary_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8]))
    0.75
    """
    order = np.argsort(scores, kind="stable")
    sorted_scores = scores[order]
    first = np.r_[True, sorted_scores[1:] != sorted_scores[:-1]]
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], scores.size]
    ranks = np.empty(scores.size)
    ranks[order] = ((starts + ends + 1) / 2.0)[np.cumsum(first) - 1]
    pos = labels == 1
    n_pos = int(pos.sum())
    n_neg = scores.size - n_pos
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def _check_fraction(test_fraction: float) -> None:
    """Raise unless ``test_fraction`` is a number strictly between 0 and 1."""
    ok = isinstance(test_fraction, int | float) and not isinstance(test_fraction, bool)
    if not ok or not 0.0 < float(test_fraction) < 1.0:
        raise ConfigError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
