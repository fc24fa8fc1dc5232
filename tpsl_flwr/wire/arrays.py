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

``to_array(values, "float16")`` sends a float array in the scaled float16 of
:mod:`~tpsl_flwr.wire.wire_dtype` instead (``wire-dtype = "float16"``: half the
bytes); :func:`from_array` reads either and always returns float32 for it.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from flwr.app import Array

from tpsl_flwr.wire.wire_dtype import (
    FLOAT16,
    check_wire_dtype,
    decode_float16,
    encode_float16,
)

__all__ = ["FLOAT16_STYPE", "from_array", "to_array"]

_NUMPY_STYPE = "numpy.ndarray"
FLOAT16_STYPE = "tpsl.float16-pow2"
"""``Array.stype`` of a scaled float16 array (:func:`encode_float16`'s bytes)."""
_MAX_HEADERS = 1024
_headers_by_layout: dict[tuple[str, tuple[int, ...]], bytes] = {}
_layouts_by_header: dict[bytes, tuple[np.dtype, tuple[int, ...]]] = {}


def to_array(values: np.ndarray, wire_dtype: str = "float32") -> Array:
    """A Flower ``Array`` holding ``values`` (as ``Array(values)`` would).

    With ``wire_dtype = "float16"`` a float array goes as scaled float16
    (:func:`~tpsl_flwr.wire.wire_dtype.encode_float16`; NaN or inf refused);
    other arrays (sample ids) go as they are.

    Examples
    --------
    >>> to_array(np.arange(3)).numpy().tolist()
    [0, 1, 2]
    """
    values = np.ascontiguousarray(values)
    if check_wire_dtype(wire_dtype) == FLOAT16 and values.dtype.kind == "f":
        return Array(
            dtype=FLOAT16,
            shape=tuple(values.shape),
            stype=FLOAT16_STYPE,
            data=encode_float16(values),
        )
    layout = (values.dtype.str, values.shape)
    header = _headers_by_layout.get(layout)
    if header is None:  # first of its layout (object arrays fail in np.save)
        buffer = io.BytesIO()
        np.save(buffer, values, allow_pickle=False)
        data = buffer.getvalue()
        header = data[: len(data) - values.nbytes]
        _remember(_headers_by_layout, layout, header)
    else:
        data = b"".join((header, values.data))  # one copy, not two
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
    ProtocolError
        If a scaled float16 array's bytes do not match its shape, or it
        decodes to NaN or inf.
    """
    if array.stype == FLOAT16_STYPE:
        return decode_float16(array.data, tuple(int(n) for n in array.shape))
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
