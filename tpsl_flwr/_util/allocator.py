"""The glibc allocator, told to give freed memory back: fixed mmap and trim thresholds.

A training process allocates and frees the same few hundred MB every step
(activations, gradients, the optimizer's update, the node's encoded state).
glibc serves a block under its *dynamic* mmap threshold from the heap, and
raises that threshold (up to 32 MiB on 64-bit) each time it frees a mapped
block; freed heap blocks then stay resident, at the level of the largest
transient so far (``bench/README.md``, "Memory per row"). A fixed threshold
(``mallopt``'s ``M_MMAP_THRESHOLD``, which also turns the dynamic adjustment
off) maps every block above it on allocation and unmaps it on free, so no
freed large block stays resident; ``M_TRIM_THRESHOLD`` gives the heap's free
top back too.

That costs speed: every large block is then fresh pages, faulted in on first
touch. Measured side by side (``bench/scale_rows.py --malloc both``, in-process
Criteo, batch 1,024, audit on, 2 loaded CPUs), 1 MiB thresholds cut the peak by
130-320 MB at 0.5M-2M rows and trained at 0.6-0.75x glibc's samples/s (4 MiB:
0.8x). So it is opt-in, for runs that are short of memory rather than of time:
``TPSL_FLWR_MALLOC=lean`` in the environment of a process that calls
:func:`tune_allocator` (the local engine of ``simulate``/``run_experiment``
does, at its start). Unset, or ``glibc``, leaves glibc's defaults; so does any
other C library, and so does an allocator already chosen from the environment
(glibc's ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_`` or
``GLIBC_TUNABLES``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Mapping

__all__ = [
    "MALLOC_ENV",
    "MMAP_THRESHOLD",
    "TRIM_THRESHOLD",
    "allocator_choice",
    "trim_heap",
    "tune_allocator",
]

MMAP_THRESHOLD = 1 << 20
"""Blocks of at least 1 MiB are mapped and unmapped on their own.

A batch's activations and gradients (1,024 rows x a few hundred float32) and
each embedding table's state are above it; the many small tensors of autograd
stay on the heap, where reuse is fast.
"""
TRIM_THRESHOLD = 1 << 20
"""The heap's free top is given back once it exceeds 1 MiB."""
MALLOC_ENV = "TPSL_FLWR_MALLOC"
"""``lean`` tunes the allocator; ``glibc`` (or unset) leaves glibc's defaults."""

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_GLIBC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")
_applied: tuple[int, int] | None = None


def allocator_choice(environ: Mapping[str, str]) -> str | None:
    """Why the allocator is left alone under ``environ``, or None to tune it.

    Parameters
    ----------
    environ
        The process environment.

    Returns
    -------
    str | None
        ``TPSL_FLWR_MALLOC`` unless it asks for ``lean``; else the glibc
        variable that already decides (the user's own choice wins); else None.

    Raises
    ------
    ValueError
        If ``TPSL_FLWR_MALLOC`` is set to something other than ``lean`` or
        ``glibc``.

    Examples
    --------
    >>> allocator_choice({})
    'TPSL_FLWR_MALLOC'
    >>> allocator_choice({"TPSL_FLWR_MALLOC": "lean"}) is None
    True
    >>> allocator_choice({"TPSL_FLWR_MALLOC": "lean", "MALLOC_TRIM_THRESHOLD_": "0"})
    'MALLOC_TRIM_THRESHOLD_'
    """
    choice = environ.get(MALLOC_ENV, "glibc")
    if choice not in ("lean", "glibc"):
        raise ValueError(f"{MALLOC_ENV} must be 'lean' or 'glibc', got {choice!r}")
    if choice == "glibc":
        return MALLOC_ENV
    return next((name for name in _GLIBC_ENV if name in environ), None)


def tune_allocator(
    *,
    mmap_threshold: int = MMAP_THRESHOLD,
    trim_threshold: int = TRIM_THRESHOLD,
    environ: Mapping[str, str] | None = None,
) -> bool:
    """Fix glibc's mmap and trim thresholds if the environment opts in.

    Call it once at the start of a process that trains; with
    ``TPSL_FLWR_MALLOC=lean`` it affects every later allocation of the
    process (not the blocks already held). Calling it again with the same
    values does nothing more.

    Parameters
    ----------
    mmap_threshold
        Blocks of at least this many bytes are mapped on their own
        (``M_MMAP_THRESHOLD``; glibc accepts at most 32 MiB on 64-bit).
    trim_threshold
        The heap's free top above this many bytes is given back
        (``M_TRIM_THRESHOLD``).
    environ
        The environment to read the user's choice from (default:
        ``os.environ``); see :func:`allocator_choice`.

    Returns
    -------
    bool
        True if glibc's ``mallopt`` accepted both settings; False without
        ``TPSL_FLWR_MALLOC=lean``, on another C library, or when glibc's own
        variables already chose.

    Raises
    ------
    ValueError
        If a threshold is negative or ``mmap_threshold`` is over 32 MiB, or
        ``TPSL_FLWR_MALLOC`` is malformed.
    """
    global _applied
    if not 0 <= mmap_threshold <= 32 << 20:
        raise ValueError(f"mmap_threshold must be in [0, 32 MiB], got {mmap_threshold}")
    if trim_threshold < 0:
        raise ValueError(f"trim_threshold must be >= 0, got {trim_threshold}")
    if allocator_choice(os.environ if environ is None else environ) is not None:
        return False
    if _applied == (mmap_threshold, trim_threshold):
        return True
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, mmap_threshold) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, trim_threshold) == 1 and ok
    _applied = (mmap_threshold, trim_threshold) if ok else None
    return ok


def trim_heap() -> bool:
    """Give the heap's free pages back to the system (glibc ``malloc_trim(0)``).

    For a phase that frees large blocks it will not reuse soon (the
    evaluation query frees each chunk's embeddings, issue 22): glibc keeps
    freed heap blocks resident otherwise, so the resident set grows with the
    number of chunks. A few milliseconds; allocations and values unchanged.

    Returns
    -------
    bool
        True if glibc was asked (whether or not it had pages to give back);
        False on another C library.
    """
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim.argtypes = (ctypes.c_size_t,)
    libc.malloc_trim.restype = ctypes.c_int
    libc.malloc_trim(0)
    return True


def _glibc() -> ctypes.CDLL | None:
    """The C library if it is glibc, else None."""
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):  # not a glibc system
        return None
    name = ctypes.util.find_library("c") if version.startswith("glibc") else None
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def _glibc_mallopt() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """The C library's ``int mallopt(int, int)`` if it is glibc, else None."""
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):  # not a glibc system
        return None
    if not version.startswith("glibc"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt
