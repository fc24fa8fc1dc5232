"""NumPy arrays <-> Flower ``Array`` without re-parsing the same header each step.

Flower's ``Array(ndarray)`` and ``Array.numpy()`` write and read the ``.npy``
format through ``np.save``/``np.load``; reading parses the header text with
``ast`` every time, which costs more than the small arrays of a split-learning
step (sample ids, one batch's embeddings or gradients) themselves. These
functions produce and accept exactly the same bytes, Flower-compatible both
ways, but remember each distinct header: a header seen before (the same dtype
and shape, every step) maps straight to ``np.frombuffer``. Headers are only
ever interpreted by NumPy itself, so a malformed or unusual one takes
``np.load``'s path and errors.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from flwr.app import Array

__all__ = ["from_array", "to_array"]

_NUMPY_STYPE = "numpy.ndarray"
_MAX_HEADERS = 1024
_headers_by_layout: dict[tuple[str, tuple[int, ...]], bytes] = {}
_layouts_by_header: dict[bytes, tuple[np.dtype, tuple[int, ...]]] = {}


def to_array(values: np.ndarray) -> Array:
    """A Flower ``Array`` holding ``values`` (as ``Array(values)`` would).

    Examples
    --------
    >>> to_array(np.arange(3)).numpy().tolist()
    [0, 1, 2]
    """
    values = np.ascontiguousarray(values)
    layout = (values.dtype.str, values.shape)
    header = _headers_by_layout.get(layout)
    if header is None:  # first of its layout (object arrays fail in np.save)
        buffer = io.BytesIO()
        np.save(buffer, values, allow_pickle=False)
        data = buffer.getvalue()
        header = data[: len(data) - values.nbytes]
        _remember(_headers_by_layout, layout, header)
    else:
        data = header + values.tobytes()
    return Array(
        dtype=str(values.dtype),
        shape=tuple(values.shape),
        stype=_NUMPY_STYPE,
        data=data,
    )


def from_array(array: Array) -> np.ndarray:
    """``array`` as a writable NumPy array (as ``array.numpy()`` returns it).

    Raises
    ------
    TypeError
        If ``array`` was not serialized from a NumPy array.
    ValueError
        If its bytes are not a valid ``.npy`` image (from ``np.load``).
    """
    if array.stype != _NUMPY_STYPE:
        raise TypeError(f"unsupported array serialization {array.stype!r}")
    data = array.data
    header = _npy_v1_header(data)
    layout = None if header is None else _layouts_by_header.get(header)
    if header is not None and layout is not None:
        dtype, shape = layout
        count = int(np.prod(shape, dtype=np.int64))
        expected = len(header) + count * dtype.itemsize
        if len(data) == expected:
            flat = np.frombuffer(data, dtype=dtype, count=count, offset=len(header))
            return flat.reshape(shape).copy()
    values = np.load(io.BytesIO(data), allow_pickle=False)
    if header is not None and values.flags.c_contiguous:
        _remember(_layouts_by_header, header, (values.dtype, values.shape))
    return values


def _npy_v1_header(data: bytes) -> bytes | None:
    """The magic, version and header text of a version 1.0 ``.npy`` image."""
    if len(data) < 10 or data[:8] != b"\x93NUMPY\x01\x00":
        return None
    end = 10 + int.from_bytes(data[8:10], "little")
    return data[:end] if len(data) >= end else None


def _remember(cache: dict[Any, Any], key: object, value: object) -> None:
    if len(cache) >= _MAX_HEADERS:
        cache.clear()
    cache[key] = value
