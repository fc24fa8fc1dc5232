"""Parse CTR fields straight from Arrow's binary buffers (numpy, no row objects).

A column of ``n`` fields arrives as one byte buffer and ``n + 1`` offsets (the
Arrow binary layout). Labels, integer counts and ``YYMMDDHH`` hours are parsed
with vectorised steps over byte *positions*, and every field that does not parse
is flagged, so the loader can name the first bad line and column or drop the bad
rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tpsl_flwr.data.ctr import kernels

__all__ = ["Field", "field_of", "parse_hours", "parse_ints", "parse_labels"]

_ZERO = ord("0")
_MINUS = ord("-")
_MAX_DIGITS = 18
"""Longest magnitude accepted (fits int64 without overflow checks)."""


@dataclass(frozen=True)
class Field:
    """One column of a chunk as raw bytes.

    Parameters
    ----------
    data : np.ndarray
        uint8 bytes of every field, back to back.
    offsets : np.ndarray
        ``(n + 1,)`` int64 offsets into ``data``.
    """

    data: np.ndarray
    offsets: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        """``(n,)`` field lengths in bytes."""
        return self.offsets[1:] - self.offsets[:-1]

    def text(self, i: int, limit: int = 40) -> str:
        """Field ``i`` decoded for an error message (cut at ``limit`` characters)."""
        raw = bytes(self.data[self.offsets[i] : self.offsets[i + 1]])
        s = raw.decode("utf-8", errors="replace")
        return s if len(s) <= limit else s[:limit] + "..."


def field_of(array: pa.Array) -> Field:
    """View an Arrow binary/string array (any slice) as a :class:`Field`.

    Parameters
    ----------
    array : pyarrow.Array
        A ``binary`` or ``string`` array without nulls.

    Returns
    -------
    Field
        Zero-copy views of its buffers.
    """
    _, off_buf, data_buf = array.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int32)
    offsets = offsets[array.offset : array.offset + len(array) + 1].astype(np.int64)
    data = np.zeros(1, dtype=np.uint8)
    if data_buf is not None and data_buf.size:
        data = np.frombuffer(data_buf, dtype=np.uint8)
    return Field(data, offsets)


def parse_labels(f: Field) -> tuple[np.ndarray, np.ndarray]:
    """Parse ``0``/``1`` labels.

    Parameters
    ----------
    f : Field
        The label column.

    Returns
    -------
    labels : np.ndarray
        ``(n,)`` int8 (0 where bad).
    bad : np.ndarray
        ``(n,)`` bool: the field is not exactly ``0`` or ``1``.
    """
    lengths = f.lengths
    first = f.data[np.minimum(f.offsets[:-1], f.data.size - 1)].astype(np.int16) - _ZERO
    bad = (lengths != 1) | (first < 0) | (first > 1)
    return np.where(bad, 0, first).astype(np.int8), bad


def parse_ints(f: Field) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parse optional decimal integers (``-?[0-9]{1,18}``; empty = missing).

    Parameters
    ----------
    f : Field
        An integer column.

    Returns
    -------
    values : np.ndarray
        ``(n,)`` int64 (0 where missing or bad).
    missing : np.ndarray
        ``(n,)`` bool: the field is empty.
    bad : np.ndarray
        ``(n,)`` bool: non-empty and not an integer.

    Examples
    --------
    >>> import pyarrow as pa
    >>> v, m, b = parse_ints(field_of(pa.array([b"12", b"", b"-3", b"x1"])))
    >>> v.tolist(), m.tolist(), b.tolist()
    ([12, 0, -3, 0], [False, True, False, False], [False, False, False, True])
    """
    if kernels.available():  # the same grammar in one compiled pass per field
        return kernels.parse_int_fields(f.data, f.offsets)
    return _parse_ints_with_numpy(f)


def _parse_ints_with_numpy(f: Field) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`parse_ints` in numpy steps, one per digit position."""
    starts = f.offsets[:-1]
    lengths = f.lengths
    missing = lengths == 0
    lead = f.data[np.minimum(starts, f.data.size - 1)]
    neg = ~missing & (lead == _MINUS)
    ndig = lengths - neg
    bad = ~missing & ((ndig == 0) | (ndig > _MAX_DIGITS))
    value = np.zeros(lengths.shape[0], dtype=np.int64)
    first = starts + neg
    # Digit k of every field that has one: the rows still active shrink fast
    # (most counts have one or two digits), so the work follows the characters.
    active = np.flatnonzero(ndig > 0)
    for k in range(_MAX_DIGITS):
        if not active.size:
            break
        byte = f.data[first[active] + k] - np.uint8(_ZERO)  # non-digits wrap past 9
        bad[active[byte > 9]] = True
        value[active] = value[active] * 10 + byte
        active = active[ndig[active] > k + 1]
    np.negative(value, out=value, where=neg)
    value[bad | missing] = 0
    return value, missing, bad


def parse_hours(f: Field) -> tuple[np.ndarray, np.ndarray]:
    """Parse Avazu's ``YYMMDDHH`` hours.

    Parameters
    ----------
    f : Field
        The hour column.

    Returns
    -------
    hours : np.ndarray
        ``(n,)`` int32 ``YYMMDDHH`` values (0 where bad).
    bad : np.ndarray
        ``(n,)`` bool: not 8 digits with a valid month, day and hour.
    """
    value, missing, bad = parse_ints(f)
    hh = value % 100
    dd = (value // 100) % 100
    mm = (value // 10_000) % 100
    bad = bad | missing | (f.lengths != 8) | (value < 0)
    bad |= (hh > 23) | (dd < 1) | (dd > 31) | (mm < 1) | (mm > 12)
    return np.where(bad, 0, value).astype(np.int32), bad
