"""Criteo/Avazu files read one side at a time: a party's columns, or the labels.

A non-label party's encoding converts only its own columns (plus Avazu's ``hour``
when the time split needs it) and never the label column; the label party's
encoding converts only the label column (plus ``hour`` for the time split).
Each keeps its own cache entry (the column set is part of the key). Malformed
rows are always errors here: a row one side skipped and the other kept would
shift every later record id between them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tpsl_flwr._util.compact_ints import index_dtype
from tpsl_flwr.data.ctr.criteo import criteo_format
from tpsl_flwr.data.ctr.files import EncodedFile, EncodeOptions, encode_file
from tpsl_flwr.data.ctr.formats import AVAZU, CTRFormat
from tpsl_flwr.data.ctr.hashing import DEFAULT_HASH_BUCKETS
from tpsl_flwr.data.ctr.load import (
    check_args,
    check_header,
    check_path,
    ctr_is_test,
    resolve_buckets,
)
from tpsl_flwr.data.membership import hash_is_test, split_positions

__all__ = ["TEST_DAYS", "encode_side", "side_info", "side_is_test", "side_membership"]

TEST_DAYS = 1
"""Days Avazu's time split holds out (as :func:`~tpsl_flwr.data.load_dataset`)."""


def _format(name: str, path: Path) -> CTRFormat:
    """The file's layout: Criteo (either variant, detected) or Avazu."""
    return criteo_format(path) if name == "criteo" else AVAZU


def encode_side(
    name: str,
    data_path: str,
    *,
    columns: tuple[str, ...],
    labels: bool,
    rows: int | None,
    seed: int,
    test_fraction: float,
    split: str,
    hash_buckets: int | None,
    cache_dir: str | None,
) -> tuple[CTRFormat, EncodedFile]:
    """Encode the given feature columns, and the labels only if ``labels``.

    Parameters
    ----------
    name : {"criteo", "avazu"}
        The dataset.
    data_path : str
        The file.
    columns : tuple of str
        Feature columns to encode (may be empty for the label side).
    labels : bool
        Whether to read the label column.
    rows, seed, test_fraction, split, hash_buckets
        As in :class:`~tpsl_flwr.data.views.DataSpec`.
    cache_dir : str or None
        Cache folder (default ``.tpsl-cache`` beside the file).

    Returns
    -------
    fmt : CTRFormat
        The file's layout.
    enc : EncodedFile
        The encoded arrays.

    Raises
    ------
    ConfigError
        If the file is missing or malformed (naming line and column).
    """
    path = check_path(data_path)
    check_args(rows, seed, test_fraction, split, TEST_DAYS, 0, "error")
    fmt = _format(name, path)
    if fmt.header:
        check_header(path, fmt)
    buckets = resolve_buckets(
        DEFAULT_HASH_BUCKETS if hash_buckets is None else hash_buckets,
        fmt.categorical,
    )
    opts = EncodeOptions(
        buckets=buckets,
        rows=rows,
        on_bad_rows="error",
        columns=columns,
        labels=labels,
        hours=split == "time",
    )
    enc = encode_file(
        path,
        fmt,
        opts,
        cache=True,
        cache_dir=None if cache_dir is None else Path(cache_dir),
    )
    return fmt, enc


def side_membership(
    enc: EncodedFile, *, split: str, seed: int, test_fraction: float, source: str
) -> tuple[np.ndarray, np.ndarray]:
    """Train and test record ids of an encoded side (data row numbers).

    Parameters
    ----------
    enc : EncodedFile
        Either side's encoding (no row skipped).
    split, seed, test_fraction
        As in :class:`~tpsl_flwr.data.views.DataSpec`.
    source : str
        Named in errors.

    Returns
    -------
    train_ids, test_ids : np.ndarray
        Increasing record ids (int32 below 2**31 rows).

    Raises
    ------
    ConfigError
        If train or test is empty, or the time split finds a single day.
    """
    is_test = _file_is_test(
        enc, split=split, seed=seed, test_fraction=test_fraction, source=source
    )
    train, test = split_positions(is_test, split, test_fraction)
    return train, test


def _file_is_test(
    enc: EncodedFile, *, split: str, seed: int, test_fraction: float, source: str
) -> np.ndarray:
    """The ``(rows,)`` test mask of every record of an encoded side."""
    return ctr_is_test(
        int(enc.meta["rows"]),
        None if enc.hours is None else np.asarray(enc.hours),
        split=split,
        seed=seed,
        test_fraction=test_fraction,
        test_days=TEST_DAYS,
        source=source,
    )


def side_is_test(
    enc: EncodedFile,
    ids: np.ndarray,
    *,
    split: str,
    seed: int,
    test_fraction: float,
    source: str,
) -> np.ndarray:
    """Whether each record id in ``ids`` is a test record (:func:`side_membership`).

    The random split hashes only ``ids``; a time split computes the file's mask
    (a comparison per row) and reads ``ids`` from it.
    """
    if split != "time":
        return hash_is_test(  # ids in the dtype ctr_is_test hashes them in
            np.asarray(ids).astype(index_dtype(int(enc.meta["rows"]))),
            seed=seed,
            test_fraction=test_fraction,
        )
    mask = _file_is_test(
        enc, split=split, seed=seed, test_fraction=test_fraction, source=source
    )
    return mask[np.asarray(ids)]


def side_info(fmt: CTRFormat, enc: EncodedFile, split: str) -> dict[str, Any]:
    """Facts about a read, as :func:`~tpsl_flwr.data.ctr.criteo.load_criteo` gives.

    Parameters
    ----------
    fmt : CTRFormat
        The layout.
    enc : EncodedFile
        The encoding.
    split : str
        The split used.

    Returns
    -------
    dict
        ``rows``, ``rows_read``, ``rows_skipped``, ``source``, ``format``,
        ``split``, ``cache_hit``, ``cache_path``.
    """
    return {
        "rows": int(enc.meta["rows"]),
        "rows_read": int(enc.meta["rows_read"]),
        "rows_skipped": int(enc.meta["rows_skipped"]),
        "source": str(enc.meta.get("source", "")),
        "format": fmt.name,
        "split": split,
        "cache_hit": bool(enc.meta["cache_hit"]),
        "cache_path": enc.meta["cache_path"],
    }
