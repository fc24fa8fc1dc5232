"""Datasets by name: synthetic CTR, two scikit-learn tables, Criteo and Avazu files.

Every loader returns a :class:`~tpsl_flwr.data.tabular.DatasetSplit` made the same
way: optional seeded row subsample, a train/test membership that is a function of
the record id (the row number in the source) alone, rows in increasing record-id
order, numeric columns standardized with train statistics. Nothing is downloaded:
``"criteo"`` and ``"avazu"`` read a file the user names with ``data_path`` (see
:func:`~tpsl_flwr.data.ctr.criteo.load_criteo` and
:func:`~tpsl_flwr.data.ctr.avazu.load_avazu`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tpsl_flwr.data.bundled import (
    bundled_columns,
    bundled_features,
    bundled_labels,
    bundled_rows,
)
from tpsl_flwr.data.membership import hash_is_test
from tpsl_flwr.data.preprocess import make_split
from tpsl_flwr.data.synthetic import make_synthetic_ctr
from tpsl_flwr.data.tabular import DatasetSplit
from tpsl_flwr.errors import ConfigError

__all__ = [
    "ALL_DATASETS",
    "DATASETS",
    "DEFAULT_DATASET",
    "FILE_DATASETS",
    "load_dataset",
]

DATASETS: tuple[str, ...] = ("synthetic-ctr", "breast-cancer", "digits")
"""Names :func:`load_dataset` loads with no file: generated or bundled."""
FILE_DATASETS: tuple[str, ...] = ("criteo", "avazu")
"""Names that read a user-given file (``data_path``)."""
ALL_DATASETS: tuple[str, ...] = DATASETS + FILE_DATASETS
"""Every name :func:`load_dataset` accepts."""
DEFAULT_DATASET = "synthetic-ctr"
"""The dataset used when none is named."""
SYNTHETIC_DEFAULT_ROWS = 20_000
"""Rows of ``synthetic-ctr`` when ``rows`` is None."""
SYNTHETIC_DEFAULT_POSITIVE_RATE = 0.1
"""Positive rate of ``synthetic-ctr`` when ``positive_rate`` is None."""


def load_dataset(
    name: str = DEFAULT_DATASET,
    rows: int | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
    positive_rate: float | None = None,
    *,
    data_path: str | Path | None = None,
    hash_buckets: int | None = None,
    cache_dir: str | Path | None = None,
    split: str = "random",
) -> DatasetSplit:
    """Load a dataset by name, split and standardized.

    Parameters
    ----------
    name : str
        One of :data:`ALL_DATASETS`: ``"synthetic-ctr"`` (binary, 8 numeric and 8
        categorical columns; see :func:`~tpsl_flwr.data.make_synthetic_ctr`),
        ``"breast-cancer"`` (569 rows, 30 numeric columns, binary with sklearn's
        coding: 1 = benign), ``"digits"`` (1797 rows, 64 pixel columns,
        10 classes), ``"criteo"`` (a Criteo ``train.txt`` or Kaggle ``train.csv``
        at ``data_path``: 13 numeric, 26 hashed categorical columns) or
        ``"avazu"`` (an Avazu ``train.csv`` at ``data_path``: 22 categorical
        columns).
    rows : int, optional
        Rows to generate (synthetic; default 20 000), to subsample without
        replacement (sklearn datasets; default all, at most all), or to read from
        the start of the file (criteo, avazu; default all).
    seed : int
        Seed of the generation, the subsample and the random split.
    test_fraction : float
        Probability of a record being held out for test, in ``(0, 1)``.
    positive_rate : float, optional
        Target positive rate of ``synthetic-ctr`` (default 0.1); not accepted for
        the other datasets.
    data_path : str or Path, optional
        The file of ``"criteo"`` or ``"avazu"`` (plain or ``.gz``); required for
        them, not accepted for the others.
    hash_buckets : int, optional
        Codes per hashed categorical column of ``"criteo"``/``"avazu"`` (default
        :data:`~tpsl_flwr.data.ctr.hashing.DEFAULT_HASH_BUCKETS`; code 0 = missing).
    cache_dir : str or Path, optional
        Cache of the encoded file (default ``.tpsl-cache`` beside it).
    split : {"random", "time"}
        ``"random"`` (every dataset): record ``i`` is test iff a hash of
        ``(i, seed)`` falls below ``test_fraction``
        (:func:`~tpsl_flwr.data.membership.hash_is_test`); labels are never
        looked at, since a label-dependent (e.g. stratified) membership would
        reveal labels to every party that sees it. ``"time"`` (criteo, avazu
        only): the last rows in file order (criteo) or the last day of ``hour``
        (avazu) are test.

    Returns
    -------
    DatasetSplit
        Train and test rows in increasing record-id order; ``train_ids`` and
        ``test_ids`` hold the record ids (row numbers in the source, or in the
        full bundled table before the ``rows`` subsample). ``info`` holds
        ``rows``, ``train_rows``, ``test_rows``, ``num_classes``,
        ``num_numeric``, ``num_categorical``, ``seed``, ``positive_rate``
        (binary), and for ``synthetic-ctr`` also ``bayes_test_auc`` (test AUC of
        the true probability), ``target_positive_rate`` and ``intercept``.

    Raises
    ------
    ConfigError
        If ``name`` is unknown (the message lists the valid names), ``rows`` is
        not a positive int or exceeds a bundled dataset, ``test_fraction`` is not
        in ``(0, 1)``, ``positive_rate`` is given for a non-synthetic dataset,
        ``data_path`` is missing for ``"criteo"``/``"avazu"`` or given for another
        dataset, or the file is missing or malformed.

    Examples
    --------
    >>> split = load_dataset("breast-cancer", seed=0)
    >>> split.train.numeric.shape[1], split.num_classes, split.info["rows"]
    (30, 2, 569)
    """
    if name not in ALL_DATASETS:
        raise ConfigError(
            f"unknown dataset {name!r}; valid names: {list(ALL_DATASETS)}"
        )
    if rows is not None and (
        isinstance(rows, bool) or not isinstance(rows, int | np.integer) or rows <= 0
    ):
        raise ConfigError(f"rows must be a positive int or None, got {rows!r}")
    if not isinstance(seed, int | np.integer) or isinstance(seed, bool):
        raise ConfigError(f"seed must be an int, got {seed!r}")
    if name in FILE_DATASETS:
        return _from_file(
            name, rows, seed, test_fraction, positive_rate, data_path, hash_buckets,
            cache_dir, split,
        )  # fmt: skip
    file_args = {
        "data_path": data_path,
        "hash_buckets": hash_buckets,
        "cache_dir": cache_dir,
    }
    for arg, value in file_args.items():
        if value is not None:
            raise ConfigError(
                f"{arg} applies only to {list(FILE_DATASETS)}, got {arg}={value!r} "
                f"for {name!r}"
            )
    if split != "random":
        raise ConfigError(
            f"split={split!r} applies only to {list(FILE_DATASETS)}; {name!r} "
            f"takes split='random'"
        )
    if name == "synthetic-ctr":
        out = _synthetic(rows, int(seed), test_fraction, positive_rate)
    else:
        if positive_rate is not None:
            raise ConfigError(
                f"positive_rate applies only to 'synthetic-ctr', got "
                f"positive_rate={positive_rate!r} for {name!r}"
            )
        out = _bundled(name, rows, int(seed), test_fraction)
    out.info["seed"] = int(seed)
    return out


def _from_file(
    name: str,
    rows: int | None,
    seed: int,
    test_fraction: float,
    positive_rate: float | None,
    data_path: str | Path | None,
    hash_buckets: int | None,
    cache_dir: str | Path | None,
    split: str,
) -> DatasetSplit:
    """Load ``"criteo"`` or ``"avazu"`` from the user's file."""
    if data_path is None:
        what = (
            "a Criteo train.txt or Kaggle train.csv"
            if name == "criteo"
            else ("an Avazu train.csv")
        )
        raise ConfigError(
            f"dataset {name!r} reads a file: give data_path ({what}, plain or .gz)"
        )
    if positive_rate is not None:
        raise ConfigError(
            f"positive_rate applies only to 'synthetic-ctr', got "
            f"positive_rate={positive_rate!r} for {name!r}"
        )
    # Imported here: pyarrow costs a quarter of a second to import.
    from tpsl_flwr.data.ctr.avazu import load_avazu
    from tpsl_flwr.data.ctr.criteo import load_criteo
    from tpsl_flwr.data.ctr.hashing import DEFAULT_HASH_BUCKETS

    loader = load_criteo if name == "criteo" else load_avazu
    return loader(
        data_path,
        rows=None if rows is None else int(rows),
        seed=int(seed),
        test_fraction=test_fraction,
        split=split,
        hash_buckets=DEFAULT_HASH_BUCKETS if hash_buckets is None else hash_buckets,
        cache_dir=cache_dir,
    )


