"""Facts derived from an encoded CTR side, kept beside its cache entry.

Every start of a run over a Criteo/Avazu file needs, per side, the train/test
record ids (a hash of every record id, or the time column), and per node the
train means and deviations of its numeric columns and the range of its codes.
Each is one pass over all rows: several seconds at 45M rows, repeated by every
party of every run. They depend only on the encoded arrays and the split
settings (never on a label: membership is a function of the record id, the
statistics and code ranges of a node's own columns), so the first start writes
them into ``derived/`` of the side's cache entry and later starts read them:
the ids as read-only memory maps (no anonymous memory), the statistics as a
few numbers.

A file here is written under a temporary name and renamed into place, so a
crashed or concurrent writer never leaves half a file; a file that fails to
load, has the wrong shape or does not describe a partition of the rows is
ignored and computed anew. Without a cache entry (``cache_path`` empty) or
without write access, the facts are computed every time, as before.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tpsl_flwr._util.compact_ints import (
    CHUNK_ROWS,
    chunks,
    index_dtype,
    is_strictly_increasing,
)
from tpsl_flwr._util.private_files import make_private_dir
from tpsl_flwr.data.ctr.files import EncodedFile

__all__ = [
    "DERIVED_VERSION",
    "cached_range",
    "cached_split",
    "cached_stats",
    "table_range",
]

DERIVED_VERSION = 1
"""Bump when a derived fact's computation changes: older files are then ignored."""


def _folder(enc: EncodedFile) -> Path | None:
    """``derived/`` of the entry, or None for an uncached encoding."""
    path = str(enc.meta.get("cache_path", ""))
    return Path(path) / "derived" if path else None


def _name(kind: str, **settings: object) -> str:
    """A file stem naming the fact and every setting it depends on."""
    text = repr((DERIVED_VERSION, kind, sorted(settings.items())))
    return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _load(path: Path, mmap: bool) -> np.ndarray | None:
    """The array at ``path`` (read-only), or None if absent or unreadable."""
    try:
        arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except Exception:
        return None
    if not mmap:
        arr.setflags(write=False)
    return arr


_STALE_SECONDS = 3600
"""A temporary file older than this is a killed writer's: removed by the next."""


def _store(folder: Path, name: str, arr: np.ndarray) -> None:
    """Write ``arr`` to ``folder/name.npy`` durably, atomically; skip if unwritable.

    The bytes reach the disk (``fsync``) before the rename, so a crash leaves
    the old file, no file, or the whole new one, never an empty one.
    """
    try:
        make_private_dir(folder, check=False)
        _remove_stale(folder, name)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}-", suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, np.ascontiguousarray(arr), allow_pickle=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, folder / f"{name}.npy")
    except OSError:
        Path(tmp).unlink(missing_ok=True)


def _remove_stale(folder: Path, name: str) -> None:
    """Remove temporary files of ``name`` that a killed writer left behind."""
    now = time.time()
    for tmp in folder.glob(f".{name}-*.tmp"):
        try:
            if now - tmp.stat().st_mtime > _STALE_SECONDS:
                tmp.unlink()
        except OSError:
            continue


_SAMPLE_IDS = 4096
"""Record ids whose stored membership is checked against a recomputation."""


