"""From a CTR file on disk to a :class:`~tpsl_flwr.data.tabular.DatasetSplit`.

Shared by :func:`~tpsl_flwr.data.ctr.criteo.load_criteo` and
:func:`~tpsl_flwr.data.ctr.avazu.load_avazu`: argument checks, the header check,
encoding (or the cache), then the split. Numeric columns are standardized with the
*train* mean and standard deviation, as for every dataset of the project.

Splits (a function of the record id, or of time, never of a label):

* ``"random"``: record ``i`` (the ``i``-th data row kept) is test with
  probability ``test_fraction``, by a hash of ``(i, seed)``
  (:func:`~tpsl_flwr.data.membership.hash_is_test`), as for every dataset.
* ``"time"``: with a time column (Avazu's ``hour``), the last ``test_days``
  calendar days are test; without one (Criteo, whose files are in time order), the
  last ``test_fraction`` of the rows in file order.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tpsl_flwr._util.compact_ints import index_dtype
from tpsl_flwr.data.ctr.files import EncodedFile, EncodeOptions, encode_file
from tpsl_flwr.data.ctr.formats import CTRFormat
from tpsl_flwr.data.ctr.gather import gather_rows
from tpsl_flwr.data.ctr.hashing import DEFAULT_HASH_BUCKETS
from tpsl_flwr.data.ctr.reader import first_line
from tpsl_flwr.data.membership import (
    hash_is_test,
    last_days_is_test,
    split_positions,
    tail_is_test,
)
from tpsl_flwr.data.preprocess import standardize
from tpsl_flwr.data.tabular import DatasetSplit, TabularData
from tpsl_flwr.errors import ConfigError

__all__ = [
    "SPLITS",
    "check_args",
    "check_header",
    "check_path",
    "ctr_is_test",
    "load_ctr",
    "resolve_buckets",
]

SPLITS = ("random", "time")
"""Accepted values of ``split``."""
_MAX_BUCKETS = 2**31 - 1


def resolve_buckets(
    hash_buckets: int | Mapping[str, int], columns: tuple[str, ...]
) -> dict[str, int]:
    """Codes per hashed column, from one number or a per-column mapping.

    Parameters
    ----------
    hash_buckets : int or mapping of str to int
        One count for every column, or counts by column name (columns it does not
        name get :data:`~tpsl_flwr.data.ctr.hashing.DEFAULT_HASH_BUCKETS`).
    columns : tuple of str
        The hashed columns.

    Returns
    -------
    dict of str to int
        A count in ``[2, 2**31 - 1]`` for every column.

    Raises
    ------
    ConfigError
        If a count is out of range or a name is not a hashed column.

    Examples
    --------
    >>> resolve_buckets({"C2": 10}, ("C1", "C2"))
    {'C1': 32768, 'C2': 10}
    """
    if isinstance(hash_buckets, Mapping):
        unknown = sorted(set(hash_buckets) - set(columns))
        if unknown:
            raise ConfigError(
                f"hash_buckets names unknown columns {unknown}; hashed columns: "
                f"{list(columns)}"
            )
        out = {c: hash_buckets.get(c, DEFAULT_HASH_BUCKETS) for c in columns}
    else:
        out = dict.fromkeys(columns, hash_buckets)
    for name, b in out.items():
        if isinstance(b, bool) or not isinstance(b, int | np.integer):
            raise ConfigError(f"hash_buckets of {name!r} must be an int, got {b!r}")
        if not 2 <= b <= _MAX_BUCKETS:
            raise ConfigError(
                f"hash_buckets of {name!r} must lie in [2, {_MAX_BUCKETS}], got {b}"
            )
    return {c: int(b) for c, b in out.items()}


def load_ctr(
    fmt: CTRFormat,
    path: str | Path,
    *,
    rows: int | None,
    seed: int,
    test_fraction: float,
    split: str,
    test_days: int,
    hash_buckets: int | Mapping[str, int],
    hash_seed: int,
    cache: bool,
    cache_dir: str | Path | None,
    on_bad_rows: str,
    missing_indicators: bool = False,
) -> DatasetSplit:
    """Load, encode and split one CTR file (see the public loaders' docs).

    Returns
    -------
    DatasetSplit
        Named after ``fmt``.

    Raises
    ------
    ConfigError
        On a bad argument, a missing or malformed file (naming the line and
        column), or a split that leaves train or test empty.
    """
    p = check_path(path)
    check_args(rows, seed, test_fraction, split, test_days, hash_seed, on_bad_rows)
    buckets = resolve_buckets(hash_buckets, fmt.categorical)
    if fmt.header:
        check_header(p, fmt)
    if not isinstance(missing_indicators, bool):
        raise ConfigError(
            f"missing_indicators must be a bool, got {missing_indicators!r}"
        )
    opts = EncodeOptions(
        buckets=buckets,
        rows=None if rows is None else int(rows),
        hash_seed=int(hash_seed),
        on_bad_rows=on_bad_rows,
        missing_indicators=missing_indicators,
    )
    enc = encode_file(
        p,
        fmt,
        opts,
        cache=bool(cache),
        cache_dir=None if cache_dir is None else Path(cache_dir),
    )
    # Record ids: positions among the rows kept (the file's data row numbers
    # unless on_bad_rows="skip" dropped rows).
    n = int(enc.meta["rows"])
    is_test = ctr_is_test(
        n,
        enc.hours,
        split=split,
        seed=int(seed),
        test_fraction=test_fraction,
        test_days=test_days,
        source=str(p),
    )
    train_idx, test_idx = split_positions(is_test, split, test_fraction)
    data = _tables(enc, train_idx, test_idx)
    info: dict[str, Any] = {
        "rows": int(enc.meta["rows"]),
        "rows_read": int(enc.meta["rows_read"]),
        "rows_skipped": int(enc.meta["rows_skipped"]),
        "train_rows": int(train_idx.size),
        "test_rows": int(test_idx.size),
        "num_classes": 2,
        "num_numeric": len(enc.numeric_names),
        "num_categorical": len(enc.categorical_names),
        "positive_rate": enc.meta["positives"] / enc.meta["rows"],
        "train_positive_rate": float(data[0].labels.mean()),
        "test_positive_rate": float(data[1].labels.mean()),
        "source": str(p),
        "format": fmt.name,
        "split": split,
        "seed": int(seed),
        "cache_hit": bool(enc.meta["cache_hit"]),
        "cache_path": enc.meta["cache_path"],
    }
    return DatasetSplit(
        train=data[0],
        test=data[1],
        name=fmt.name,
        info=info,
        train_ids=train_idx.astype(np.int64),
        test_ids=test_idx.astype(np.int64),
    )


def _tables(
    enc: EncodedFile, train_idx: np.ndarray, test_idx: np.ndarray
) -> tuple[TabularData, TabularData]:
    """Cut train and test rows out of the encoded arrays; standardize numerics."""
    num_train, num_test, _, _ = standardize(
        gather_rows(enc.numeric, train_idx, np.float32),
        gather_rows(enc.numeric, test_idx, np.float32),
    )
    assert enc.labels is not None
    out = []
    for num, idx in ((num_train, train_idx), (num_test, test_idx)):
        out.append(
            TabularData(
                numeric=num,
                categorical=gather_rows(enc.categorical, idx, np.int64),
                cardinalities=enc.cardinalities,
                labels=gather_rows(enc.labels, idx, np.int64),
                num_classes=2,
                numeric_names=enc.numeric_names,
                categorical_names=enc.categorical_names,
            )
        )
    return out[0], out[1]


def ctr_is_test(
    n: int,
    hours: np.ndarray | None,
    *,
    split: str,
    seed: int,
    test_fraction: float,
    test_days: int,
    source: str,
) -> np.ndarray:
    """Test membership of records ``0..n-1`` of a CTR file (never label-based).

    Parameters
    ----------
    n : int
        Records read.
    hours : np.ndarray or None
        ``(n,)`` ``YYMMDDHH`` of a format with a time column (needed for
        ``split="time"`` there).
    split : {"random", "time"}
        Random by record id, or by time (see the module docstring).
    seed : int
        Seed of the random split.
    test_fraction : float
        Fraction held out (random split; Criteo's time split).
    test_days : int
        Days held out by a time split on ``hours``.
    source : str
        Named in errors.

    Returns
    -------
    np.ndarray
        ``(n,)`` bool.
    """
    if split == "time":
        if hours is None:
            return tail_is_test(n, test_fraction)
        return last_days_is_test(hours, test_days, source)
    ids = np.arange(n, dtype=index_dtype(n))
    return hash_is_test(ids, seed=seed, test_fraction=test_fraction)


def check_path(path: str | Path) -> Path:
    """The path as a :class:`Path`, or raise naming it if it is no file."""
    if not isinstance(path, str | Path) or not str(path):
        raise ConfigError(f"data path must be a file path, got {path!r}")
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"data file not found: {str(p)!r}")
    if not p.is_file():
        raise ConfigError(f"data path is not a file: {str(p)!r}")
    return p


def check_header(path: Path, fmt: CTRFormat) -> None:
    """Raise unless the file's first line is the format's header.

    Raises
    ------
    ConfigError
        Naming the first column that differs.
    """
    line = first_line(path)
    got = line.split(fmt.delimiter)
    want = list(fmt.columns)
    if not line:
        raise ConfigError(
            f"{path}, line 1: empty, expected the {fmt.name} header "
            f"{fmt.delimiter.join(want)!r}"
        )
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        if g != w:
            raise ConfigError(
                f"{path}, line 1, column {i + 1}: header says {g[:40]!r}, expected "
                f"{w!r} ({fmt.name} format)"
            )
    if len(got) != len(want):
        raise ConfigError(
            f"{path}, line 1: the header has {len(got)} columns, the {fmt.name} "
            f"format has {len(want)}"
        )


def check_args(
    rows: int | None,
    seed: int,
    test_fraction: float,
    split: str,
    test_days: int,
    hash_seed: int,
    on_bad_rows: str,
) -> None:
    """Validate the loader arguments that do not need the file.

    Raises
    ------
    ConfigError
        Naming the first bad argument and its value.
    """
    if rows is not None and (
        isinstance(rows, bool) or not isinstance(rows, int | np.integer) or rows <= 0
    ):
        raise ConfigError(f"rows must be a positive int or None, got {rows!r}")
    for name, value in (("seed", seed), ("hash_seed", hash_seed)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise ConfigError(f"{name} must be an int, got {value!r}")
    ok = isinstance(test_fraction, int | float) and not isinstance(test_fraction, bool)
    if not ok or not 0.0 < float(test_fraction) < 1.0:
        raise ConfigError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {list(SPLITS)}, got {split!r}")
    if isinstance(test_days, bool) or not isinstance(test_days, int) or test_days < 1:
        raise ConfigError(f"test_days must be an int >= 1, got {test_days!r}")
    if on_bad_rows not in ("error", "skip"):
        raise ConfigError(f"on_bad_rows must be 'error' or 'skip', got {on_bad_rows!r}")
