"""From a CTR file on disk to a :class:`~tpsl_flwr.data.tabular.DatasetSplit`.

Shared by :func:`~tpsl_flwr.data.criteo.load_criteo` and
:func:`~tpsl_flwr.data.avazu.load_avazu`: argument checks, the header check,
encoding (or the cache), then the split. Numeric columns are standardized with the
*train* mean and standard deviation, as for every dataset of the project.

Splits:

* ``"random"``: seeded and stratified (each class sends ``test_fraction`` of its
  rows to test), the same split as the other datasets.
* ``"time"``: with a time column (Avazu's ``hour``), the last ``test_days``
  calendar days are test; without one (Criteo, whose files are in time order), the
  last ``test_fraction`` of the rows in file order.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tpsl_flwr.data.ctr_files import EncodedFile, EncodeOptions, encode_file
from tpsl_flwr.data.ctr_formats import CTRFormat
from tpsl_flwr.data.ctr_hashing import DEFAULT_HASH_BUCKETS
from tpsl_flwr.data.ctr_reader import first_line
from tpsl_flwr.data.preprocess import standardize, stratified_split
from tpsl_flwr.data.tabular import DatasetSplit, TabularData
from tpsl_flwr.errors import ConfigError

__all__ = ["SPLITS", "check_path", "load_ctr", "resolve_buckets"]

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
        name get :data:`~tpsl_flwr.data.ctr_hashing.DEFAULT_HASH_BUCKETS`).
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
    _check_args(rows, seed, test_fraction, split, test_days, hash_seed, on_bad_rows)
    buckets = resolve_buckets(hash_buckets, fmt.categorical)
    if fmt.header:
        _check_header(p, fmt)
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
    if split == "time":
        train_idx, test_idx = _time_split(enc, test_fraction, test_days, p)
    else:
        rng = np.random.default_rng(np.random.SeedSequence(int(seed)).spawn(1)[0])
        train_idx, test_idx = stratified_split(
            np.asarray(enc.labels), test_fraction, rng
        )
    if train_idx.size == 0 or test_idx.size == 0:
        raise ConfigError(
            f"{enc.meta['rows']} rows are too few to split ({split}): train "
            f"{train_idx.size}, test {test_idx.size}"
        )
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
    return DatasetSplit(train=data[0], test=data[1], name=fmt.name, info=info)


def _tables(
    enc: EncodedFile, train_idx: np.ndarray, test_idx: np.ndarray
) -> tuple[TabularData, TabularData]:
    """Cut train and test rows out of the encoded arrays; standardize numerics."""
    num_train, num_test, _, _ = standardize(
        np.asarray(enc.numeric[train_idx]), np.asarray(enc.numeric[test_idx])
    )
    out = []
    for num, idx in ((num_train, train_idx), (num_test, test_idx)):
        out.append(
            TabularData(
                numeric=num,
                categorical=enc.categorical[idx].astype(np.int64),
                cardinalities=enc.cardinalities,
                labels=enc.labels[idx].astype(np.int64),
                num_classes=2,
                numeric_names=enc.numeric_names,
                categorical_names=enc.categorical_names,
            )
        )
    return out[0], out[1]


def _time_split(
    enc: EncodedFile, test_fraction: float, test_days: int, path: Path
) -> tuple[np.ndarray, np.ndarray]:
    """Last days (with a time column) or last rows (file order) as test."""
    n = enc.labels.shape[0]
    if enc.hours is None:
        n_test = min(max(round(test_fraction * n), 1), n - 1)
        return np.arange(n - n_test), np.arange(n - n_test, n)
    days = np.asarray(enc.hours) // 100
    unique = np.unique(days)
    if unique.size <= test_days:
        raise ConfigError(
            f"{path}: the time split holds out the last {test_days} day(s), but the "
            f"rows read cover {unique.size} day(s) ({unique[0]}..{unique[-1]}, "
            f"YYMMDD); read more rows or use split='random'"
        )
    is_test = days >= unique[-test_days]
    return np.flatnonzero(~is_test), np.flatnonzero(is_test)


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


def _check_header(path: Path, fmt: CTRFormat) -> None:
    """Raise unless the file's first line is the format's header."""
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


def _check_args(
    rows: int | None,
    seed: int,
    test_fraction: float,
    split: str,
    test_days: int,
    hash_seed: int,
    on_bad_rows: str,
) -> None:
    """Validate the loader arguments that do not need the file."""
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
