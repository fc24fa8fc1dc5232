"""Turn raw arrays into a :class:`~tpsl_flwr.data.tabular.DatasetSplit`.

A train/test membership fixed by the record ids alone
(:mod:`~tpsl_flwr.data.membership`), then numeric columns standardized with the
*train* mean and standard deviation (test rows never inform the scaling), one
column at a time, so that a party holding a few columns gets bitwise the values
the full table has.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tpsl_flwr.data.membership import split_positions
from tpsl_flwr.data.tabular import DatasetSplit, TabularData
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.metrics.auc import binary_auc

__all__ = ["binary_auc", "make_split", "standardize"]


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
    d = train.shape[1]
    mean = np.zeros(d)
    std = np.ones(d)
    train_z = np.empty(train.shape, dtype=np.float32)
    test_z = np.empty(test.shape, dtype=np.float32)
    for j in range(d):
        # One contiguous float64 column at a time: the statistics do not depend
        # on which other columns sit beside it (a 2-d reduction sums in another
        # order), so every party's slice equals the full table's columns.
        col = np.ascontiguousarray(train[:, j], dtype=np.float64)
        mean[j] = col.mean()
        sd = col.std()
        std[j] = sd if sd > 0 else 1.0
        train_z[:, j] = (col - mean[j]) / std[j]
        test_z[:, j] = (np.asarray(test[:, j], dtype=np.float64) - mean[j]) / std[j]
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
    *,
    record_ids: np.ndarray,
    is_test: np.ndarray,
    test_fraction: float,
    bayes_scores: np.ndarray | None = None,
) -> DatasetSplit:
    """Split raw arrays by a given membership, standardize numerics, record facts.

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
    record_ids : np.ndarray
        ``(n,)`` increasing record ids of the rows.
    is_test : np.ndarray
        ``(n,)`` bool membership, a function of the record ids alone (see
        :mod:`~tpsl_flwr.data.membership`).
    test_fraction : float
        The requested fraction (named in errors).
    bayes_scores : np.ndarray, optional
        ``(n,)`` ground-truth ``P(y = 1 | x)`` of a binary synthetic table, or any
        increasing function of it such as the true logit; its test AUC is
        recorded as ``info["bayes_test_auc"]``.

    Returns
    -------
    DatasetSplit
        Rows in increasing record-id order, with ``train_ids``/``test_ids`` and
        ``info`` keys ``rows``, ``train_rows``, ``test_rows``, ``num_classes``,
        ``num_numeric``, ``num_categorical``; for binary labels also
        ``positive_rate``, ``train_positive_rate``, ``test_positive_rate``; with
        ``bayes_scores`` also ``bayes_test_auc``.

    Raises
    ------
    ConfigError
        If the membership leaves train or test empty, or the arrays are
        inconsistent.
    """
    labels = np.asarray(labels, dtype=np.int64)
    train_idx, test_idx = split_positions(
        np.asarray(is_test, dtype=bool), "random", test_fraction
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
    info = label_info(labels, tables[0].labels, tables[1].labels, num_classes)
    info["num_numeric"] = int(num.shape[1])
    info["num_categorical"] = int(cat.shape[1])
    if bayes_scores is not None:
        auc = bayes_auc(tables[1].labels, bayes_scores, test_idx, num_classes)
        if auc is not None:
            info["bayes_test_auc"] = auc
    ids = np.asarray(record_ids, dtype=np.int64)
    return DatasetSplit(
        train=tables[0],
        test=tables[1],
        name=name,
        info=info,
        train_ids=ids[train_idx],
        test_ids=ids[test_idx],
    )


def label_info(
    labels: np.ndarray,
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    num_classes: int,
) -> dict[str, float]:
    """Row counts and (binary) positive rates of a split.

    Parameters
    ----------
    labels, train_labels, test_labels : np.ndarray
        All labels, and those of the train and test rows.
    num_classes : int
        Number of classes.

    Returns
    -------
    dict
        ``rows``, ``train_rows``, ``test_rows``, ``num_classes``; for binary
        labels also ``positive_rate``, ``train_positive_rate`` and
        ``test_positive_rate``.
    """
    info: dict[str, float] = {
        "rows": int(labels.shape[0]),
        "train_rows": int(train_labels.shape[0]),
        "test_rows": int(test_labels.shape[0]),
        "num_classes": int(num_classes),
    }
    if num_classes == 2:
        info["positive_rate"] = float(labels.mean())
        info["train_positive_rate"] = float(train_labels.mean())
        info["test_positive_rate"] = float(test_labels.mean())
    return info


def bayes_auc(
    test_labels: np.ndarray,
    bayes_scores: np.ndarray,
    test_idx: np.ndarray,
    num_classes: int,
) -> float | None:
    """Test AUC of the true scores; None when the test rows hold one class.

    Parameters
    ----------
    test_labels : np.ndarray
        Labels of the test rows.
    bayes_scores : np.ndarray
        ``(n,)`` true scores of every row.
    test_idx : np.ndarray
        Positions of the test rows.
    num_classes : int
        Must be 2.

    Returns
    -------
    float or None
        The AUC.

    Raises
    ------
    ConfigError
        If the labels are not binary.
    """
    if num_classes != 2:
        raise ConfigError(
            f"bayes_scores needs binary labels, got num_classes={num_classes}"
        )
    if np.unique(test_labels).size != 2:
        return None
    scores = np.asarray(bayes_scores, dtype=np.float64)[test_idx]
    return binary_auc(test_labels, scores)
