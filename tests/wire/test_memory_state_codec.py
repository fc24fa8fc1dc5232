"""Memory of the node state codec: one copy of the tensors' bytes, the same bytes."""

from __future__ import annotations

import tracemalloc
from collections import OrderedDict

import torch

from tpsl_flwr.wire.state_codec import decode_state, encode_state


def _reference_data(tensors: list[torch.Tensor]) -> bytes:
    """The codec's data as defined: each tensor's C-order bytes, back to back."""
    return b"".join(
        t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        for t in tensors
    )


def test_data_is_every_tensor_in_c_order_back_to_back() -> None:
    # Prepare: every kind of tensor the walk may meet, non-contiguous included
    g = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(3, 4, generator=g).t(),
        torch.randn(5, generator=g).to(torch.bfloat16),
        torch.tensor(3.5, dtype=torch.float64),
        torch.zeros(0, 3),
        torch.arange(12).reshape(3, 4)[:, ::2],
        torch.tensor([True, False, True]),
        torch.randn(2, generator=g, dtype=torch.complex64),
        torch.ones(2, dtype=torch.float16),
    ]
    state = OrderedDict((f"t{i}", t) for i, t in enumerate(tensors[:4])) | {
        "nested": {"x": [1, tuple(tensors[4:])]}
    }
    # Execute
    header, data = encode_state(state)
    restored = decode_state(header, data)
    # Assert
    assert data == _reference_data(tensors)
    assert all(
        torch.equal(a, b) and a.dtype == b.dtype
        for a, b in zip(
            [restored[f"t{i}"] for i in range(4)] + list(restored["nested"]["x"][1]),
            tensors,
            strict=True,
        )
    )


def test_encoding_copies_the_state_once() -> None:
    # Prepare: an embedding table with Adam's two moments (16 MiB of float32)
    g = torch.Generator().manual_seed(0)
    table = [torch.randn(65_536, 16, generator=g) for _ in range(4)]
    state = {"model": {"emb": table[0]}, "optimizer": {"state": {0: table[1:]}}}
    size = sum(t.numel() * t.element_size() for t in table)
    # Execute
    tracemalloc.start()
    try:
        _, data = encode_state(state)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Assert: the data itself plus < 5% (a copy per tensor before the join: 2x)
    assert len(data) == size
    assert peak < 1.05 * size, f"encoding peaked at {peak / size:.2f}x the state"
