"""What each process loads: a party's columns, or the labels, and the record ids.

A non-label node calls :func:`load_party_view` with its columns: it gets those
columns of the train and test records and their record ids, and no label is ever
loaded, parsed or computed on that path (synthetic data stops generating before
the label draw; scikit-learn's tables are read without their target column;
Criteo/Avazu files are read without converting the label column). The label
party calls :func:`load_label_view`: labels and the same record ids. Both derive
the ids from the public :class:`DataSpec` alone, because train/test membership
is a function of the record id (:mod:`~tpsl_flwr.data.membership`), never of a
label: a label-dependent membership or order would hand labels to every node.

The records (:class:`PartyView`, :class:`LabelView` and
:func:`id_space_fingerprint` of their wire ids) live in
:mod:`~tpsl_flwr.data.view_records`. For every dataset, :func:`load_dataset`'s
tables equal the label view's labels and the party views' columns, bitwise and in
the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from tpsl_flwr._util.compact_ints import compact_ids
from tpsl_flwr.data.builtin import (
    FILE_DATASETS,
    SYNTHETIC_DEFAULT_POSITIVE_RATE,
    SYNTHETIC_DEFAULT_ROWS,
    synthetic_data_rng,
)
from tpsl_flwr.data.bundled import (
    bundled_features,
    bundled_labels,
    bundled_rows,
)
from tpsl_flwr.data.mapped import MappedColumns, column_stats
from tpsl_flwr.data.membership import hash_is_test, split_positions
from tpsl_flwr.data.preprocess import bayes_auc, label_info, standardize
from tpsl_flwr.data.spec import DataSpec, dataset_columns
from tpsl_flwr.data.synthetic import make_synthetic_ctr, make_synthetic_features
from tpsl_flwr.data.tabular import PartyFeatures
from tpsl_flwr.data.view_records import LabelView, PartyView, id_space_fingerprint
from tpsl_flwr.errors import ConfigError

__all__ = [
    "DataSpec",
    "LabelView",
    "PartyView",
    "dataset_columns",
    "id_space_fingerprint",
    "load_label_view",
    "load_party_view",
]


def load_party_view(
    spec: DataSpec, columns: Sequence[str], *, cache_dir: str | Path | None = None
) -> PartyView:
    """Load one non-label party's columns of the train and test records.

    No label is loaded, parsed or computed on this path, for any dataset.
    Numeric columns are standardized with the train records' mean and standard
    deviation of that column, so the result equals the matching columns of
    :func:`~tpsl_flwr.data.load_dataset`. Cached per process (a Flower ClientApp
    is rebuilt for every message); treat the arrays as read-only. For
    ``"criteo"``/``"avazu"`` the columns are
    :class:`~tpsl_flwr.data.mapped.MappedColumns` over the memory-mapped cache,
    gathered (and standardized) a batch at a time: the view holds no copy of
    the table, so its memory does not grow with the file.

    Parameters
    ----------
    spec : DataSpec
        The data.
    columns : sequence of str
        The party's column names (from :func:`dataset_columns`, e.g. one entry
        of :func:`~tpsl_flwr.data.partition_columns`); the result keeps table
        order.
    cache_dir : str or Path, optional
        Encoded-file cache of ``"criteo"``/``"avazu"`` (default ``.tpsl-cache``
        beside the file); it holds only this party's columns.

    Returns
    -------
    PartyView
        Columns and record ids.

    Raises
    ------
    ConfigError
        If a column is unknown or repeated, the file is missing or malformed
        (naming line and column), or the split leaves train or test empty.

    Examples
    --------
    >>> v = load_party_view(DataSpec("digits", rows=200), ["pixel_0_1", "pixel_7_7"])
    >>> v.train.numeric_names, len(v.train) + len(v.test), hasattr(v, "labels")
    (('pixel_0_1', 'pixel_7_7'), 200, False)
    """
    if not isinstance(spec, DataSpec):
        raise ConfigError(f"spec must be a DataSpec, got {type(spec).__name__}")
    num_names, cat_names = dataset_columns(spec)
    if isinstance(columns, str) or not isinstance(columns, Sequence | set | frozenset):
        raise ConfigError(f"columns must be a collection of names, got {columns!r}")
    wanted = list(columns)
    if not wanted:
        raise ConfigError("columns must name at least one column, got none")
    if len(set(wanted)) != len(wanted):
        raise ConfigError(f"columns must not repeat a name, got {wanted}")
    unknown = sorted(set(wanted) - set(num_names) - set(cat_names))
    if unknown:
        raise ConfigError(
            f"unknown column names {unknown} for {spec.dataset!r}; known: "
            f"{list(num_names) + list(cat_names)}"
        )
    chosen = tuple(c for c in (*num_names, *cat_names) if c in set(wanted))
    return _party_view(spec, chosen, _cache_arg(cache_dir), _stamp(spec))


def load_label_view(
    spec: DataSpec, *, cache_dir: str | Path | None = None
) -> LabelView:
    """Load the labels of the train and test records, and their record ids.

    Only the label party calls this. For files only the label column (and
    Avazu's ``hour`` for the time split) is parsed. Cached per process.

    Parameters
    ----------
    spec : DataSpec
        The data.
    cache_dir : str or Path, optional
        Encoded-file cache of ``"criteo"``/``"avazu"``.

    Returns
    -------
    LabelView
        Labels, record ids and facts.

    Raises
    ------
    ConfigError
        If the file is missing or malformed (a label that is not 0/1 names its
        line), it has no positive label, or the split leaves a side empty.

    Examples
    --------
    >>> lv = load_label_view(DataSpec("breast-cancer"))
    >>> lv.num_classes, lv.info["rows"], len(lv.train_ids) + len(lv.test_ids)
    (2, 569, 569)
    """
    if not isinstance(spec, DataSpec):
        raise ConfigError(f"spec must be a DataSpec, got {type(spec).__name__}")
    return _label_view(spec, _cache_arg(cache_dir), _stamp(spec))


def _cache_arg(cache_dir: str | Path | None) -> str | None:
    return None if cache_dir is None else str(Path(cache_dir).expanduser())


def _stamp(spec: DataSpec) -> tuple[int, int] | None:
    """Size and mtime of the spec's file, so an edited file misses the cache."""
    if spec.dataset not in FILE_DATASETS:
        return None
    try:
        st = Path(spec.data_path).expanduser().stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _record_ids(spec: DataSpec) -> np.ndarray:
    """Record ids of a generated or bundled table (files: read from the file)."""
    if spec.dataset == "synthetic-ctr":
        n = SYNTHETIC_DEFAULT_ROWS if spec.rows is None else int(spec.rows)
        return np.arange(n, dtype=np.int64)
    return bundled_rows(spec.dataset, spec.rows, int(spec.seed))


@lru_cache(maxsize=4)
def _party_view(
    spec: DataSpec,
    columns: tuple[str, ...],
    cache_dir: str | None,
    stamp: tuple[int, int] | None,
) -> PartyView:
    """Dispatch by dataset (cached; ``stamp`` only keys the cache)."""
    del stamp
    if spec.dataset in FILE_DATASETS:
        return _ctr_party_view(spec, columns, cache_dir)
    ids = _record_ids(spec)
    is_test = hash_is_test(ids, seed=spec.seed, test_fraction=spec.test_fraction)
    tr, te = split_positions(is_test, spec.split, spec.test_fraction)
    num_names, cat_names = dataset_columns(spec)
    num_idx = [j for j, c in enumerate(num_names) if c in columns]
    cat_idx = [j for j, c in enumerate(cat_names) if c in columns]
    if spec.dataset == "synthetic-ctr":
        feats = make_synthetic_features(
            rows=ids.size, seed=synthetic_data_rng(spec.seed)
        )
        numeric = feats.numeric[:, num_idx]
        categorical = feats.categorical[:, cat_idx]
        cards = tuple(feats.cardinalities[j] for j in cat_idx)
    else:
        numeric = bundled_features(spec.dataset, ids)[:, num_idx]
        categorical = np.empty((ids.size, 0), dtype=np.int64)
        cards = ()
    num_tr, num_te, _, _ = standardize(numeric[tr], numeric[te])
    names = (tuple(num_names[j] for j in num_idx), tuple(cat_names[j] for j in cat_idx))
    return PartyView(
        train=PartyFeatures(num_tr, categorical[tr], cards, *names),
        test=PartyFeatures(num_te, categorical[te], cards, *names),
        train_ids=_frozen(ids[tr]),
        test_ids=_frozen(ids[te]),
    )


def _ctr_party_view(
    spec: DataSpec, columns: tuple[str, ...], cache_dir: str | None
) -> PartyView:
    """A party's columns of a Criteo/Avazu file (label column never converted).

    The columns stay in the memory-mapped cache (int32 codes, float32 counts)
    and are gathered per batch (:class:`~tpsl_flwr.data.mapped.MappedColumns`),
    standardized with the train statistics on the fly: no copy of the table.
    A record's id is its row in the file, so the ids index the map directly.
    """
    from tpsl_flwr.data.ctr.derived import cached_range, cached_stats

    _, enc, tr, te = _ctr_side(spec, columns, labels=False, cache_dir=cache_dir)
    train_ids, test_ids = _frozen(tr), _frozen(te)
    mean, std = cached_stats(
        enc, lambda: column_stats(enc.numeric, train_ids), **_split_settings(spec)
    )
    bounds = cached_range(enc)
    args = (enc.cardinalities, enc.numeric_names, enc.categorical_names)
    sides = []
    for ids in (train_ids, test_ids):
        numeric = MappedColumns(enc.numeric, ids, np.float32, mean, std)
        categorical = MappedColumns(enc.categorical, ids, np.int64, bounds=bounds)
        sides.append(PartyFeatures(numeric, categorical, *args))
    return PartyView(
        train=sides[0], test=sides[1], train_ids=train_ids, test_ids=test_ids
    )


@lru_cache(maxsize=4)
def _label_view(
    spec: DataSpec, cache_dir: str | None, stamp: tuple[int, int] | None
) -> LabelView:
    """Dispatch by dataset (cached; ``stamp`` only keys the cache)."""
    del stamp
    num_names, cat_names = dataset_columns(spec)
    if spec.dataset in FILE_DATASETS:
        return _ctr_label_view(spec, cache_dir, len(num_names), len(cat_names))
    ids = _record_ids(spec)
    is_test = hash_is_test(ids, seed=spec.seed, test_fraction=spec.test_fraction)
    tr, te = split_positions(is_test, spec.split, spec.test_fraction)
    extra: dict[str, Any] = {}
    if spec.dataset == "synthetic-ctr":
        target = spec.positive_rate
        target = SYNTHETIC_DEFAULT_POSITIVE_RATE if target is None else target
        raw = make_synthetic_ctr(
            rows=ids.size, positive_rate=target, seed=synthetic_data_rng(spec.seed)
        )
        labels, num_classes = raw.labels, 2
        auc = bayes_auc(labels[te], raw.logits, te, 2)
        if auc is not None:
            extra["bayes_test_auc"] = auc
        extra.update(target_positive_rate=float(target), intercept=raw.intercept)
    else:
        labels, num_classes = bundled_labels(spec.dataset, ids)
    info: dict[str, Any] = label_info(labels, labels[tr], labels[te], num_classes)
    info.update(num_numeric=len(num_names), num_categorical=len(cat_names))
    info.update(extra)
    info["seed"] = int(spec.seed)
    return LabelView(
        train_labels=labels[tr],
        test_labels=labels[te],
        num_classes=num_classes,
        train_ids=_frozen(ids[tr]),
        test_ids=_frozen(ids[te]),
        info=info,
    )


def _ctr_label_view(
    spec: DataSpec, cache_dir: str | None, num_numeric: int, num_categorical: int
) -> LabelView:
    """The label column of a Criteo/Avazu file (no feature column converted)."""
    from tpsl_flwr.data.ctr.views import side_info

    fmt, enc, tr, te = _ctr_side(spec, (), labels=True, cache_dir=cache_dir)
    assert enc.labels is not None
    train_labels = enc.labels[tr].astype(np.int8)  # two classes: 1 byte a row
    test_labels = enc.labels[te].astype(np.int8)
    info: dict[str, Any] = label_info(enc.labels, train_labels, test_labels, 2)
    info.update(num_numeric=num_numeric, num_categorical=num_categorical)
    info.update(side_info(fmt, enc, spec.split))
    info["seed"] = int(spec.seed)
    return LabelView(
        train_labels=train_labels,
        test_labels=test_labels,
        num_classes=2,
        train_ids=_frozen(tr),
        test_ids=_frozen(te),
        info=info,
    )


def _ctr_side(
    spec: DataSpec, columns: tuple[str, ...], *, labels: bool, cache_dir: str | None
) -> tuple[Any, Any, np.ndarray, np.ndarray]:
    """One side's columns of a Criteo/Avazu file and its train/test positions.

    ``labels=False`` (a node) never converts the label column; ``labels=True``
    with no ``columns`` (the label party) converts no feature column.
    """
    from tpsl_flwr.data.ctr.derived import cached_split
    from tpsl_flwr.data.ctr.views import encode_side, side_is_test, side_membership

    fmt, enc = encode_side(
        spec.dataset,
        spec.data_path,
        columns=columns,
        labels=labels,
        rows=spec.rows,
        seed=int(spec.seed),
        test_fraction=spec.test_fraction,
        split=spec.split,
        hash_buckets=spec.hash_buckets,
        cache_dir=cache_dir,
    )
    rule: dict[str, Any] = {
        "split": spec.split,
        "seed": int(spec.seed),
        "test_fraction": spec.test_fraction,
        "source": spec.data_path,
    }
    tr, te = cached_split(
        enc,
        lambda: side_membership(enc, **rule),
        lambda ids: side_is_test(enc, ids, **rule),
        **_split_settings(spec),
    )
    return fmt, enc, tr, te


def _split_settings(spec: DataSpec) -> dict[str, Any]:
    """Every setting a CTR side's train/test membership depends on."""
    from tpsl_flwr.data.ctr.views import TEST_DAYS

    return {
        "split": spec.split,
        "seed": int(spec.seed),
        "test_fraction": float(spec.test_fraction),
        "test_days": TEST_DAYS,
    }


def _frozen(ids: np.ndarray) -> np.ndarray:
    """A read-only compact copy: the ids fix the noise, nobody may edit them.

    int32 below 2**31 records (:func:`~tpsl_flwr._util.compact_ints.compact_ids`):
    every party holds its ids for the whole run, 4 bytes a row instead of 8.
    """
    return compact_ids(ids)
