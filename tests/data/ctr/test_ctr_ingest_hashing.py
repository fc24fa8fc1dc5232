"""The hashing trick's fast paths give the codes of the documented formula, bit for bit.

A token's code is bound to the data (cached codes, label-set fingerprints and
noise keys), so the vectorised implementation is checked against the formula
written out in plain Python integers on many random tokens: Criteo's 8 hex
digits, empty (missing) fields, non-hex bytes, odd and mixed lengths, and the
Arrow layout of a sliced chunk (int32 offsets that do not start at 0).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from tpsl_flwr.data.ctr import kernels
from tpsl_flwr.data.ctr.hashing import fmix64, hash_buckets_of, hash_tokens
from tpsl_flwr.data.ctr.parse import field_of
from tpsl_flwr.testing.reference_hash import reference_hash

pytestmark = pytest.mark.usefixtures("kernel_backend")


def _tokens(rng: np.random.Generator, kind: str, n: int) -> list[bytes]:
    """``n`` random tokens of one kind, about one in six empty."""
    out = []
    for _ in range(n):
        if rng.random() < 0.17:
            out.append(b"")
        elif kind == "hex8":
            out.append(f"{int(rng.integers(0, 2**32)):08x}".encode())
        elif kind == "bytes8":  # fixed width, any byte (non-hex, NUL, 0xff)
            out.append(bytes(rng.integers(0, 256, size=8, dtype=np.uint8)))
        elif kind == "odd":  # fixed odd width
            out.append(bytes(rng.integers(33, 127, size=5, dtype=np.uint8)))
        else:  # mixed lengths 1..20
            size = int(rng.integers(1, 21))
            out.append(bytes(rng.integers(0, 256, size=size, dtype=np.uint8)))
    return out


@pytest.mark.parametrize("kind", ["hex8", "bytes8", "odd", "mixed"])
def test_codes_equal_the_formula_on_random_tokens(kind: str) -> None:
    # Prepare
    rng = np.random.default_rng(22)
    for trial, (buckets, seed) in enumerate(
        [(2, 0), (1000, 0), (2**15, 3), (2**31 - 1, 2**40 + 7), (97, -5)]
    ):
        tokens = _tokens(rng, kind, 400 + trial)
        # Execute
        got = hash_tokens(tokens, "C3", buckets, seed)
        # Assert
        assert got.dtype == np.int64
        assert got.tolist() == [reference_hash(t, "C3", buckets, seed) for t in tokens]


def test_sliced_arrow_chunk_with_int32_offsets() -> None:
    # Prepare: an Arrow chunk sliced away from its start (offsets start past 0)
    rng = np.random.default_rng(5)
    tokens = _tokens(rng, "hex8", 300)
    array = pa.array(tokens, pa.binary()).slice(37, 200)
    f = field_of(array)
    _, off_buf, data_buf = array.buffers()
    offsets32 = np.frombuffer(off_buf, dtype=np.int32)[37 : 37 + 201]
    data = np.frombuffer(data_buf, dtype=np.uint8)
    # Execute
    got64 = hash_buckets_of(f.data, f.offsets, "C9", 2**15)
    got32 = hash_buckets_of(data, offsets32, "C9", 2**15)
    # Assert
    want = [reference_hash(t, "C9", 2**15) for t in tokens[37:237]]
    assert got64.tolist() == want
    assert got32.tolist() == want


@pytest.mark.parametrize(
    "tokens",
    [[], [b""], [b"", b""], [b"00000000"], [b"", b"deadbeef", b""], [b"x"] * 3],
)
def test_edge_layouts(tokens: list[bytes]) -> None:
    # Execute
    got = hash_tokens(tokens, "C1", 1000).tolist()
    # Assert
    assert got == [reference_hash(t, "C1", 1000) for t in tokens]


def test_fixed_and_mixed_widths_agree_on_shared_tokens() -> None:
    # Prepare: the same hex tokens alone (fixed-width path) and among a longer
    # token (the per-position path)
    rng = np.random.default_rng(9)
    hexes = _tokens(rng, "hex8", 500)
    # Execute
    fixed = hash_tokens(hexes, "C20", 2**15)
    mixed = hash_tokens([*hexes, b"a-longer-token"], "C20", 2**15)[:-1]
    # Assert
    np.testing.assert_array_equal(fixed, mixed)


def test_fmix64_golden_and_input_untouched() -> None:
    # Prepare
    h = np.array([0, 1, 2**64 - 1], dtype=np.uint64)
    before = h.copy()
    # Execute
    mixed = fmix64(h)
    # Assert: MurmurHash3's finalizer (0 is its fixed point); the input is kept
    assert [hex(int(v)) for v in mixed[:2]] == ["0x0", "0xb456bcfc34c2cb2c"]
    np.testing.assert_array_equal(h, before)


def test_jit_can_be_switched_off_by_the_environment() -> None:
    # Execute: a fresh interpreter with TPSL_FLWR_JIT=0
    code = (
        "from tpsl_flwr.data.ctr import kernels\n"
        "from tpsl_flwr.data.ctr.hashing import hash_tokens\n"
        "print(kernels.ENABLED, hash_tokens(['68fd1e64', ''], 'C1', 1000).tolist())"
    )
    env = {**os.environ, "TPSL_FLWR_JIT": "0"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # Assert: the numpy path, the same codes
    assert out.split() == ["False", "[601,", "0]"]


def test_disabled_kernels_refuse_rather_than_guess(kernel_backend: str) -> None:
    # Execute / Assert: on the numpy path the kernel entry points say why not
    if kernel_backend == "compiled":
        got = kernels.hash_fields(np.zeros(1, np.uint8), np.zeros(2, np.int64), 0, 0, 2)
        assert got.tolist() == [0]  # one empty token
        return
    with pytest.raises(RuntimeError, match="TPSL_FLWR_JIT=0"):
        kernels.hash_fields(np.zeros(1, np.uint8), np.zeros(2, np.int64), 0, 0, 2)


def test_warm_up_loads_the_kernels_once(kernel_backend: str) -> None:
    # Execute
    loading = kernels.warm_up()
    # Assert: nothing to load on the numpy path; once loaded, no second thread
    if kernel_backend == "numpy":
        assert loading is None
        return
    if loading is not None:
        loading.join(timeout=120)
        assert not loading.is_alive()
    assert kernels.warm_up() is None


def test_a_numba_that_cannot_import_falls_back_to_numpy(
    kernel_backend: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Prepare: numba's import fails (as a numba built for another numpy would)
    if kernel_backend == "numpy":
        pytest.skip("the numpy path never imports numba")
    monkeypatch.setitem(sys.modules, "numba", None)
    kernels._compiled_once.cache_clear()
    try:
        # Execute
        got = hash_tokens(["68fd1e64", "", "05db9164"], "C1", 1000).tolist()
        # Assert: the same codes, the numpy path, said once in the log
        assert got == [601, 0, 966]
        assert not kernels.available()
        assert "numba cannot be imported" in caplog.text
    finally:
        monkeypatch.undo()
        kernels._compiled_once.cache_clear()
    assert kernels.available()
