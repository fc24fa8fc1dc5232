"""Compiled one-pass kernels for the CTR ingest's hash and integer parse (numba).

The numpy paths of :func:`~tpsl_flwr.data.ctr.hashing.hash_buckets_of` and
:func:`~tpsl_flwr.data.ctr.parse.parse_ints` run one array operation per byte
position or arithmetic step (about 30 per token for the hash), so a cold ingest
spends most of its encoding time in numpy calls over the same few kilobytes. The
kernels here walk each field once, byte by byte, and compute the same function
bit for bit (``tests/data/ctr/test_ctr_ingest_hashing.py`` and
``tests/data/ctr/test_ctr_ingest_parse.py`` check both paths against the documented
formula and grammar). They release the GIL, so the ingest's thread pool
(:mod:`tpsl_flwr.data.ctr.pool`) runs them on every core, and they are compiled
once per machine (numba's on-disk cache).

When numba is not installed or cannot be imported, or ``TPSL_FLWR_JIT=0`` is set,
:func:`available` is False and the callers keep their numpy paths: the codes and
values are the same, only slower.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from functools import lru_cache
from typing import Any

import numpy as np

__all__ = ["ENABLED", "available", "hash_fields", "parse_int_fields", "warm_up"]

LOG = logging.getLogger(__name__)
_FNV_PRIME = np.uint64(0x100000001B3)
_FMIX_1 = np.uint64(0xFF51AFD7ED558CCD)
_FMIX_2 = np.uint64(0xC4CEB9FE1A85EC53)
_MAX_DIGITS = 18
"""Longest magnitude accepted (as :mod:`tpsl_flwr.data.ctr.parse`)."""


ENABLED = (
    os.environ.get("TPSL_FLWR_JIT", "1").strip() != "0"
    and importlib.util.find_spec("numba") is not None
)
"""Whether the compiled kernels are used (numba installed, not disabled).

