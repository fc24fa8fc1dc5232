"""Encode a CTR file chunk by chunk, and cache the encoded arrays.

pyarrow's streaming CSV reader (:mod:`~tpsl_flwr.data.ctr.reader`) hands over
chunks of raw bytes; labels and counts are parsed and tokens hashed straight from
Arrow's buffers (:mod:`~tpsl_flwr.data.ctr.parse`,
:mod:`~tpsl_flwr.data.ctr.hashing`) and appended to ``.npy`` files
(:mod:`~tpsl_flwr.data.ctr.cache`): memory is bounded by a few chunks whatever
the file's size, and no Python object is made per row. The calling thread parses
while a small pool encodes the chunks before (:mod:`~tpsl_flwr.data.ctr.pool`;
pyarrow and numpy release the GIL); chunks are appended in file order and errors
are raised as a sequential read raises them, so the cache bytes do not depend on
the number of threads.

Why pyarrow: streaming a 1M-row Criteo file (232 MiB) with every column as text
took 1.8 CPU-seconds at 185 MB peak RSS with pyarrow's ``open_csv``, 2.8 s at
460 MB with polars' streaming ``scan_csv``, and 12 s at 260 MB with pandas
``read_csv(chunksize=)`` (its string columns are slow); a plain ``pandas.read_csv``
of the whole file took 2.2 s at 940 MB (``python bench/loader.py --readers``).
pyarrow also streams ``.gz`` and reports the physical line of a malformed row.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Mapping
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tpsl_flwr.data.ctr import kernels
from tpsl_flwr.data.ctr.cache import (
    CACHE_VERSION,
    CacheEntry,
    cache_key,
    missing_folders,
    open_entry,
    remove_if_empty,
)
from tpsl_flwr.data.ctr.formats import CTRFormat
from tpsl_flwr.data.ctr.hashing import (
    count_transform,
    hash_buckets_of,
)
from tpsl_flwr.data.ctr.parse import (
    Field,
    field_of,
    parse_hours,
    parse_ints,
    parse_labels,
)
from tpsl_flwr.data.ctr.pool import ordered_map, usable_cores
from tpsl_flwr.data.ctr.reader import Reader, ReadState
from tpsl_flwr.errors import ConfigError

__all__ = ["EncodedFile", "encode_file"]

LOG = logging.getLogger(__name__)
ENCODE_THREADS = 4
"""Most threads encoding chunks at once (fewer on a machine with fewer cores)."""
LOADING_AHEAD = 32
"""Chunks parsed ahead (~110 MB at most) while the compiled kernels load."""


@dataclass(frozen=True)
class EncodedFile:
    """A CTR file encoded to arrays (memory-mapped from the cache, or in memory).

    Parameters
    ----------
    numeric : np.ndarray
        ``(n, n_num)`` float32 transformed counts, not yet standardized.
    categorical : np.ndarray
        ``(n, n_cat)`` int32 codes.
    labels : np.ndarray or None
        ``(n,)`` int8 labels; None when the label column was not read.
    hours : np.ndarray or None
        ``(n,)`` int32 ``YYMMDDHH`` when the time column was read.
    numeric_names, categorical_names : tuple of str
        Column names.
    cardinalities : tuple of int
        Codes per categorical column.
    meta : dict
        ``rows``, ``rows_read``, ``rows_skipped``, ``positives`` (with labels),
        ``source``, ``format``, ``cache_hit``, ``cache_path`` (``""`` without a
        cache).
    """

    numeric: np.ndarray
    categorical: np.ndarray
    labels: np.ndarray | None
    hours: np.ndarray | None
    numeric_names: tuple[str, ...]
    categorical_names: tuple[str, ...]
    cardinalities: tuple[int, ...]
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EncodeOptions:
    """How a file is encoded (every field is part of the cache key).

    Parameters
    ----------
    buckets : dict of str to int
        Codes of every hashed column.
    rows : int or None
        Read only the first ``rows`` data rows (kept rows); None reads all.
    hash_seed : int
        Seed of the hashing trick.
    on_bad_rows : {"error", "skip"}
        Raise on the first malformed row, or drop malformed rows and count them.
    missing_indicators : bool
        Add a 0/1 numeric column ``<name>_missing`` after the counts for every
        count column (a missing count and a zero count are otherwise both 0).
    columns : tuple of str or None
        Feature columns to encode, by output name (the time column's hour of day
        is the feature named after it); None encodes every feature column. Only
        these columns are read from the file.
    labels : bool
        Read and encode the label column. A non-label party's encoding leaves it
        out: the label column is then never converted or parsed.
    hours : bool
        Read the time column (of a format with one) for the time split, even
        when its hour of day is not among ``columns``.
    """

    buckets: dict[str, int]
    rows: int | None = None
    hash_seed: int = 0
    on_bad_rows: str = "error"
    missing_indicators: bool = False
    columns: tuple[str, ...] | None = None
    labels: bool = True
    hours: bool = True

    def numeric(self, fmt: CTRFormat) -> tuple[str, ...]:
        """The count columns encoded, in file order."""
        return tuple(c for c in fmt.numeric if self._wants(c))

    def categorical(self, fmt: CTRFormat) -> tuple[str, ...]:
        """The hashed columns encoded, in file order."""
        return tuple(c for c in fmt.categorical if self._wants(c))

    def time_feature(self, fmt: CTRFormat) -> bool:
        """Whether the hour of day is an encoded feature."""
        return fmt.time is not None and self._wants(fmt.time)

    def reads_time(self, fmt: CTRFormat) -> bool:
        """Whether the time column is read (feature or time split)."""
        return fmt.time is not None and (self.hours or self.time_feature(fmt))

    def file_columns(self, fmt: CTRFormat) -> set[str]:
        """The file columns the reader converts."""
        cols = {*self.numeric(fmt), *self.categorical(fmt)}
        if fmt.time is not None and self.reads_time(fmt):
            cols.add(fmt.time)
        if self.labels:
            cols.add(fmt.label)
        return cols

    def _wants(self, name: str) -> bool:
        return self.columns is None or name in self.columns

    def key(self, fmt: CTRFormat) -> dict[str, Any]:
        """JSON-serialisable parameters for the cache key."""
        return {
            "format": fmt.name,
            "buckets": [self.buckets[c] for c in self.categorical(fmt)],
            "rows": self.rows,
            "hash_seed": self.hash_seed,
            "on_bad_rows": self.on_bad_rows,
            "missing_indicators": self.missing_indicators,
            "columns": None if self.columns is None else sorted(self.columns),
            "labels": self.labels,
            "hours": self.reads_time(fmt),
        }


def encode_file(
    path: Path,
    fmt: CTRFormat,
    opts: EncodeOptions,
    *,
    cache: bool,
    cache_dir: Path | None,
) -> EncodedFile:
    """Encode ``path`` (or map its cached encoding).

    Parameters
    ----------
    path : Path
        An existing CTR file in format ``fmt``.
    fmt : CTRFormat
        Its layout.
    opts : EncodeOptions
        How to encode it.
    cache : bool
        Keep the encoded arrays on disk and reuse them.
    cache_dir : Path or None
        Where entries live; ``.tpsl-cache`` beside the file when None.

    Returns
    -------
    EncodedFile
        The arrays and facts about the read.

    Raises
    ------
    ConfigError
        If the file is malformed (the message names the line and column), has no
        data row, or has no positive label.
    """
    names: tuple[str, ...] = ("numeric", "categorical")
    names += ("labels",) if opts.labels else ()
    names += ("hours",) if opts.reads_time(fmt) else ()
    folder = None
    if cache:
        base = cache_dir if cache_dir is not None else path.parent / ".tpsl-cache"
        folder = base / f"{path.name}-{cache_key(path, opts.key(fmt))}"
        arrays, meta = open_entry(folder, names)
        if arrays:
            meta.update(cache_hit=True, cache_path=str(folder))
            return _result(arrays, fmt, opts, meta)
    made = missing_folders(folder.parent) if folder is not None else []
    try:
        entry = CacheEntry(folder) if folder is not None else None
    except OSError as exc:
        LOG.warning("cannot write the cache at %s (%s); not caching", folder, exc)
        remove_if_empty(made)
        entry = None
    scratch = None
    try:
        if entry is None:
            scratch = Path(tempfile.mkdtemp(prefix="tpsl-ctr-"))
            entry = CacheEntry(scratch / "entry")
        meta = _encode_into(entry, path, fmt, opts)
        meta.update(version=CACHE_VERSION, source=str(path), format=fmt.name)
        committed = entry.commit(meta)
        arrays, meta = open_entry(committed, names)
        if scratch is not None:
            # Read into memory (not copied through the mapping, whose pages
            # would count in this process's resident memory too).
            arrays = {k: np.load(committed / f"{k}.npy") for k in arrays}
    except BaseException:
        if entry is not None:
            entry.discard()
        remove_if_empty(made)  # no empty .tpsl-cache/ beside the user's file
        raise
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    meta.update(cache_hit=False, cache_path="" if scratch else str(committed))
    return _result(arrays, fmt, opts, meta)


def _result(
    arrays: Mapping[str, np.ndarray],
    fmt: CTRFormat,
    opts: EncodeOptions,
    meta: dict[str, Any],
) -> EncodedFile:
    """Bundle mapped arrays into an :class:`EncodedFile`."""
    numeric_names = opts.numeric(fmt)
    if opts.missing_indicators:
        numeric_names += tuple(f"{c}_missing" for c in numeric_names)
    time = (fmt.time,) if fmt.time is not None and opts.time_feature(fmt) else ()
    hashed = opts.categorical(fmt)
    return EncodedFile(
        numeric=arrays["numeric"],
        categorical=arrays["categorical"],
        labels=arrays.get("labels"),
        hours=arrays.get("hours"),
        numeric_names=numeric_names,
        categorical_names=time + hashed,
        cardinalities=((24,) if time else ()) + tuple(opts.buckets[c] for c in hashed),
        meta=meta,
    )


def _encode_into(
    entry: CacheEntry, path: Path, fmt: CTRFormat, opts: EncodeOptions
) -> dict[str, Any]:
    """Stream ``path`` through the encoder into the entry's ``.npy`` files."""
    n_num = len(opts.numeric(fmt)) * (2 if opts.missing_indicators else 1)
    n_cat = len(opts.categorical(fmt)) + (1 if opts.time_feature(fmt) else 0)
    rows, on_bad_rows = opts.rows, opts.on_bad_rows
    sinks = {
        "numeric": entry.appender("numeric", np.float32, n_num),
        "categorical": entry.appender("categorical", np.int32, n_cat),
    }
    if opts.labels:
        sinks["labels"] = entry.appender("labels", np.int8, None)
    if opts.reads_time(fmt):
        sinks["hours"] = entry.appender("hours", np.int32, None)
    kept = skipped = positives = 0
    reader = Reader(path, fmt, opts.file_columns(fmt))
    state = ReadState()
    last = None if rows is None else fmt.line_offset + rows

    def encode(item: tuple[pa.RecordBatch, ReadState]) -> tuple[Any, ReadState]:
        return _encode_batch(item[0], fmt, opts), item[1]

    try:
        # This thread parses the next chunks while a pool encodes the ones
        # before; results are taken here in file order, as a sequential read.
        workers = max(1, min(ENCODE_THREADS, usable_cores()))
        loading = kernels.warm_up()  # parse on while the kernels load
        first = None if loading is None else (LOADING_AHEAD, loading.is_alive)
        encoded = ordered_map(encode, reader.chunks(), workers, ahead_at_first=first)
        with closing(encoded) as results:
            for (chunk, bad, error), state in results:
                if on_bad_rows == "error":
                    reader.raise_first(error, fmt.line_offset + kept, last, state)
                if bad.any():
                    skipped += int(bad.sum())
                    chunk = {k: v[~bad] for k, v in chunk.items()}
                n = chunk["numeric"].shape[0]
                if rows is not None and kept + n > rows:
                    n = rows - kept
                    chunk = {k: v[:n] for k, v in chunk.items()}
                for name, sink in sinks.items():
                    sink.append(chunk[name])
                kept += n
                if opts.labels:
                    positives += int(chunk["labels"].sum())
                if rows is not None and kept >= rows:
                    break
            else:
                state = reader.state()  # rows skipped after the last chunk too
                if on_bad_rows == "error":
                    reader.raise_first(None, fmt.line_offset + kept, last, state)
    finally:
        for sink in sinks.values():
            sink.close()
    skipped += state.skipped
    if skipped:
        LOG.warning(
            "%s: skipped %d malformed rows (%s)", path, skipped, state.first_bad
        )
    if kept == 0:
        raise ConfigError(f"{path}: no data rows")
    meta = {"rows": kept, "rows_read": kept + skipped, "rows_skipped": skipped}
    if not opts.labels:
        return meta
    if positives == 0:
        raise ConfigError(
            f"{path}: no positive labels in {kept} rows (column {fmt.label!r}); "
            f"a CTR file needs at least one click"
        )
    if positives == kept:
        raise ConfigError(f"{path}: every one of the {kept} rows is positive")
    meta["positives"] = positives
    return meta


