"""LabelParty's precomputed noise: the same gradients as drawing per batch."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tpsl_flwr.models import TopModel
from tpsl_flwr.parties import LabelParty, adam
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import make_mechanism

ROWS, WIDTH, BATCH = 300, 6, 32


def _parties(
    name: str, placement: str, reuse: bool, num_classes: int = 2
) -> tuple[LabelParty, LabelParty]:
    labels = np.random.default_rng(1).integers(0, num_classes, ROWS)
    outputs = 1 if num_classes == 2 else num_classes
    top = TopModel(
        WIDTH, (8,), num_outputs=outputs, generator=torch.Generator().manual_seed(0)
    )
    kwargs = {"sigma": 1.0} if name == "gaussian" else {"epsilon": 1.0}
    mechanism = make_mechanism(name, num_classes=num_classes, **kwargs)

    def party(cache_bytes: int) -> LabelParty:
        return LabelParty(
            copy.deepcopy(top),
            labels,
            mechanism,
            NoiseKey.from_seed(3),
            placement=placement,
            optimizer=adam(1e-2),
            reuse_noise=reuse,
            noise_cache_bytes=cache_bytes,
        )

    return party(2**30), party(0)


@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize("placement", ["logits", "cut"])
@pytest.mark.parametrize(
    ("name", "num_classes"),
    [("laplace", 2), ("discrete", 2), ("gaussian", 2), ("discrete", 5)],
)
def test_cached_noise_gives_bitwise_the_gradients_of_per_batch_draws(
    name: str, num_classes: int, placement: str, reuse: bool
) -> None:
    # Prepare
    cached, drawn = _parties(name, placement, reuse, num_classes)
    rng = np.random.default_rng(2)

    # Execute: two epochs of three batches each
    for epoch in range(2):
        for _ in range(3):
            ids = rng.choice(ROWS, BATCH, replace=False)
            emb = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(9))
            a = cached.train_step(ids, emb, epoch)
            b = drawn.train_step(ids, emb, epoch)

            # Assert
            assert torch.equal(a, b)
    for p, q in zip(cached.top.parameters(), drawn.top.parameters(), strict=True):
        assert torch.equal(p, q)
    assert cached._noise_cache and not drawn._noise_cache


def test_without_reuse_only_the_current_epochs_noise_is_kept() -> None:
    # Prepare
    party, _ = _parties("laplace", "cut", reuse=False)
    ids = np.arange(BATCH)
    emb = torch.zeros(BATCH, WIDTH)

    # Execute
    party.train_step(ids, emb, epoch=0)
    first = set(party._noise_cache)
    party.train_step(ids, emb, epoch=1)

    # Assert: transcript and top-update streams, of epoch 1 only
    assert len(first) == 2
    assert len(party._noise_cache) == 2 and not first & set(party._noise_cache)


def test_noise_over_the_cache_cap_is_drawn_per_batch() -> None:
    # Prepare: room for less than all samples' coefficients
    labels = np.zeros(ROWS, dtype=np.int64)
    party = LabelParty(
        TopModel(WIDTH, (8,), num_outputs=1),
        labels,
        make_mechanism("laplace", epsilon=1.0),
        NoiseKey.from_seed(3),
        noise_cache_bytes=ROWS * 2 * 8 - 1,
    )

    # Execute
    grad = party.train_step(np.arange(BATCH), torch.zeros(BATCH, WIDTH))

    # Assert
    assert grad.shape == (BATCH, WIDTH) and not party._noise_cache