numba itself is imported, and the kernels loaded from its cache or compiled, at
the first call only: a start that reads a warm cache never pays for it."""


def _hash_fields(
    data: np.ndarray,
    offsets: np.ndarray,
    column_state: np.uint64,
    salt: np.uint64,
    modulus: np.uint64,
    out: np.ndarray,
) -> None:  # pragma: no cover - compiled; checked through hash_fields
    shift = np.uint64(33)
    one = np.uint64(1)
    for i in range(offsets.shape[0] - 1):
        lo = offsets[i]
        hi = offsets[i + 1]
        if hi == lo:
            out[i] = 0
            continue
        h = column_state
        for p in range(lo, hi):
            h = (h ^ np.uint64(data[p])) * _FNV_PRIME
        h ^= salt
        h ^= h >> shift
        h *= _FMIX_1
        h ^= h >> shift
        h *= _FMIX_2
        h ^= h >> shift
        out[i] = h % modulus + one


def _parse_int_fields(
    data: np.ndarray,
    offsets: np.ndarray,
    values: np.ndarray,
    missing: np.ndarray,
    bad: np.ndarray,
) -> None:  # pragma: no cover - compiled; checked through parse_int_fields
    zero = np.uint8(48)
    for i in range(offsets.shape[0] - 1):
        lo = offsets[i]
        hi = offsets[i + 1]
        values[i] = 0
        missing[i] = hi == lo
        bad[i] = False
        if hi == lo:
            continue
        neg = data[lo] == 45  # "-"
        start = lo + 1 if neg else lo
        ndig = hi - start
        if ndig == 0 or ndig > _MAX_DIGITS:
            bad[i] = True
            continue
        v = 0
        for p in range(start, hi):
            d = data[p] - zero  # uint8: a byte below "0" wraps past 9
            if d > 9:
                bad[i] = True
                break
            v = v * 10 + d
        if not bad[i]:
            values[i] = -v if neg else v


_COMPILE_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _compiled_once() -> tuple[Any, Any] | None:
    try:
        import numba
    except ImportError as exc:  # e.g. a numba built for another numpy
        LOG.warning("numba cannot be imported (%s): the CTR ingest uses numpy", exc)
        return None
    try:  # numba's on-disk cache: next to this module, else a per-user folder
        jit = numba.njit(cache=True, nogil=True)
        return jit(_hash_fields), jit(_parse_int_fields)
    except RuntimeError:  # no writable cache location: compile in memory
        jit = numba.njit(cache=False, nogil=True)
        return jit(_hash_fields), jit(_parse_int_fields)


def available() -> bool:
    """Whether the kernels run here: :data:`ENABLED` and numba imports.

    The first call imports numba (the encoding pool's threads may ask at the
    same moment; one imports). An import that fails is logged once and the
    callers keep their numpy paths.
    """
    if not ENABLED:
        return False
    with _COMPILE_LOCK:
        return _compiled_once() is not None


def _compiled() -> tuple[Any, Any]:
    """The two kernels, compiled (or loaded from numba's cache) once per process."""
    if not available():
        raise RuntimeError(
            "the compiled kernels are disabled (TPSL_FLWR_JIT=0, or numba missing)"
        )
    kernels = _compiled_once()
    assert kernels is not None  # available() said so
    return kernels


def warm_up() -> threading.Thread | None:
    """Import numba and load both kernels in a background thread.

    Loading takes ~0.4 s of one core (numba's import, then each kernel's
    machine code from the on-disk cache, or a compile the first time on this
    machine). A cold ingest starts it before the first chunk is parsed, so the
    parse goes on meanwhile instead of waiting for the first encoded chunk.

    Returns
    -------
    threading.Thread or None
        The loading thread (done when it is no longer alive); None when the
        kernels are disabled or already loaded.
    """
    if not ENABLED or _compiled_once.cache_info().currsize:
        return None  # disabled, or numba's import already tried
    thread = threading.Thread(target=_load_both, name="ctr-kernels", daemon=True)
    thread.start()
    return thread


def _load_both() -> None:
    """Call each kernel once on the argument types of the ingest (read-only data)."""
    data = np.zeros(1, dtype=np.uint8)
    data.setflags(write=False)  # Arrow's buffers arrive read-only
    offsets = np.zeros(2, dtype=np.int64)
    try:
        hash_fields(data, offsets, 0, 0, 2)
        parse_int_fields(data, offsets)
    except Exception:  # pragma: no cover - the real call raises it again
        return


def hash_fields(
    data: np.ndarray,
    offsets: np.ndarray,
    column_state: int,
    salt: int,
    buckets: int,
) -> np.ndarray:
    """Bucket codes of tokens stored back to back (the formula of ``hashing``).

    Parameters
    ----------
    data : np.ndarray
        uint8 bytes of all tokens.
    offsets : np.ndarray
        ``(n + 1,)`` int64 offsets into ``data``.
    column_state : int
        FNV-1a state after the column name and separator.
    salt : int
        ``seed * golden ratio`` modulo ``2**64``, xor-ed in before the finalizer.
    buckets : int
        Codes per column (at least 2).

    Returns
    -------
    np.ndarray
        ``(n,)`` int64 codes, 0 exactly for empty tokens.

    Raises
    ------
    RuntimeError
        If the kernels are not :data:`ENABLED` (callers check it first).
    """
    out = np.empty(offsets.shape[0] - 1, dtype=np.int64)
    _compiled()[0](
        data,
        offsets,
        np.uint64(column_state),
        np.uint64(salt),
        np.uint64(buckets - 1),
        out,
    )
    return out


def parse_int_fields(
    data: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parse ``-?[0-9]{1,18}`` fields (empty = missing) in one pass.

    Parameters
    ----------
    data : np.ndarray
        uint8 bytes of all fields.
    offsets : np.ndarray
        ``(n + 1,)`` int64 offsets into ``data``.

    Returns
    -------
    values, missing, bad : np.ndarray
        As :func:`tpsl_flwr.data.ctr.parse.parse_ints`.

    Raises
    ------
    RuntimeError
        If the kernels are not :data:`ENABLED`.
    """
    n = offsets.shape[0] - 1
    values = np.empty(n, dtype=np.int64)
    missing = np.empty(n, dtype=bool)
    bad = np.empty(n, dtype=bool)
    _compiled()[1](data, offsets, values, missing, bad)
    return values, missing, bad
