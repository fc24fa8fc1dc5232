"""The categorical hash of :mod:`tpsl_flwr.data.ctr.hashing`, in plain Python integers.

A slow, obviously-correct statement of the documented formula (FNV-1a over the
column name, the separator byte and the token, a seed mixed in, then
MurmurHash3's ``fmix64``, then ``1 + h mod (buckets - 1)``; 0 for an empty
token), for tests to compare the vectorized paths against.
"""

from __future__ import annotations

__all__ = ["reference_hash"]

_MASK = (1 << 64) - 1


def reference_hash(token: bytes, column: str, buckets: int, seed: int = 0) -> int:
    """The bucket of ``token`` in ``column`` (0 for an empty token).

    Examples
    --------
    >>> reference_hash(b"", "C1", 1000)
    0
    >>> 1 <= reference_hash(b"abcd1234", "C1", 1000) < 1000
    True
    """
    if not token:
        return 0
    h = 0xCBF29CE484222325
    for b in column.encode() + b"\x1f" + token:
        h = ((h ^ b) * 0x100000001B3) & _MASK
    h ^= (seed * 0x9E3779B97F4A7C15) & _MASK
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & _MASK
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & _MASK
    h ^= h >> 33
    return 1 + h % (buckets - 1)
