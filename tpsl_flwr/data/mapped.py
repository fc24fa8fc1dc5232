"""Columns of a memory-mapped table, gathered a batch at a time.

A Criteo/Avazu party view keeps its columns in the encoded cache's compact form
(int32 codes, float32 transformed counts; :mod:`~tpsl_flwr.data.ctr.cache`)
and reads only the rows a batch asks for: the party's memory then holds no
copy of its table, whatever the file's size (the mapped pages belong to the
page cache, which the kernel can drop). :class:`MappedColumns` is the array a
view hands out: ``len``, ``shape``, ``dtype`` and ``columns[rows]`` as a numpy
array do what they do on a plain array, and ``np.asarray(columns)``
materializes the whole table (for small data and tests only).

Numeric columns are standardized on the fly with the train mean and standard
deviation (:func:`column_stats`), with the arithmetic of
:func:`~tpsl_flwr.data.preprocess.standardize` (float64, then float32), so a
gathered row equals the row of the in-memory table bitwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["STATS_CHUNK_ROWS", "MappedColumns", "column_range", "column_stats"]

STATS_CHUNK_ROWS = 1 << 20
"""Rows per pass of :func:`column_stats` (8 MiB of float64 per column)."""
_REDUCE_CHUNK_ROWS = 1 << 16


def column_stats(
    table: np.ndarray, rows: np.ndarray, chunk_rows: int = STATS_CHUNK_ROWS
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation (zeros as 1) of ``table[rows]``, per column.

    At most ``chunk_rows`` rows at a time, each chunk gathered once for every
    column, so memory stays bounded whatever the rows. With ``len(rows) <=
    chunk_rows`` the numbers are those of
    :func:`~tpsl_flwr.data.preprocess.standardize` bitwise (one contiguous
    float64 column, ``mean`` then ``std``); beyond, the sums are taken per
    chunk (two passes: the mean, then the squared deviations).

    Parameters
    ----------
    table : np.ndarray
        ``(N, d)`` numeric table (e.g. a read-only memory map).
    rows : np.ndarray
        Row positions of the train records.
    chunk_rows : int
        Rows per pass.

    Returns
    -------
    mean, std : np.ndarray
        ``(d,)`` float64.

    Examples
    --------
    >>> t = np.arange(12, dtype=np.float32).reshape(6, 2)
    >>> m, s = column_stats(t, np.array([0, 2, 4]), chunk_rows=2)
    >>> m.tolist(), np.round(s, 6).tolist()
    ([4.0, 5.0], [3.265986, 3.265986])
    """
    d = table.shape[1]
    mean, std = np.zeros(d), np.ones(d)
    n = len(rows)
    if n == 0:
        return mean, std
    chunks = [rows[a : a + chunk_rows] for a in range(0, n, chunk_rows)]

    def columns(c: np.ndarray) -> list[np.ndarray]:
        block = table[c]  # one gather of the chunk for every column
        return [np.ascontiguousarray(block[:, j], dtype=np.float64) for j in range(d)]

    if len(chunks) == 1:
        for j, col in enumerate(columns(rows)):
            mean[j], std[j] = col.mean(), col.std()
    else:
        total = [0.0] * d
        for c in chunks:
            for j, col in enumerate(columns(c)):
                total[j] += float(col.sum())
        mean[:] = [t / n for t in total]
        sq = [0.0] * d
        for c in chunks:
            for j, col in enumerate(columns(c)):
                sq[j] += float(((col - mean[j]) ** 2).sum())
        std[:] = np.sqrt(np.asarray(sq) / n)
    std[std <= 0] = 1.0
    return mean, std


