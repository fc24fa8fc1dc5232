"""Vectorised text formatting for writing CTR files (no Python object per row).

Every field is a ``(rows, width)`` uint8 matrix of ASCII bytes padded with NUL
bytes; :func:`join_rows` lays the fields side by side with separators and a
newline and drops the padding with one boolean mask, which keeps row-major order.
A field that is all NUL is an empty field (a missing value).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["format_hex8", "format_ints", "join_rows"]

_HEX_PAIRS = np.frombuffer(
    b"".join(f"{i:02x}".encode() for i in range(256)), dtype=np.uint16
)
"""The two hex digits of every byte value as one uint16 (byte order kept by views)."""
_DIGITS = np.frombuffer(b"0123456789", dtype=np.uint8)
_MINUS = ord("-")


def format_ints(values: np.ndarray, missing: np.ndarray | None = None) -> np.ndarray:
    r"""Decimal text of integers, right-aligned in a NUL-padded byte matrix.

    Parameters
    ----------
    values : np.ndarray
        ``(n,)`` integers (any sign, ``|v| < 10**19``).
    missing : np.ndarray, optional
        ``(n,)`` bool; rows where it is True become an empty field.

    Returns
    -------
    np.ndarray
        ``(n, width)`` uint8 matrix, NUL where there is no character.

    Examples
    --------
    >>> m = format_ints(np.array([0, 42, -7]))
    >>> [bytes(r).replace(b"\0", b"") for r in m]
    [b'0', b'42', b'-7']
    """
    v = np.asarray(values, dtype=np.int64)
    neg = v < 0
    mag = np.abs(v).astype(np.uint64)
    top = int(mag.max()) if mag.size else 0
    width = max(len(str(top)), 1)
    out = np.zeros((v.shape[0], width + 1), dtype=np.uint8)
    rest = mag.copy()
    for k in range(width, 0, -1):
        out[:, k] = _DIGITS[(rest % np.uint64(10)).astype(np.intp)]
        rest //= np.uint64(10)
    # Blank the leading zeros: position k (0 = most significant) holds a digit only
    # when the number has at least width - k + 1 digits.
    ndig = np.ones(v.shape[0], dtype=np.int64)
    for d in range(1, width):
        ndig += mag >= np.uint64(10**d)
    first = width + 1 - ndig
    cols = np.arange(width + 1)
    out[cols[None, :] < first[:, None]] = 0
    out[np.flatnonzero(neg), first[neg] - 1] = _MINUS
    if missing is not None:
        out[np.asarray(missing, dtype=bool)] = 0
    return out


def format_hex8(values: np.ndarray, missing: np.ndarray | None = None) -> np.ndarray:
    """Eight lowercase hex digits of 32-bit values (Criteo's token shape).

    Parameters
    ----------
    values : np.ndarray
        ``(n,)`` integers; the low 32 bits are written.
    missing : np.ndarray, optional
        ``(n,)`` bool; rows where it is True become an empty field.

    Returns
    -------
    np.ndarray
        ``(n, 8)`` uint8 matrix.

    Examples
    --------
    >>> bytes(format_hex8(np.array([0x68FD1E64]))[0])
    b'68fd1e64'
    """
    v = (np.asarray(values).astype(np.uint64) & np.uint64(0xFFFFFFFF)).astype(">u4")
    out = _HEX_PAIRS[v.view(np.uint8)].view(np.uint8).reshape(-1, 8)
    if missing is not None:
        out[np.asarray(missing, dtype=bool)] = 0
    return out


def join_rows(fields: Sequence[np.ndarray], sep: bytes) -> bytes:
    r"""Join byte-matrix fields into text lines, ``sep`` between, newline after.

    Parameters
    ----------
    fields : sequence of np.ndarray
        ``(n, width_i)`` uint8 matrices, NUL-padded anywhere.
    sep : bytes
        One-byte field separator, e.g. ``b"\t"`` or ``b","``.

    Returns
    -------
    bytes
        ``n`` lines, each ending in ``\n``.

    Examples
    --------
    >>> join_rows([format_ints(np.array([1, 0])), format_hex8(np.array([255, 1]))],
    ...           b"\t")
    b'1\t000000ff\n0\t00000001\n'
    """
    if len(sep) != 1:
        raise ValueError(f"sep must be one byte, got {sep!r}")
    n = fields[0].shape[0]
    sep_col = np.full((n, 1), sep[0], dtype=np.uint8)
    parts: list[np.ndarray] = []
    for i, f in enumerate(fields):
        if i:
            parts.append(sep_col)
        parts.append(f)
    parts.append(np.full((n, 1), ord("\n"), dtype=np.uint8))
    mat = np.concatenate(parts, axis=1)
    return mat[mat != 0].tobytes()
