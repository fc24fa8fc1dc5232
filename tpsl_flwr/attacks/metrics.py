"""How well an attack did: AUC, per-batch AUC statistics, top-1 accuracy.

The pooled AUC (all samples of an epoch at once) is the project's one AUC,
:func:`tpsl_flwr.metrics.auc.binary_auc`. Per-batch AUCs, summarised by their
mean and 95th percentile as the Marvell paper does (Li et al. 2022, ICLR,
Tables 1-2), are the Mann-Whitney statistic computed for all batches of one
size in a single vectorised rank computation (``scipy.stats.rankdata``, average ranks
for ties): the same number as ``roc_auc_score`` on each batch (the tests check it to
1e-12), without scikit-learn's milliseconds of input validation per call, which would
dominate an epoch of a few hundred batches. A batch holding a single class has no AUC;
it is skipped and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import rankdata

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.metrics.auc import binary_auc


@dataclass(frozen=True)
class BatchStats:
    """Summary of a per-batch statistic over the batches of an epoch.

    Attributes
    ----------
    mean
        Mean over the evaluated batches (NaN if none).
    p95
        95th percentile over the evaluated batches (NaN if none).
    skipped
        Batches left out (a single class: no AUC).
    evaluated
        Batches that count.
    """

    mean: float
    p95: float
    skipped: int
    evaluated: int

    @classmethod
    def of(cls, values: np.ndarray) -> BatchStats:
        """Summarise per-batch ``values``; NaN entries are skipped batches."""
        kept = values[~np.isnan(values)]
        if kept.size == 0:
            return cls(float("nan"), float("nan"), int(values.size), 0)
        return cls(
            float(kept.mean()),
            float(np.percentile(kept, 95)),
            int(values.size - kept.size),
            int(kept.size),
        )

    def to_dict(self) -> dict[str, float | int]:
        """``{"mean", "p95", "skipped", "evaluated"}``."""
        return {
            "mean": self.mean,
            "p95": self.p95,
            "skipped": self.skipped,
            "evaluated": self.evaluated,
        }


def _binary(labels: ArrayLike, scores: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(labels)
    s = np.asarray(scores, dtype=np.float64)
    if y.ndim != 1 or s.shape != y.shape:
        raise ConfigError(
            f"labels and scores must be 1-D of one length, got shapes {y.shape} "
            f"and {s.shape}"
        )
    if not np.all((y == 0) | (y == 1)):
        raise ConfigError(f"binary labels must be 0 or 1, got {np.unique(y)}")
    return y.astype(bool), s


def pooled_auc(labels: ArrayLike, scores: ArrayLike) -> float:
    """ROC AUC of ``scores`` for ``labels`` (:func:`~tpsl_flwr.metrics.auc.binary_auc`).

    Parameters
    ----------
    labels
        ``(n,)`` labels, 0 or 1.
    scores
        ``(n,)`` attack scores, high means label 1.

    Returns
    -------
    float
        The AUC, or NaN if ``labels`` holds a single class.

    Raises
    ------
    ConfigError
        If the shapes differ or a label is not 0 or 1.

    Examples
    --------
    >>> pooled_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
    0.75
    """
    y, s = _binary(labels, scores)
    return binary_auc(y, s)


def batch_aucs(labels: Sequence[ArrayLike], scores: Sequence[ArrayLike]) -> np.ndarray:
    """The AUC of each batch, NaN for a batch holding a single class.

    Parameters
    ----------
    labels
        One ``(n_b,)`` array of 0/1 labels per batch.
    scores
        One ``(n_b,)`` array of scores per batch.

    Returns
    -------
    numpy.ndarray
        ``(batches,)`` AUCs, equal to ``roc_auc_score`` on each batch.

    Raises
    ------
    ConfigError
        If the sequences differ in length or a batch is malformed.

    Examples
    --------
    >>> batch_aucs([[0, 1], [1, 1]], [[0.2, 0.9], [0.1, 0.3]])
    array([ 1., nan])
    """
    if len(labels) != len(scores):
        raise ConfigError(
            f"got {len(labels)} batches of labels and {len(scores)} of scores"
        )
    out = np.full(len(labels), np.nan)
    groups: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = {}
    for b, (lab, sc) in enumerate(zip(labels, scores, strict=True)):
        y, s = _binary(lab, sc)
        if 0 < np.count_nonzero(y) < y.size:
            groups.setdefault(y.size, []).append((b, y, s))
    for size, members in groups.items():
        index = [b for b, _, _ in members]
        y = np.stack([y for _, y, _ in members])
        ranks = rankdata(np.stack([s for _, _, s in members]), axis=1)
        positives = y.sum(axis=1)
        rank_sum = np.where(y, ranks, 0.0).sum(axis=1)
        u = rank_sum - positives * (positives + 1) / 2.0
        out[index] = u / (positives * (size - positives))
    return out


def per_batch_auc(
    labels: Sequence[ArrayLike], scores: Sequence[ArrayLike]
) -> BatchStats:
    """Mean and 95th percentile of the per-batch AUCs, and batches skipped.

    Parameters
    ----------
    labels
        One ``(n_b,)`` array of 0/1 labels per batch.
    scores
        One ``(n_b,)`` array of scores per batch.

    Returns
    -------
    BatchStats
        Over the batches holding both classes.

    Examples
    --------
    >>> per_batch_auc([[0, 1], [1, 1]], [[0.2, 0.9], [0.1, 0.3]])
    BatchStats(mean=1.0, p95=1.0, skipped=1, evaluated=1)
    """
    return BatchStats.of(batch_aucs(labels, scores))


def top1_accuracy(labels: ArrayLike, predictions: ArrayLike) -> float:
    """Fraction of samples whose predicted label is the true one.

    Parameters
    ----------
    labels
        ``(n,)`` true labels.
    predictions
        ``(n,)`` predicted labels.

    Returns
    -------
    float
        Top-1 accuracy (NaN for no samples).

    Raises
    ------
    ConfigError
        If the shapes differ.

    Examples
    --------
    >>> top1_accuracy([0, 2, 1, 1], [0, 2, 2, 1])
    0.75
    """
    y = np.asarray(labels)
    p = np.asarray(predictions)
    if y.ndim != 1 or p.shape != y.shape:
        raise ConfigError(
            f"labels and predictions must be 1-D of one length, got shapes "
            f"{y.shape} and {p.shape}"
        )
    return float(np.mean(y == p)) if y.size else float("nan")


def per_batch_top1(
    labels: Sequence[ArrayLike], predictions: Sequence[ArrayLike]
) -> BatchStats:
    """Mean and 95th percentile of the per-batch top-1 accuracy (none skipped).

    Parameters
    ----------
    labels
        One ``(n_b,)`` array of labels per batch.
    predictions
        One ``(n_b,)`` array of predicted labels per batch.

    Returns
    -------
    BatchStats
        Over the non-empty batches.
    """
    if len(labels) != len(predictions):
        raise ConfigError(
            f"got {len(labels)} batches of labels and {len(predictions)} of predictions"
        )
    values = np.array(
        [top1_accuracy(y, p) for y, p in zip(labels, predictions, strict=True)]
    )
    return BatchStats.of(values)