def _sample_ids(rows: int) -> np.ndarray:
    """Fixed ids to check: evenly spaced and seeded-random, both ends included."""
    spaced = np.linspace(0, rows - 1, _SAMPLE_IDS // 2).astype(np.int64)
    drawn = np.random.default_rng(0).integers(0, rows, _SAMPLE_IDS // 2)
    return np.unique(np.concatenate([spaced, drawn]))


def _contains(sorted_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Whether each of ``ids`` is in the increasing ``sorted_ids``."""
    if sorted_ids.size == 0:
        return np.zeros(ids.shape, dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_ids, ids), sorted_ids.size - 1)
    return np.asarray(sorted_ids[pos] == ids)


def _is_partition(
    train: np.ndarray,
    test: np.ndarray,
    rows: int,
    membership: Callable[[np.ndarray], np.ndarray],
) -> bool:
    """Whether stored ids are this split: a partition agreeing with a recomputation.

    Sizes adding up to ``rows`` plus no shared id make a partition of
    ``0..rows-1``; the sample then checks it is *this* split (another seed's,
    or one of an older membership rule, differs on about half the sample).
    """
    if not (_is_ids(train, rows) and _is_ids(test, rows)):
        return False
    if train.size + test.size != rows:
        return False
    for part in chunks(test.size):
        if _contains(train, np.asarray(test[part])).any():
            return False
    sample = _sample_ids(rows)
    want = np.asarray(membership(sample), dtype=bool)
    return bool(np.array_equal(_contains(test, sample), want))


def _is_ids(arr: np.ndarray | None, rows: int) -> bool:
    """Whether ``arr`` is 1-d increasing integer ids within ``[0, rows)``."""
    if arr is None or arr.ndim != 1 or arr.dtype != index_dtype(max(rows - 1, 0)):
        return False
    if arr.size == 0:
        return True
    return bool(arr[0] >= 0 and arr[-1] < rows and is_strictly_increasing(arr))


def cached_split(
    enc: EncodedFile,
    compute: Callable[[], tuple[np.ndarray, np.ndarray]],
    membership: Callable[[np.ndarray], np.ndarray],
    **settings: object,
) -> tuple[np.ndarray, np.ndarray]:
    """Train and test record ids of ``enc``, from ``derived/`` or ``compute``.

    Stored ids are used only if they are increasing, in range, a partition of
    the rows (no id in both) and agree with ``membership`` on 4,096 fixed ids;
    otherwise they are recomputed and stored anew.

    Parameters
    ----------
    enc : EncodedFile
        The side's encoding.
    compute : callable
        Returns ``(train_ids, test_ids)`` (increasing, compact integers); called
        when no valid file exists, its result stored.
    membership : callable
        ``(ids) -> bool array``: whether each of the given record ids is a test
        record, by the same rule as ``compute``.
    **settings
        Every setting the split depends on (split, seed, fraction, days).

    Returns
    -------
    train_ids, test_ids : np.ndarray
        Read-only; memory maps of ``derived/`` once stored.
    """
    rows = int(enc.meta["rows"])
    folder = _folder(enc)
    stem = _name("split", rows=rows, **settings)
    if folder is not None:
        train = _load(folder / f"{stem}-train.npy", mmap=True)
        test = _load(folder / f"{stem}-test.npy", mmap=True)
        if (
            train is not None
            and test is not None
            and _is_partition(train, test, rows, membership)
        ):
            return train, test
    train, test = compute()
    if folder is None:
        return train, test
    _store(folder, f"{stem}-train", train)
    _store(folder, f"{stem}-test", test)
    mapped = (_load(folder / f"{stem}-{s}.npy", mmap=True) for s in ("train", "test"))
    got = tuple(mapped)
    if any(
        g is None or not np.array_equal(g, c)
        for g, c in zip(got, (train, test), strict=True)
    ):
        return train, test  # could not store: keep the computed ids
    return got[0], got[1]  # type: ignore[return-value]


def cached_stats(
    enc: EncodedFile,
    compute: Callable[[], tuple[np.ndarray, np.ndarray]],
    **settings: object,
) -> tuple[np.ndarray, np.ndarray]:
    """Train mean and deviation of ``enc.numeric``, from ``derived/`` or ``compute``.

    Parameters
    ----------
    enc : EncodedFile
        The side's encoding.
    compute : callable
        Returns ``(mean, std)``, each ``(d,)`` float64.
    **settings
        Every setting the train rows depend on (as :func:`cached_split`).

    Returns
    -------
    mean, std : np.ndarray
        ``(d,)`` float64.
    """
    d = int(enc.numeric.shape[1])
    folder = _folder(enc)
    stem = _name("stats", rows=int(enc.meta["rows"]), columns=d, **settings)
    if folder is not None:
        got = _load(folder / f"{stem}.npy", mmap=False)
        if got is not None and got.shape == (2, d) and got.dtype == np.float64:
            if np.isfinite(got).all() and (got[1] > 0).all():
                return got[0].copy(), got[1].copy()
    mean, std = compute()
    if folder is not None:
        _store(folder, stem, np.stack([mean, std]).astype(np.float64))
    return mean, std


def table_range(
    table: np.ndarray, chunk_rows: int = CHUNK_ROWS
) -> tuple[np.ndarray, np.ndarray]:
    """Per-column minimum and maximum of a ``(n, d)`` table, ``chunk_rows`` at a time.

    Examples
    --------
    >>> lo, hi = table_range(np.array([[3, 1], [0, 7]], dtype=np.int32))
    >>> lo.tolist(), hi.tolist()
    ([0, 1], [3, 7])
    """
    d = table.shape[1]
    lo = np.full(d, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(d, np.iinfo(np.int64).min, dtype=np.int64)
    for part in chunks(table.shape[0], chunk_rows):
        block = np.asarray(table[part])
        np.minimum(lo, block.min(axis=0), out=lo)
        np.maximum(hi, block.max(axis=0), out=hi)
    return lo, hi


def cached_range(enc: EncodedFile) -> tuple[np.ndarray, np.ndarray]:
    """Per-column code range of the whole ``enc.categorical`` table.

    Stored only when every code lies in ``[0, cardinality)``: a range that
    fails the views' check is recomputed at every start, never kept, so a
    repaired table is accepted again. (A stored range stands for the table it
    was computed from; the cache entry's arrays are trusted as for every
    other use of them.)

    Returns
    -------
    lo, hi : np.ndarray
        ``(d,)`` int64; the rows of any view lie within them.
    """
    d = int(enc.categorical.shape[1])
    cards = np.asarray(enc.cardinalities, dtype=np.int64)
    folder = _folder(enc)
    stem = _name("range", rows=int(enc.meta["rows"]), columns=d)
    if folder is not None:
        got = _load(folder / f"{stem}.npy", mmap=False)
        if got is not None and got.shape == (2, d) and got.dtype == np.int64:
            if (got[0] <= got[1]).all():
                return got[0].copy(), got[1].copy()
    lo, hi = table_range(enc.categorical)
    valid = cards.shape == (d,) and bool(((lo >= 0) & (hi < cards)).all())
    if folder is not None and valid and int(enc.meta["rows"]) > 0:
        _store(folder, stem, np.stack([lo, hi]))
    return lo, hi
