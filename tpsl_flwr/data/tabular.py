"""Tabular data records: the label party's table and a non-label party's slice.

A :class:`TabularData` holds every column and the labels (what the label party
and the data loader see). A :class:`PartyFeatures` holds one vertical slice of the
feature columns for every sample and **no labels**: it is all a non-label party
ever receives. A :class:`DatasetSplit` pairs a train and a test table with a few
facts about them.

All three are frozen dataclasses validated in ``__post_init__``; a bad field raises
:class:`~tpsl_flwr.errors.ConfigError` naming the value.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tpsl_flwr._util.compact_ints import is_strictly_increasing
from tpsl_flwr.data.mapped import MappedColumns, column_range
from tpsl_flwr.errors import ConfigError

__all__ = ["DatasetSplit", "PartyFeatures", "TabularData", "check_ids"]


def _check_features(
    numeric: np.ndarray | MappedColumns,
    categorical: np.ndarray | MappedColumns,
    cardinalities: tuple[int, ...],
    numeric_names: tuple[str, ...],
    categorical_names: tuple[str, ...],
) -> int:
    """Validate the feature fields shared by both records; return the row count."""
    if not isinstance(numeric, np.ndarray | MappedColumns) or numeric.ndim != 2:
        raise ConfigError(
            f"numeric must be a 2-d numpy array, got {type(numeric).__name__} "
            f"with shape {getattr(numeric, 'shape', None)}"
        )
    if numeric.dtype != np.float32:
        raise ConfigError(f"numeric must have dtype float32, got {numeric.dtype}")
    if not isinstance(categorical, np.ndarray | MappedColumns) or categorical.ndim != 2:
        raise ConfigError(
            f"categorical must be a 2-d numpy array, got "
            f"{type(categorical).__name__} with shape "
            f"{getattr(categorical, 'shape', None)}"
        )
    if categorical.dtype != np.int64:
        raise ConfigError(f"categorical must have dtype int64, got {categorical.dtype}")
    n = numeric.shape[0]
    if categorical.shape[0] != n:
        raise ConfigError(
            f"numeric and categorical must have the same number of rows, got "
            f"{n} and {categorical.shape[0]}"
        )
    if len(numeric_names) != numeric.shape[1]:
        raise ConfigError(
            f"numeric_names has {len(numeric_names)} names for "
            f"{numeric.shape[1]} numeric columns"
        )
    if len(categorical_names) != categorical.shape[1]:
        raise ConfigError(
            f"categorical_names has {len(categorical_names)} names for "
            f"{categorical.shape[1]} categorical columns"
        )
    if len(cardinalities) != categorical.shape[1]:
        raise ConfigError(
            f"cardinalities has {len(cardinalities)} entries for "
            f"{categorical.shape[1]} categorical columns"
        )
    names = numeric_names + categorical_names
    if len(set(names)) != len(names):
        dupes = sorted({c for c in names if names.count(c) > 1})
        raise ConfigError(f"column names must be unique, got duplicates {dupes}")
    for name, card in zip(categorical_names, cardinalities, strict=True):
        if isinstance(card, bool) or not isinstance(card, int | np.integer):
            raise ConfigError(f"cardinality of {name!r} must be an int, got {card!r}")
        if card < 1:
            raise ConfigError(f"cardinality of {name!r} must be >= 1, got {card}")
    if n > 0 and categorical.shape[1] > 0:
        lo, hi = column_range(categorical)
        card_arr = np.asarray(cardinalities, dtype=np.int64)
        bad = np.flatnonzero((lo < 0) | (hi >= card_arr))
        if bad.size:
            j = int(bad[0])
            raise ConfigError(
                f"categorical column {categorical_names[j]!r} must hold values in "
                f"[0, {cardinalities[j]}), got range [{lo[j]}, {hi[j]}]"
            )
    return n


def _select(
    columns: Iterable[str] | None,
    numeric_names: tuple[str, ...],
    categorical_names: tuple[str, ...],
) -> tuple[list[int], list[int]]:
    """Positions of the named columns (table order) in the numeric/categorical sets."""
    if columns is None:
        return list(range(len(numeric_names))), list(range(len(categorical_names)))
    if isinstance(columns, str):
        raise ConfigError(f"columns must be a collection of names, got {columns!r}")
    wanted = list(columns)
    if len(set(wanted)) != len(wanted):
        raise ConfigError(f"columns must not repeat a name, got {wanted}")
    unknown = sorted(set(wanted) - set(numeric_names) - set(categorical_names))
    if unknown:
        raise ConfigError(
            f"unknown column names {unknown}; known: "
            f"{list(numeric_names) + list(categorical_names)}"
        )
    chosen = set(wanted)
    num_idx = [i for i, c in enumerate(numeric_names) if c in chosen]
    cat_idx = [i for i, c in enumerate(categorical_names) if c in chosen]
    return num_idx, cat_idx


@dataclass(frozen=True)
class PartyFeatures:
    """One party's vertical slice of the feature columns, with no labels.

    Parameters
    ----------
    numeric : np.ndarray or MappedColumns
        ``(n, n_num)`` float32 numeric features (already standardized). A
        :class:`~tpsl_flwr.data.mapped.MappedColumns` (Criteo/Avazu views)
        reads rows from the memory-mapped cache per batch instead.
    categorical : np.ndarray or MappedColumns
        ``(n, n_cat)`` int64 codes; column ``j`` holds values in
        ``[0, cardinalities[j])``.
    cardinalities : tuple of int
        Number of categories of each categorical column.
    numeric_names, categorical_names : tuple of str
        Column names, in array order.

    Raises
    ------
    ConfigError
        If shapes, dtypes, names or category codes disagree.
    """

    numeric: np.ndarray | MappedColumns
    categorical: np.ndarray | MappedColumns
    cardinalities: tuple[int, ...]
    numeric_names: tuple[str, ...]
    categorical_names: tuple[str, ...]

    def __post_init__(self) -> None:
        _normalise_tuples(self)
        _check_features(
            self.numeric,
            self.categorical,
            self.cardinalities,
            self.numeric_names,
            self.categorical_names,
        )

    def __len__(self) -> int:
        return int(self.numeric.shape[0])

    @property
    def names(self) -> tuple[str, ...]:
        """All column names: numeric first, then categorical."""
        return self.numeric_names + self.categorical_names

    def take(self, indices: np.ndarray | Sequence[int]) -> PartyFeatures:
        """Return the rows at ``indices`` (in that order).

        Parameters
        ----------
        indices : array-like of int
            Row positions.

        Returns
        -------
        PartyFeatures
            A new record holding copies of the selected rows.
        """
        idx = np.asarray(indices, dtype=np.int64)
        return PartyFeatures(
            self.numeric[idx],
            self.categorical[idx],
            self.cardinalities,
            self.numeric_names,
            self.categorical_names,
        )


@dataclass(frozen=True)
class TabularData:
    """A labelled table: numeric and categorical features plus integer labels.

    Parameters
    ----------
    numeric : np.ndarray
        ``(n, n_num)`` float32 numeric features, standardized with train statistics.
    categorical : np.ndarray
        ``(n, n_cat)`` int64 codes; column ``j`` holds values in
        ``[0, cardinalities[j])``.
    cardinalities : tuple of int
        Number of categories of each categorical column.
    labels : np.ndarray
        ``(n,)`` int64 labels in ``[0, num_classes)``.
    num_classes : int
        Number of classes, at least 2.
    numeric_names, categorical_names : tuple of str
        Column names, in array order; all names are distinct.

    Raises
    ------
    ConfigError
        If shapes, dtypes, names, category codes or labels are invalid.

    Examples
    --------
    >>> import numpy as np
    >>> t = TabularData(
    ...     numeric=np.zeros((3, 1), np.float32),
    ...     categorical=np.array([[0], [1], [2]]),
    ...     cardinalities=(3,),
    ...     labels=np.array([0, 1, 0]),
    ...     num_classes=2,
    ...     numeric_names=("x",),
    ...     categorical_names=("c",),
    ... )
    >>> len(t), t.features_only(["c"]).names
    (3, ('c',))
    """

    numeric: np.ndarray
    categorical: np.ndarray
    cardinalities: tuple[int, ...]
    labels: np.ndarray
    num_classes: int
    numeric_names: tuple[str, ...]
    categorical_names: tuple[str, ...]

    def __post_init__(self) -> None:
        _normalise_tuples(self)
        n = _check_features(
            self.numeric,
            self.categorical,
            self.cardinalities,
            self.numeric_names,
            self.categorical_names,
        )
        k = self.num_classes
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise ConfigError(f"num_classes must be an int >= 2, got {k!r}")
        y = self.labels
        if not isinstance(y, np.ndarray) or y.shape != (n,):
            raise ConfigError(
                f"labels must be a numpy array of shape ({n},), got shape "
                f"{getattr(y, 'shape', None)}"
            )
        if y.dtype != np.int64:
            raise ConfigError(f"labels must have dtype int64, got {y.dtype}")
        if n > 0 and (y.min() < 0 or y.max() >= k):
            raise ConfigError(
                f"labels must lie in [0, {k}), got range [{y.min()}, {y.max()}]"
            )

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def names(self) -> tuple[str, ...]:
        """All column names: numeric first, then categorical."""
        return self.numeric_names + self.categorical_names

    def take(self, indices: np.ndarray | Sequence[int]) -> TabularData:
        """Return the rows at ``indices`` (in that order).

        Parameters
        ----------
        indices : array-like of int
            Row positions.

        Returns
        -------
        TabularData
            A new table holding copies of the selected rows.
        """
        idx = np.asarray(indices, dtype=np.int64)
        return TabularData(
            self.numeric[idx],
            self.categorical[idx],
            self.cardinalities,
            self.labels[idx],
            self.num_classes,
            self.numeric_names,
            self.categorical_names,
        )

    def features_only(self, columns: Iterable[str] | None = None) -> PartyFeatures:
        """Drop the labels and keep the named feature columns.

        Parameters
        ----------
        columns : iterable of str, optional
            Column names to keep (numeric or categorical, any order; the result
            keeps table order). ``None`` keeps every column.

        Returns
        -------
        PartyFeatures
            The label-free slice a non-label party receives.

        Raises
        ------
        ConfigError
            If a name is unknown or repeated.
        """
        num_idx, cat_idx = _select(columns, self.numeric_names, self.categorical_names)
        return PartyFeatures(
            numeric=np.ascontiguousarray(self.numeric[:, num_idx]),
            categorical=np.ascontiguousarray(self.categorical[:, cat_idx]),
            cardinalities=tuple(self.cardinalities[j] for j in cat_idx),
            numeric_names=tuple(self.numeric_names[j] for j in num_idx),
            categorical_names=tuple(self.categorical_names[j] for j in cat_idx),
        )


def _normalise_tuples(record: PartyFeatures | TabularData) -> None:
    """Coerce the sequence fields of a frozen record to tuples of plain values."""
    object.__setattr__(
        record, "cardinalities", tuple(int(c) for c in record.cardinalities)
    )
    object.__setattr__(record, "numeric_names", tuple(record.numeric_names))
    object.__setattr__(record, "categorical_names", tuple(record.categorical_names))


@dataclass(frozen=True)
class DatasetSplit:
    """A train table, a test table with the same schema, and facts about them.

    Parameters
    ----------
    train, test : TabularData
        The two tables; columns, cardinalities and ``num_classes`` must agree.
    name : str
        Dataset name (as given to :func:`~tpsl_flwr.data.load_dataset`).
    info : dict
        Facts such as ``rows``, ``train_rows``, ``test_rows``, ``positive_rate``
        (binary only) and, for synthetic data, ``bayes_test_auc``.
    train_ids, test_ids : np.ndarray, optional
        Record ids of the rows (int64, increasing): the row numbers in the
        source. :func:`~tpsl_flwr.data.load_dataset` always sets them.

    Raises
    ------
    ConfigError
        If the two tables' schemas differ, or ids do not match the tables.
    """

    train: TabularData
    test: TabularData
    name: str
    info: dict[str, float] = field(default_factory=dict)
    train_ids: np.ndarray | None = None
    test_ids: np.ndarray | None = None

    def __post_init__(self) -> None:
        for ids, table, what in (
            (self.train_ids, self.train, "train_ids"),
            (self.test_ids, self.test, "test_ids"),
        ):
            if ids is not None:
                check_ids(ids, len(table), what)
        a, b = self.train, self.test
        if a.names != b.names:
            raise ConfigError(f"train and test columns differ: {a.names} vs {b.names}")
        if a.cardinalities != b.cardinalities:
            raise ConfigError(
                f"train and test cardinalities differ: {a.cardinalities} vs "
                f"{b.cardinalities}"
            )
        if a.num_classes != b.num_classes:
            raise ConfigError(
                f"train and test num_classes differ: {a.num_classes} vs {b.num_classes}"
            )

    @property
    def num_classes(self) -> int:
        """Number of classes (shared by train and test)."""
        return self.train.num_classes


def check_ids(ids: np.ndarray, n: int, what: str) -> None:
    """Raise unless ``ids`` are ``n`` strictly increasing non-negative ids.

    int64, or int32 (the compact form of files under 2**31 rows,
    :mod:`tpsl_flwr._util.compact_ints`).

    Parameters
    ----------
    ids : np.ndarray
        Record ids.
    n : int
        Rows they must label.
    what : str
        Named in the message.

    Raises
    ------
    ConfigError
        Naming ``what`` and the problem.
    """
    if not isinstance(ids, np.ndarray) or ids.shape != (n,):
        raise ConfigError(
            f"{what} must be a numpy array of shape ({n},), got shape "
            f"{getattr(ids, 'shape', None)}"
        )
    if ids.dtype not in (np.int64, np.int32):
        raise ConfigError(f"{what} must have dtype int64 or int32, got {ids.dtype}")
    if n and (ids[0] < 0 or not is_strictly_increasing(ids)):
        raise ConfigError(f"{what} must be non-negative and strictly increasing")
