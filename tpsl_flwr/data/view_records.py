"""The records a process loads: a party's view, the label view, their id space.

A non-label node holds a :class:`PartyView` (its columns of the train and test
records and their record ids, no field for a label); the label party holds a
:class:`LabelView` (labels and the same record ids). Both check their ids on
construction: int64, non-negative, strictly increasing, one per row, and train
and test disjoint. :mod:`~tpsl_flwr.data.views` loads them.

Within a split, the wire id of a record is its position (``0..n_train-1``,
``0..n_test-1``) in increasing record-id order; :func:`id_space_fingerprint`
binds a noise key to that id space.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tpsl_flwr._util.compact_ints import chunks
from tpsl_flwr.data.tabular import PartyFeatures, check_ids
from tpsl_flwr.errors import ConfigError

__all__ = [
    "LabelView",
    "PartyView",
    "id_space_fingerprint",
]


def id_space_fingerprint(train_ids: np.ndarray, test_ids: np.ndarray) -> str:
    """SHA-256 of the train and test record ids, to bind a noise key to them.

    Parameters
    ----------
    train_ids, test_ids : np.ndarray
        Record ids (int64 increasing) in wire-id order.

    Returns
    -------
    str
        64 hex digits; equal for equal id spaces on every machine.

    Examples
    --------
    >>> a = id_space_fingerprint(np.array([0, 2]), np.array([1]))
    >>> a == id_space_fingerprint(np.array([0, 1]), np.array([2])), len(a)
    (False, 64)
    """
    h = hashlib.sha256(b"tpsl-id-space-v1")
    for ids in (train_ids, test_ids):
        h.update(len(ids).to_bytes(8, "little"))
        for part in chunks(len(ids)):  # int64 bytes whatever the held dtype
            h.update(np.ascontiguousarray(ids[part], dtype="<i8").tobytes())
    return h.hexdigest()


def _check_view_ids(view: PartyView | LabelView, n_train: int, n_test: int) -> None:
    check_ids(view.train_ids, n_train, "train_ids")
    check_ids(view.test_ids, n_test, "test_ids")
    if _intersect(view.train_ids, view.test_ids):
        raise ConfigError("train_ids and test_ids must be disjoint")


def _intersect(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two increasing id arrays share an id (chunked binary search)."""
    if not a.size:
        return False
    for part in chunks(b.size):
        pos = np.minimum(np.searchsorted(a, b[part]), a.size - 1)
        if (a[pos] == b[part]).any():
            return True
    return False


@dataclass(frozen=True)
class PartyView:
    """A non-label party's data: its columns and the record ids, no labels.

    Parameters
    ----------
    train, test : PartyFeatures
        The party's columns of the train and test records, in record-id order.
    train_ids, test_ids : np.ndarray
        Record ids (increasing; int64, or int32 below 2**31 records); the wire
        id of a record is its position.

    Raises
    ------
    ConfigError
        If ids and rows disagree.
    """

    train: PartyFeatures
    test: PartyFeatures
    train_ids: np.ndarray
    test_ids: np.ndarray

    def __post_init__(self) -> None:
        _check_view_ids(self, len(self.train), len(self.test))

    @property
    def id_space(self) -> str:
        """:func:`id_space_fingerprint` of the ids."""
        return id_space_fingerprint(self.train_ids, self.test_ids)


@dataclass(frozen=True)
class LabelView:
    """The label party's data: labels and the record ids.

    Parameters
    ----------
    train_labels, test_labels : np.ndarray
        Signed integer labels in ``[0, num_classes)``, in record-id order
        (int64, or int8 for a CTR file: 1 byte a row).
    num_classes : int
        Number of classes.
    train_ids, test_ids : np.ndarray
        Record ids (increasing; int64, or int32 below 2**31 records).
    info : dict
        Facts as in :attr:`~tpsl_flwr.data.DatasetSplit.info`: ``rows``,
        ``train_rows``, ``test_rows``, ``num_classes``, ``num_numeric``,
        ``num_categorical``, ``seed``, ``positive_rate`` and per split (binary),
        ``bayes_test_auc`` (synthetic), file facts (criteo, avazu).

    Raises
    ------
    ConfigError
        If ids, labels and ``num_classes`` disagree.
    """

    train_labels: np.ndarray
    test_labels: np.ndarray
    num_classes: int
    train_ids: np.ndarray
    test_ids: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_view_ids(self, len(self.train_labels), len(self.test_labels))
        for what, y in (("train", self.train_labels), ("test", self.test_labels)):
            if y.dtype.kind != "i" or y.ndim != 1:
                raise ConfigError(
                    f"{what}_labels must be 1-d signed integers (int64, or int8 "
                    f"and wider), got {y.dtype}"
                )
            if y.size and (y.min() < 0 or y.max() >= self.num_classes):
                raise ConfigError(
                    f"{what}_labels must lie in [0, {self.num_classes}), got "
                    f"[{y.min()}, {y.max()}]"
                )

    @property
    def id_space(self) -> str:
        """:func:`id_space_fingerprint` of the ids."""
        return id_space_fingerprint(self.train_ids, self.test_ids)