def _encode_batch(
    batch: pa.RecordBatch, fmt: CTRFormat, opts: EncodeOptions
) -> tuple[dict[str, np.ndarray], np.ndarray, tuple[str, int, str] | None]:
    """Encode one chunk; flag bad rows and describe the first bad field."""
    n = batch.num_rows
    problems: list[tuple[int, int, str, str]] = []  # (row, file column, name, why)

    def flag(name: str, bad: np.ndarray, f: Field, what: str) -> None:
        if bad.any():
            i = int(np.argmax(bad))
            problems.append((i, fmt.columns.index(name), name, f"{f.text(i)!r} {what}"))

    bad = np.zeros(n, dtype=bool)
    chunk: dict[str, np.ndarray] = {}
    if opts.labels:
        f = field_of(batch.column(fmt.label))
        labels, bad_label = parse_labels(f)
        flag(fmt.label, bad_label, f, "is not 0 or 1")
        bad |= bad_label
        chunk["labels"] = labels
    counts = opts.numeric(fmt)
    n_num = len(counts)
    numeric = np.empty((n, n_num * (2 if opts.missing_indicators else 1)), np.float32)
    for j, name in enumerate(counts):
        f = field_of(batch.column(name))
        values, missing, bad_j = parse_ints(f)
        flag(name, bad_j, f, "is not an integer")
        bad |= bad_j
        numeric[:, j] = count_transform(values, missing)
        if opts.missing_indicators:
            numeric[:, n_num + j] = missing
    hashed = opts.categorical(fmt)
    first = 1 if opts.time_feature(fmt) else 0
    categorical = np.empty((n, len(hashed) + first), dtype=np.int32)
    chunk["numeric"] = numeric
    chunk["categorical"] = categorical
    if fmt.time is not None and opts.reads_time(fmt):
        f = field_of(batch.column(fmt.time))
        hours, bad_h = parse_hours(f)
        flag(fmt.time, bad_h, f, "is not an hour YYMMDDHH")
        bad |= bad_h
        if first:
            categorical[:, 0] = hours % 100
        chunk["hours"] = hours
    for j, name in enumerate(hashed):
        f = field_of(batch.column(name))
        categorical[:, first + j] = hash_buckets_of(
            f.data, f.offsets, name, opts.buckets[name], opts.hash_seed
        )
    error = None
    if problems:
        i, _, name, why = min(problems)
        error = (name, i, why)
    return chunk, bad, error