class MappedColumns:
    """Rows ``rows`` of a mapped ``(N, d)`` table, gathered on demand.

    Parameters
    ----------
    table : np.ndarray
        ``(N, d)`` source (a read-only memory map of the cache).
    rows : np.ndarray
        ``(n,)`` int64 positions in ``table``: row ``i`` here is
        ``table[rows[i]]`` (for a CTR view, the record ids themselves).
    dtype : numpy dtype
        dtype of the gathered rows (float32 numerics, int64 codes).
    mean, std : np.ndarray, optional
        ``(d,)`` float64 standardization, applied as ``(x - mean) / std`` in
        float64 before the cast.
    bounds : tuple of np.ndarray, optional
        Known per-column ``(min, max)`` of the whole ``table`` (from the cache,
        :func:`~tpsl_flwr.data.ctr.derived.cached_range`): :func:`column_range`
        then reads no row.

    Examples
    --------
    >>> t = np.arange(8, dtype=np.int32).reshape(4, 2)
    >>> c = MappedColumns(t, np.array([3, 1]), np.int64)
    >>> c.shape, c[np.array([1])].tolist(), np.asarray(c).dtype
    ((2, 2), [[2, 3]], dtype('int64'))
    """

    ndim = 2
    gathers_rows = True
    """Marks an array a non-label party gathers per batch (no full copy)."""

    def __init__(
        self,
        table: np.ndarray,
        rows: np.ndarray,
        dtype: np.dtype | type,
        mean: np.ndarray | None = None,
        std: np.ndarray | None = None,
        bounds: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        if table.ndim != 2:
            raise ValueError(f"table must be 2-d, got shape {table.shape}")
        self.table = table
        self.rows = rows
        self.dtype = np.dtype(dtype)
        self.mean = mean
        self.std = std
        self.bounds = bounds

    @property
    def shape(self) -> tuple[int, int]:
        """``(rows, columns)``."""
        return (len(self.rows), int(self.table.shape[1]))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key: Any) -> np.ndarray:
        """The rows at ``key`` (int array, slice or int) as a fresh array."""
        if isinstance(key, tuple):
            rows, cols = key
            return self[rows][:, cols]
        picked = self.rows[key]
        block = self.table[picked]
        if self.mean is None:
            return np.asarray(block, dtype=self.dtype)
        assert self.std is not None
        z = (np.asarray(block, dtype=np.float64) - self.mean) / self.std
        return z.astype(self.dtype)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self[: len(self.rows)]
        return out if dtype is None else out.astype(dtype, copy=False)

    def tobytes(self) -> bytes:
        """The materialized rows' bytes (as ``np.asarray(self).tobytes()``)."""
        return np.asarray(self).tobytes()

    def min(self, axis: int | None = None) -> Any:
        """Column minimum (``axis=0``), read chunk by chunk."""
        return self._reduce(np.min, axis)

    def max(self, axis: int | None = None) -> Any:
        """Column maximum (``axis=0``), read chunk by chunk."""
        return self._reduce(np.max, axis)

    def _reduce(self, op: Any, axis: int | None) -> Any:
        step = _REDUCE_CHUNK_ROWS
        parts = [op(self[a : a + step], axis=0) for a in range(0, len(self.rows), step)]
        out = op(np.stack(parts), axis=0)
        return out if axis == 0 else op(out)


def column_range(values: np.ndarray | MappedColumns) -> tuple[np.ndarray, np.ndarray]:
    """Per-column bounds of ``values``: their min and max, or known table bounds.

    A :class:`MappedColumns` with ``bounds`` answers with the bounds of its
    whole table (which contain its own rows) without reading a row.

    Examples
    --------
    >>> t = np.array([[4, 0], [1, 9], [2, 5]], dtype=np.int32)
    >>> [b.tolist() for b in column_range(MappedColumns(t, np.array([0, 2]), int))]
    [[2, 0], [4, 5]]
    >>> known = (np.array([1, 0]), np.array([4, 9]))
    >>> c = MappedColumns(t, np.array([0, 2]), int, bounds=known)
    >>> [b.tolist() for b in column_range(c)]
    [[1, 0], [4, 9]]
    """
    if isinstance(values, MappedColumns) and values.bounds is not None:
        return values.bounds
    return values.min(axis=0), values.max(axis=0)
