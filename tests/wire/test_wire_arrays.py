"""Tests of the header-caching npy codec used for Flower Arrays on the wire."""

from __future__ import annotations

import io

import numpy as np
import pytest
from flwr.app import Array

from tpsl_flwr.wire.arrays import from_array, to_array

CASES = [
    np.arange(7, dtype=np.int64),
    np.random.default_rng(0).random((256, 16)).astype(np.float32),
    np.random.default_rng(1).random((3, 4, 5)),
    np.array(2.5),
    np.zeros((0, 4), dtype=np.float32),
    np.array([True, False]),
    np.arange(12, dtype=np.int32).reshape(3, 4).T,  # not contiguous
]


@pytest.mark.parametrize("values", CASES, ids=lambda v: f"{v.dtype}{v.shape}")
def test_arrays_are_flower_compatible_both_ways(values: np.ndarray) -> None:
    # Execute: twice each, so the second pass takes the cached header
    for _ in range(2):
        ours = to_array(values)
        flowers = Array(np.ascontiguousarray(values))
        back = from_array(flowers)

        # Assert: the same bytes and fields as Flower's, the same values back
        assert ours.data == flowers.data
        assert (ours.dtype, ours.shape, ours.stype) == (
            flowers.dtype,
            flowers.shape,
            flowers.stype,
        )
        np.testing.assert_array_equal(ours.numpy(), values)
        np.testing.assert_array_equal(back, values)
        assert back.dtype == values.dtype and back.flags.writeable


def test_fortran_ordered_npy_is_read_correctly() -> None:
    # Prepare: an .npy image with fortran_order True
    values = np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3))
    buffer = io.BytesIO()
    np.save(buffer, values)
    array = Array(
        dtype="float64", shape=(2, 3), stype="numpy.ndarray", data=buffer.getvalue()
    )

    # Execute / Assert (twice: such headers are never cached)
    for _ in range(2):
        np.testing.assert_array_equal(from_array(array), values)


def test_a_known_header_with_the_wrong_length_of_data_is_rejected() -> None:
    # Prepare: cache the header of a (4,) float32 array, then truncate its data
    good = to_array(np.ones(4, dtype=np.float32))
    from_array(good)
    bad = Array(dtype="float32", shape=(4,), stype="numpy.ndarray", data=good.data[:-4])

    # Execute / Assert: numpy's own reader decides, and refuses
    with pytest.raises(ValueError):
        from_array(bad)


def test_non_numpy_arrays_are_refused() -> None:
    # Prepare
    array = Array(dtype="float32", shape=(1,), stype="torch.raw", data=b"\0" * 4)

    # Execute / Assert
    with pytest.raises(TypeError, match=r"torch\.raw"):
        from_array(array)
