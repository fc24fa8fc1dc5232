"""Rows of an encoded array, copied out of the cache with bounded extra memory.

:func:`gather_rows` is ``table[rows].astype(dtype)`` for the train and test
tables of a loaded CTR file. The rows go straight into the result a block at a
time, so no second full-size copy (e.g. ``int32`` before ``int64``) is made. When
``table`` is a whole ``.npy`` file mapped by ``np.load(mmap_mode="r")`` and the
rows are increasing (the record ids of a split), the blocks are read from the
file with ``readinto`` into one reused buffer instead of touching the mapping:
the file's pages then stay in the page cache and never count in the process's
resident memory.
"""

from __future__ import annotations

import mmap

import numpy as np

__all__ = ["GATHER_ROWS", "gather_rows"]

GATHER_ROWS = 1 << 16
"""Rows copied per block."""


def gather_rows(
    table: np.ndarray, rows: np.ndarray, dtype: np.dtype | type
) -> np.ndarray:
    """``table[rows].astype(dtype)`` a block at a time.

    Parameters
    ----------
    table : np.ndarray
        ``(N, ...)`` source: an in-memory array or a memory map of the cache.
    rows : np.ndarray
        ``(n,)`` row positions in ``[0, N)``.
    dtype : numpy dtype
        dtype of the result.

    Returns
    -------
    np.ndarray
        ``(n, ...)`` array equal to ``table[rows].astype(dtype)``.

    Examples
    --------
    >>> gather_rows(np.arange(6, dtype=np.int32).reshape(3, 2), np.array([2, 0]),
    ...             np.int64).tolist()
    [[4, 5], [0, 1]]
    """
    rows = np.asarray(rows, dtype=np.int64)
    out = np.empty((len(rows), *table.shape[1:]), dtype=dtype)
    path = _mapped_file(table)
    if path is not None and _increasing(rows):
        _read_rows(path, int(table.offset), table, rows, out)  # type: ignore[attr-defined]
        return out
    for a in range(0, len(rows), GATHER_ROWS):
        out[a : a + GATHER_ROWS] = table[rows[a : a + GATHER_ROWS]]
    return out


def _mapped_file(table: np.ndarray) -> str | None:
    """The file behind a whole-file ``np.memmap`` (not a view of one), or None."""
    if not isinstance(table, np.memmap) or not isinstance(table.base, mmap.mmap):
        return None
    if not table.flags.c_contiguous or table.filename is None:
        return None
    return str(table.filename)


def _increasing(rows: np.ndarray) -> bool:
    return rows.size < 2 or bool(np.all(rows[1:] > rows[:-1]))


def _read_rows(
    path: str, offset: int, table: np.ndarray, rows: np.ndarray, out: np.ndarray
) -> None:
    """Fill ``out`` with ``table[rows]`` by reading ``path`` block by block."""
    row_shape = table.shape[1:]
    row_bytes = table.dtype.itemsize * int(np.prod(row_shape, dtype=np.int64))
    buf = np.empty((GATHER_ROWS, *row_shape), dtype=table.dtype)
    done = 0
    with open(path, "rb") as f:
        while done < len(rows):
            lo = int(rows[done])
            hi = min(lo + GATHER_ROWS, table.shape[0])
            stop = done + int(np.searchsorted(rows[done:], hi))
            block = buf[: hi - lo]
            f.seek(offset + lo * row_bytes)
            want = (hi - lo) * row_bytes
            got = f.readinto(block.reshape(-1).view(np.uint8).data)
            if got != want:
                raise OSError(f"{path}: read {got} bytes at row {lo}, expected {want}")
            out[done:stop] = block[rows[done:stop] - lo]
            done = stop
