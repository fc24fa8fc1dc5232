"""Integer fields parse as the grammar ``-?[0-9]{1,18}`` says, on random fields."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pytest

from tpsl_flwr.data.ctr.parse import field_of, parse_ints

pytestmark = pytest.mark.usefixtures("kernel_backend")
_INT = re.compile(rb"-?[0-9]{1,18}")


def _ref(token: bytes) -> tuple[int, bool, bool]:
    """``(value, missing, bad)`` of one field, by the documented grammar."""
    if not token:
        return 0, True, False
    if _INT.fullmatch(token):
        return int(token), False, False
    return 0, False, True


def _fields(rng: np.random.Generator, n: int) -> list[bytes]:
    alphabet = b"0123456789-+ x\xff/:"
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.2:
            out.append(b"")
        elif r < 0.55:
            out.append(str(int(rng.integers(-(10**6), 10**7))).encode())
        elif r < 0.65:
            out.append(str(int(rng.integers(-(2**63), 2**63 - 1))).encode())
        elif r < 0.8:  # around the 18-digit limit, leading zeros included
            sign = b"-" if rng.random() < 0.5 else b""
            out.append(sign + b"0" * int(rng.integers(14, 20)) + b"7")
        else:
            size = int(rng.integers(1, 21))
            out.append(bytes(alphabet[j] for j in rng.integers(0, len(alphabet), size)))
    return out


@pytest.mark.parametrize("sliced", [False, True])
def test_parse_ints_matches_the_grammar(sliced: bool) -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        # Prepare
        tokens = _fields(rng, int(rng.integers(0, 60)))
        array = pa.array(tokens, pa.binary())
        if sliced and len(tokens) > 4:
            array = array.slice(2, len(tokens) - 3)
            tokens = tokens[2 : len(tokens) - 1]
        # Execute
        values, missing, bad = parse_ints(field_of(array))
        # Assert
        want = [_ref(t) for t in tokens]
        assert values.dtype == np.int64
        assert values.tolist() == [w[0] for w in want]
        assert missing.tolist() == [w[1] for w in want]
        assert bad.tolist() == [w[2] for w in want]