def synthetic_data_rng(seed: int) -> np.random.Generator:
    """The generator of the synthetic table for ``seed`` (its second stream).

    Parameters
    ----------
    seed : int
        The dataset seed.

    Returns
    -------
    np.random.Generator
        Fresh, so features-only and full generation draw the same numbers.
    """
    return np.random.default_rng(np.random.SeedSequence(int(seed)).spawn(2)[1])


def _synthetic(
    rows: int | None,
    seed: int,
    test_fraction: float,
    positive_rate: float | None,
) -> DatasetSplit:
    """Generate, split and describe the synthetic CTR table."""
    target = SYNTHETIC_DEFAULT_POSITIVE_RATE if positive_rate is None else positive_rate
    n = SYNTHETIC_DEFAULT_ROWS if rows is None else int(rows)
    is_test = hash_is_test(np.arange(n), seed=seed, test_fraction=test_fraction)
    raw = make_synthetic_ctr(
        rows=n, positive_rate=target, seed=synthetic_data_rng(seed)
    )
    split = make_split(
        "synthetic-ctr",
        raw.numeric,
        raw.categorical,
        raw.cardinalities,
        raw.labels,
        2,
        raw.numeric_names,
        raw.categorical_names,
        record_ids=np.arange(n, dtype=np.int64),
        is_test=is_test,
        test_fraction=test_fraction,
        bayes_scores=raw.logits,
    )
    split.info["target_positive_rate"] = float(target)
    split.info["intercept"] = raw.intercept
    return split


def _bundled(
    name: str, rows: int | None, seed: int, test_fraction: float
) -> DatasetSplit:
    """Read a scikit-learn bundled table, subsample, split."""
    ids = bundled_rows(name, rows, seed)
    is_test = hash_is_test(ids, seed=seed, test_fraction=test_fraction)
    x = bundled_features(name, ids)
    y, num_classes = bundled_labels(name, ids)
    return make_split(
        name,
        x,
        np.empty((y.shape[0], 0), dtype=np.int64),
        (),
        y,
        num_classes,
        bundled_columns(name),
        (),
        record_ids=ids,
        is_test=is_test,
        test_fraction=test_fraction,
    )
