"""Per-row integer arrays in the narrowest dtype, and chunked passes over them.

What a run holds per row of the data grows with the file: record ids (a node's
and the label party's), labels, the training order. At the paper's scale
(Criteo's 45M rows, Sec. 5) int64 ids and labels cost 8 bytes a row each, per
party; int32 ids (files under 2**31 rows) and int8 labels (fewer than 128
classes) cost 4 and 1. Values are unchanged: whoever needs int64 (a batch on
the wire, the noise draw) widens one batch at a time.

One-off passes over every row (checks, fingerprints, split membership) run in
chunks of ``CHUNK_ROWS`` so that their temporaries stay bounded too.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = [
    "CHUNK_ROWS",
    "chunks",
    "compact_ids",
    "index_dtype",
    "is_strictly_increasing",
    "label_dtype",
    "true_positions",
]

CHUNK_ROWS = 1 << 20
"""Rows per chunk of a one-off pass (8 MB of int64)."""

_INT32_MIN, _INT32_MAX = np.iinfo(np.int32).min, np.iinfo(np.int32).max


def index_dtype(largest: int, smallest: int = 0) -> np.dtype:
    """int32 when every value in ``smallest .. largest`` fits, else int64.

    Examples
    --------
    >>> str(index_dtype(10)), str(index_dtype(2**31))
    ('int32', 'int64')
    """
    fits = _INT32_MIN <= int(smallest) and int(largest) <= _INT32_MAX
    return np.dtype(np.int32 if fits else np.int64)


def label_dtype(num_classes: int) -> np.dtype:
    """The narrowest signed dtype holding labels ``0 .. num_classes - 1``.

    Examples
    --------
    >>> str(label_dtype(2)), str(label_dtype(1000)), str(label_dtype(2**20))
    ('int8', 'int16', 'int32')
    """
    for dtype in (np.int8, np.int16, np.int32):
        if num_classes - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.int64)


def chunks(n: int, size: int = CHUNK_ROWS) -> Iterator[slice]:
    """Consecutive slices covering ``0 .. n - 1``, ``size`` rows each.

    Examples
    --------
    >>> list(chunks(5, 2))
    [slice(0, 2, None), slice(2, 4, None), slice(4, 5, None)]
    """
    for start in range(0, int(n), int(size)):
        yield slice(start, min(start + int(size), int(n)))


def compact_ids(ids: np.ndarray) -> np.ndarray:
    """A read-only copy of integer ids in :func:`index_dtype` (values unchanged).

    A read-only memory map already of that dtype is returned as it is.

    Examples
    --------
    >>> out = compact_ids(np.array([0, 5, 9]))
    >>> str(out.dtype), out.tolist(), out.flags.writeable
    ('int32', [0, 5, 9], False)
    """
    arr = np.asarray(ids)
    bounds = (int(arr.max()), int(arr.min())) if arr.size else (0, 0)
    dtype = index_dtype(*bounds)
    if isinstance(ids, np.memmap) and ids.mode == "r" and ids.dtype == dtype:
        return ids  # a read-only map is frozen already: no anonymous copy
    out = np.array(arr, dtype=dtype)
    out.setflags(write=False)
    return out


def is_strictly_increasing(values: np.ndarray) -> bool:
    """Whether ``values[i] < values[i + 1]`` for all ``i`` (chunked, no full diff).

    Examples
    --------
    >>> is_strictly_increasing(np.array([1, 4, 9])), is_strictly_increasing(
    ...     np.array([1, 1]))
    (True, False)
    """
    n = values.shape[0]
    for part in chunks(max(n - 1, 0)):
        if not (values[part.start + 1 : part.stop + 1] > values[part]).all():
            return False
    return True


def true_positions(mask: np.ndarray) -> np.ndarray:
    """``np.flatnonzero(mask)`` in :func:`index_dtype`, built chunk by chunk.

    Examples
    --------
    >>> out = true_positions(np.array([True, False, True]))
    >>> str(out.dtype), out.tolist()
    ('int32', [0, 2])
    """
    dtype = index_dtype(max(mask.size - 1, 0))
    parts = [
        (np.flatnonzero(mask[part]) + part.start).astype(dtype)
        for part in chunks(mask.size)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
