r"""The hashing trick and the count transform of the CTR loaders.

**Hashing.** A categorical token (the bytes of one field, e.g. Criteo's
``"68fd1e64"``) of column ``name`` goes to bucket

    h = fmix64(fnv1a64(name + "\x1f" + token) ^ (seed * 0x9E3779B97F4A7C15))
    code = 1 + h mod (buckets - 1)

with ``fnv1a64`` the 64-bit FNV-1a hash (offset basis ``0xcbf29ce484222325``, prime
``0x100000001b3``) and ``fmix64`` MurmurHash3's 64-bit finalizer, all arithmetic
modulo ``2**64``. Code 0 is kept for a missing (empty) field, so a column hashed
into ``buckets`` codes has cardinality ``buckets``. The function depends on nothing
but the bytes, the column name and the seed: the same token gets the same code in
every run, on every machine and in any language (Python's ``hash()`` of a string is
salted per process and is never used). Putting the column name in the hash makes
the same token in two columns independent draws. The loop runs over byte
*positions* (at most the longest token), each step vectorised over every row.

**Counts.** Integer count columns ``x`` become ``sign(x) * log(1 + |x|)``: the
``log1p`` transform DLRM applies to Criteo's counts, extended to keep the sign of
the few negative values (Criteo's ``I2`` holds -1, -2, -3) instead of clipping
them; a missing count becomes 0 after the transform.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from tpsl_flwr.data.ctr import kernels

__all__ = [
    "DEFAULT_HASH_BUCKETS",
    "count_transform",
    "fmix64",
    "hash_buckets_of",
    "hash_tokens",
]

DEFAULT_HASH_BUCKETS = 2**15
"""Codes per hashed column (code 0 = missing) unless told otherwise."""

_MASK = (1 << 64) - 1
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = np.uint64(0x100000001B3)
_GOLDEN = 0x9E3779B97F4A7C15
_SEPARATOR = 0x1F
"""ASCII unit separator between the column name and the token."""
_FMIX_1 = np.uint64(0xFF51AFD7ED558CCD)
_FMIX_2 = np.uint64(0xC4CEB9FE1A85EC53)
_SHIFT_33 = np.uint64(33)


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer (a bijection that mixes every bit).

    Parameters
    ----------
    h : np.ndarray
        uint64 values.

    Returns
    -------
    np.ndarray
        uint64 mixed values.

    Examples
    --------
    >>> hex(int(fmix64(np.array([1], dtype=np.uint64))[0]))
    '0xb456bcfc34c2cb2c'
    """
    h = np.asarray(h, dtype=np.uint64).copy()
    _fmix64_inplace(h, np.empty_like(h))
    return h


def _fmix64_inplace(h: np.ndarray, tmp: np.ndarray) -> None:
    """:func:`fmix64` of ``h`` in place (``tmp``: scratch of the same shape)."""
    for mult in (_FMIX_1, _FMIX_2):
        np.right_shift(h, _SHIFT_33, out=tmp)
        np.bitwise_xor(h, tmp, out=h)
        np.multiply(h, mult, out=h)
    np.right_shift(h, _SHIFT_33, out=tmp)
    np.bitwise_xor(h, tmp, out=h)


@lru_cache(maxsize=1024)
def _column_state(column: str) -> int:
    """FNV-1a state after the column name and the separator byte."""
    state = _FNV_OFFSET
    for byte in column.encode("utf-8") + bytes([_SEPARATOR]):
        state = ((state ^ byte) * int(_FNV_PRIME)) & _MASK
    return state


def hash_buckets_of(
    data: np.ndarray,
    offsets: np.ndarray,
    column: str,
    buckets: int,
    seed: int = 0,
) -> np.ndarray:
    """Bucket codes of ``n`` tokens stored back to back (Arrow string layout).

    Parameters
    ----------
    data : np.ndarray
        uint8 bytes of all tokens, concatenated.
    offsets : np.ndarray
        ``(n + 1,)`` non-decreasing integer offsets: token ``i`` is
        ``data[offsets[i]:offsets[i+1]]``.
    column : str
        Column name (part of the hash).
    buckets : int
        Codes per column, at least 2; code 0 is an empty token.
    seed : int
        Hash seed (0 by default); another seed gives independent buckets.

    Returns
    -------
    np.ndarray
        ``(n,)`` int64 codes in ``[0, buckets)``; 0 exactly for empty tokens.

    Notes
    -----
    When every non-empty token has the same length (Criteo's 8 hex digits), the
    tokens are consecutive rows of one ``(k, width)`` byte matrix: a view of
    ``data``, hashed column by column in place, with no gather and no index
    array. Other columns (Avazu's) take one masked step per byte position.
    Both compute the formula of the module docstring, bit for bit, as does the
    compiled kernel used instead when :func:`kernels.available` (one pass per token,
    :mod:`tpsl_flwr.data.ctr.kernels`).
    """
    off = np.asarray(offsets)
    if off.dtype != np.int64:
        off = off.astype(np.int64)
    if kernels.available():
        salt = (int(seed) * _GOLDEN) & _MASK
        raw = np.asarray(data, dtype=np.uint8)
        return kernels.hash_fields(raw, off, _column_state(column), salt, buckets)
    return _hash_with_numpy(data, off, column, buckets, seed)


