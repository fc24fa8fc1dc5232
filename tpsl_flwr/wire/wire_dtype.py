"""The float dtype of embeddings and perturbed gradients on the wire (``wire-dtype``).

``float32`` (the default) sends the arrays as computed. ``float16`` halves the
bytes of every training message and reply: each float array is sent as a
power-of-two scale and float16 values, ``x ~ ldexp(h, -e)``, with ``e``
chosen so the array's largest magnitude lands in ``[2^14, 2^15)``. Scaling by
a power of two is exact, so the only error is float16's rounding: at most
``2^-11 |x|`` for every value within ``2^-29`` of the array's largest
magnitude (float16's normal range) and at most ``peak * 2^-38`` below that
(its subnormals). An array is one record of a message, every batch of the
message stacked (:mod:`~tpsl_flwr.wire.batch_pack`), so ``peak`` is the
message's. Without the scale, the perturbed gradients of a
mean-reduced loss (of order ``1 / batch``) would fall in float16's subnormal
range and lose most of their digits.

Privacy: the label party casts a gradient AFTER GradPerturb has perturbed it
(:func:`~tpsl_flwr.wire.label_side.step_message` reads the released gradient),
so the cast (and its scale, the perturbed array's own largest magnitude) is
post-processing of the label-DP release: TPSL's guarantee is on the
perturbed gradients (Yang et al., Theorem 4.2), and anything computed from
them alone keeps it (Dwork and Roth, Proposition 2.1). Epsilon is unchanged;
nothing else is derived from the labels.

Fail closed: a NaN or an infinity is refused before anything is encoded (a
non-finite gradient or embedding is never sent), and a decoded array must
have exactly the bytes its shape needs.
"""

from __future__ import annotations

import numpy as np

from tpsl_flwr.errors import ConfigError, ProtocolError

__all__ = [
    "FLOAT16",
    "FLOAT32",
    "WIRE_DTYPES",
    "check_wire_dtype",
    "decode_float16",
    "encode_float16",
]

FLOAT32 = "float32"
FLOAT16 = "float16"
WIRE_DTYPES: tuple[str, ...] = (FLOAT32, FLOAT16)
"""The valid values of ``wire-dtype``."""
_TOP_EXPONENT = 15
"""The largest magnitude is scaled into ``[2^14, 2^15)`` (float16's max: 65504)."""
_EXPONENT = np.dtype("<i2")
_HALF = np.dtype("<f2")


def check_wire_dtype(value: object) -> str:
    """``value`` if it is a valid ``wire-dtype``, else a ConfigError naming it.

    Examples
    --------
    >>> check_wire_dtype("float16")
    'float16'
    >>> check_wire_dtype("bfloat16")
    Traceback (most recent call last):
    ...
    tpsl_flwr.errors.ConfigError: wire-dtype must be one of ['float32', 'float16'], got 'bfloat16'
    """  # noqa: E501
    if value not in WIRE_DTYPES:
        raise ConfigError(
            f"wire-dtype must be one of {list(WIRE_DTYPES)}, got {value!r}"
        )
    return str(value)


def encode_float16(values: np.ndarray) -> bytes:
    """``values`` as a little-endian int16 exponent ``e`` and float16 ``x * 2^e``.

    Raises
    ------
    ProtocolError
        If ``values`` is not a float array or holds NaN or inf (nothing is
        encoded).

    Examples
    --------
    >>> x = np.array([1e-6, -3e-7, 0.0], dtype=np.float32)
    >>> y = decode_float16(encode_float16(x), x.shape)
    >>> bool(np.all(np.abs(y - x) <= 2.0**-11 * np.abs(x)))
    True
    """
    values = np.asarray(values)
    if values.dtype.kind != "f":
        raise ProtocolError(f"only float arrays go as float16, got {values.dtype}")
    values = values.astype(np.float32, copy=False)
    if not np.all(np.isfinite(values)):
        raise ProtocolError("refusing to send NaN or inf (wire-dtype = float16)")
    peak = float(np.max(np.abs(values))) if values.size else 0.0
    exponent = 0 if peak == 0.0 else _TOP_EXPONENT - int(np.frexp(peak)[1])
    # frexp: peak = m * 2^k with m in [0.5, 1), so peak * 2^(15 - k) < 2^15.
    scaled = np.ldexp(values, exponent).astype(_HALF)
    if not np.all(np.isfinite(scaled)):  # unreachable by construction; fail closed
        raise ProtocolError("float16 overflow while encoding (wire-dtype = float16)")
    return np.array(exponent, dtype=_EXPONENT).tobytes() + scaled.tobytes()


def decode_float16(data: bytes | memoryview, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 array of ``shape`` that :func:`encode_float16` encoded.

    Raises
    ------
    ProtocolError
        If ``data`` does not hold exactly an exponent and ``shape``'s values,
        or decodes to NaN or inf.
    """
    count = int(np.prod(shape, dtype=np.int64))
    expected = _EXPONENT.itemsize + count * _HALF.itemsize
    if len(data) != expected:
        raise ProtocolError(
            f"a float16 wire array of shape {shape} needs {expected} bytes, "
            f"got {len(data)}"
        )
    exponent = int(np.frombuffer(data, dtype=_EXPONENT, count=1)[0])
    half = np.frombuffer(data, dtype=_HALF, count=count, offset=_EXPONENT.itemsize)
    with np.errstate(over="ignore"):  # an overflow is refused just below
        values = np.ldexp(half.astype(np.float32), -exponent).reshape(shape)
    if not np.all(np.isfinite(values)):
        raise ProtocolError("a float16 wire array decodes to NaN or inf")
    return values