def _hash_with_numpy(
    data: np.ndarray, off: np.ndarray, column: str, buckets: int, seed: int
) -> np.ndarray:
    """:func:`hash_buckets_of` in numpy steps (``off``: int64 offsets)."""
    starts = off[:-1]
    lengths = off[1:] - starts
    n = lengths.shape[0]
    column_state = np.uint64(_column_state(column))
    nonempty = lengths != 0
    k = int(np.count_nonzero(nonempty))
    raw = np.asarray(data, dtype=np.uint8)
    width = int(lengths.max()) if n else 0
    if k and int(lengths[nonempty].min()) == width:
        # Every token has the same length: row i of the matrix is token i.
        first = int(off[0])
        mat = raw[first : first + k * width].reshape(k, width)
        sub = np.full(k, column_state, dtype=np.uint64)
        for j in range(width):
            np.bitwise_xor(sub, mat[:, j], out=sub)
            np.multiply(sub, _FNV_PRIME, out=sub)
        if k == n:
            state = sub
        else:
            state = np.full(n, column_state, dtype=np.uint64)
            state[nonempty] = sub
    else:
        state = np.full(n, column_state, dtype=np.uint64)
        for j in range(width):
            active = lengths > j
            byte = raw[np.where(active, starts + j, 0)].astype(np.uint64)
            state = np.where(active, (state ^ byte) * _FNV_PRIME, state)
    salt = (int(seed) * _GOLDEN) & _MASK
    if salt:
        np.bitwise_xor(state, np.uint64(salt), out=state)
    tmp = np.empty_like(state)
    _fmix64_inplace(state, tmp)
    # h mod m as h - (h // m) * m: numpy divides by a scalar without a division
    # instruction per element, several times faster than ``%`` (same result).
    m = np.uint64(buckets - 1)
    np.floor_divide(state, m, out=tmp)
    np.multiply(tmp, m, out=tmp)
    np.subtract(state, tmp, out=state)
    codes = state.view(np.int64)  # < 2**31 after the modulo: same values
    codes += 1
    if k != n:
        codes[~nonempty] = 0
    return codes


def hash_tokens(
    tokens: Sequence[str | bytes], column: str, buckets: int, seed: int = 0
) -> np.ndarray:
    """Bucket codes of a few tokens given as Python strings (tests, look-ups).

    Parameters
    ----------
    tokens : sequence of str or bytes
        Field values as they appear in the file (``""`` = missing).
    column : str
        Column name.
    buckets : int
        Codes per column, at least 2.
    seed : int
        Hash seed.

    Returns
    -------
    np.ndarray
        ``(len(tokens),)`` int64 codes, equal to what the loaders produce.

    Examples
    --------
    >>> hash_tokens(["68fd1e64", "", "05db9164"], "C1", 1000).tolist()
    [601, 0, 966]
    """
    raw = [t.encode("utf-8") if isinstance(t, str) else bytes(t) for t in tokens]
    offsets = np.zeros(len(raw) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(t) for t in raw])
    data = np.frombuffer(b"".join(raw), dtype=np.uint8)
    return hash_buckets_of(data, offsets, column, buckets, seed)


def count_transform(values: np.ndarray, missing: np.ndarray) -> np.ndarray:
    """``sign(x) * log1p(|x|)`` of integer counts, 0 where missing.

    Parameters
    ----------
    values : np.ndarray
        ``(n,)`` integer counts (any value where ``missing``).
    missing : np.ndarray
        ``(n,)`` bool.

    Returns
    -------
    np.ndarray
        ``(n,)`` float32.

    Examples
    --------
    >>> count_transform(np.array([0, 1, -2, 5]), np.array([0, 0, 0, 1], bool))
    array([ 0.       ,  0.6931472, -1.0986123,  0.       ], dtype=float32)
    """
    x = np.asarray(values, dtype=np.float64)
    out = np.sign(x) * np.log1p(np.abs(x))
    out[np.asarray(missing, dtype=bool)] = 0.0
    return out.astype(np.float32)
