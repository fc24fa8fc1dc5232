"""Tests of the torch bottom and top models."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch import nn

from tpsl_flwr.data import (
    PartyFeatures,
    binary_auc,
    load_dataset,
    partition_columns,
    party_features,
)
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.models import EMBEDDING_SD, BottomModel, TopModel, num_outputs_for

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _sgd_step(params: list[nn.Parameter], lr: float) -> None:
    # Plain SGD by hand: constructing any torch.optim optimizer imports
    # torch._dynamo (2-3 s), which would dominate this file's run time.
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p -= lr * p.grad
                p.grad = None


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _mlp_params(widths: list[int]) -> int:
    return sum(a * b + b for a, b in itertools.pairwise(widths))


def test_num_outputs_for() -> None:
    assert num_outputs_for(2) == 1
    assert num_outputs_for(3) == 3
    assert num_outputs_for(10) == 10
    for bad in (1, 0, 2.0, True):
        with pytest.raises(ConfigError, match=repr(bad)):
            num_outputs_for(bad)  # type: ignore[arg-type]


def test_bottom_model_shapes_and_single_embedding_table() -> None:
    # Prepare
    cards = [3, 7, 11, 2]
    f = BottomModel(5, cards, embedding_dim=4, hidden=(32, 16), out_dim=8)
    # Execute
    out = f(torch.randn(9, 5), torch.zeros(9, 4, dtype=torch.long))
    # Assert
    assert out.shape == (9, 8)
    embeddings = [m for m in f.modules() if isinstance(m, nn.Embedding)]
    assert len(embeddings) == 1
    assert embeddings[0].weight.shape == (sum(cards), 4)
    n_params = sum(p.numel() for p in f.parameters())
    assert n_params == sum(cards) * 4 + _mlp_params([5 + 4 * 4, 32, 16, 8])
    # module tree: self, embedding, Sequential, 3 Linear, 2 ReLU
    assert len(list(f.modules())) == 8
    # offsets are a buffer but not part of the exchanged state
    assert f.offsets.tolist() == [0, 3, 10, 21]
    assert "offsets" not in f.state_dict()


def test_bottom_model_offsets_route_each_column_to_its_rows() -> None:
    # Prepare
    f = BottomModel(1, [3, 4], embedding_dim=2, hidden=(), out_dim=3, generator=_gen(0))
    numeric = torch.tensor([[0.5], [-1.0]])
    codes = torch.tensor([[2, 0], [1, 3]])
    # Execute
    out = f(numeric, codes)
    # Assert: equals a hand-built lookup into the one table
    table = f.embedding.weight  # type: ignore[union-attr]
    emb = torch.cat([table[codes[:, 0]], table[3 + codes[:, 1]]], dim=1)
    linear = f.mlp[0]
    assert isinstance(linear, nn.Linear)
    expected = torch.cat([numeric, emb], dim=1) @ linear.weight.T + linear.bias
    assert torch.allclose(out, expected, atol=1e-6)


def test_bottom_model_zero_numeric_or_zero_categorical() -> None:
    only_cat = BottomModel(0, [4, 5], out_dim=6)
    only_num = BottomModel(3, [], out_dim=6)
    assert only_cat(torch.zeros(2, 0), torch.ones(2, 2, dtype=torch.long)).shape == (
        2,
        6,
    )
    assert only_num(torch.zeros(2, 3), torch.zeros(2, 0, dtype=torch.long)).shape == (
        2,
        6,
    )
    assert only_num.embedding is None
    assert sum(p.numel() for p in only_num.parameters()) == _mlp_params([3, 64, 6])


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"num_numeric": 0, "cardinalities": []}, "at least one column"),
        ({"num_numeric": -1}, "num_numeric must be >= 0, got -1"),
        ({"num_numeric": 2.5}, "num_numeric must be an int, got 2.5"),
        ({"cardinalities": [3, 0]}, "cardinalities[1] must be >= 1, got 0"),
        ({"embedding_dim": 0}, "embedding_dim must be >= 1, got 0"),
        ({"hidden": (8, -4)}, "hidden[1] must be >= 1, got -4"),
        ({"hidden": 8}, "hidden must be a sequence of ints, got 8"),
        ({"out_dim": 0}, "out_dim must be >= 1, got 0"),
    ],
)
def test_bottom_model_rejects_bad_sizes(kwargs: dict, needle: str) -> None:
    args = {"num_numeric": 2, "cardinalities": [3], **kwargs}
    with pytest.raises(ConfigError) as info:
        BottomModel(**args)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"in_dim": 0}, "in_dim must be >= 1, got 0"),
        ({"num_outputs": 0}, "num_outputs must be >= 1, got 0"),
        ({"hidden": (0,)}, "hidden[0] must be >= 1, got 0"),
    ],
)
def test_top_model_rejects_bad_sizes(kwargs: dict, needle: str) -> None:
    args = {"in_dim": 4, **kwargs}
    with pytest.raises(ConfigError) as info:
        TopModel(**args)
    assert needle in str(info.value)


def test_forward_rejects_mismatched_inputs() -> None:
    f = BottomModel(2, [3])
    with pytest.raises(ConfigError, match=r"\(4, 3\)"):
        f(torch.zeros(4, 3), torch.zeros(4, 1, dtype=torch.long))
    with pytest.raises(ConfigError, match=r"\(4, 2\)"):
        f(torch.zeros(4, 2), torch.zeros(4, 2, dtype=torch.long))
    with pytest.raises(ConfigError, match="4 vs 5"):
        f(torch.zeros(4, 2), torch.zeros(5, 1, dtype=torch.long))
    with pytest.raises(ConfigError, match=r"\(3, 7\)"):
        TopModel(6)(torch.zeros(3, 7))


def test_top_model_shapes() -> None:
    assert TopModel(12, num_outputs=1)(torch.zeros(5, 12)).shape == (5, 1)
    top = TopModel(12, hidden=(), num_outputs=10)
    assert top(torch.zeros(5, 12)).shape == (5, 10)
    assert sum(p.numel() for p in top.parameters()) == _mlp_params([12, 10])


def test_init_is_deterministic() -> None:
    # Same generator seed -> identical weights, whatever the global RNG does.
    torch.manual_seed(123)
    a = BottomModel(3, [5, 6], generator=_gen(1)).state_dict()
    torch.manual_seed(999)
    state = torch.get_rng_state()
    b = BottomModel(3, [5, 6], generator=_gen(1)).state_dict()
    assert torch.equal(state, torch.get_rng_state())  # global RNG untouched
    c = BottomModel(3, [5, 6], generator=_gen(2)).state_dict()
    for key in a:
        assert torch.equal(a[key], b[key])
    assert not torch.equal(a["embedding.weight"], c["embedding.weight"])
    # Without a generator: torch.manual_seed makes it reproducible.
    torch.manual_seed(7)
    t1 = TopModel(8, num_outputs=3).state_dict()
    torch.manual_seed(7)
    t2 = TopModel(8, num_outputs=3).state_dict()
    for key in t1:
        assert torch.equal(t1[key], t2[key])


def test_init_matches_pytorch_default_scales() -> None:
    f = BottomModel(40, [1000], embedding_dim=8, hidden=(256,), out_dim=16)
    first = f.mlp[0]
    assert isinstance(first, nn.Linear)
    w = first.weight
    bound = 1 / np.sqrt(w.shape[1])
    assert w.abs().max() <= bound
    assert w.abs().max() > 0.9 * bound
    emb = f.embedding.weight  # type: ignore[union-attr]
    assert abs(emb.std().item() - EMBEDDING_SD) < 0.05 * EMBEDDING_SD


def _to_tensors(features: PartyFeatures) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(features.numeric), torch.from_numpy(features.categorical)


def test_split_training_on_synthetic_reduces_loss() -> None:
    # Prepare: two non-label parties, bottom + top composition
    torch.manual_seed(0)
    split = load_dataset("synthetic-ctr", rows=8000, seed=0)
    tr, te = split.train, split.test
    parts = partition_columns(tr.numeric_names, tr.categorical_names, 2)
    train_x = [_to_tensors(party_features(tr, p)) for p in parts]
    test_x = [_to_tensors(party_features(te, p)) for p in parts]
    bottoms = [
        BottomModel(
            len(p.numeric),
            [tr.cardinalities[tr.categorical_names.index(c)] for c in p.categorical],
            out_dim=8,
            generator=_gen(i),
        )
        for i, p in enumerate(parts)
    ]
    top = TopModel(16, hidden=(32,), num_outputs=num_outputs_for(2), generator=_gen(9))
    params = [q for m in (*bottoms, top) for q in m.parameters()]
    y = torch.from_numpy(tr.labels).float()
    rng = np.random.default_rng(0)

    def forward(
        xs: list[tuple[torch.Tensor, torch.Tensor]], idx: torch.Tensor
    ) -> torch.Tensor:
        cut = [f(num[idx], cat[idx]) for f, (num, cat) in zip(bottoms, xs, strict=True)]
        return top(torch.cat(cut, dim=1)).squeeze(1)

    full = torch.arange(len(tr))
    with torch.no_grad():
        loss0 = nn.functional.binary_cross_entropy_with_logits(
            forward(train_x, full), y
        )
    # Execute
    for _ in range(300):
        idx = torch.from_numpy(rng.choice(len(tr), 128, replace=False))
        loss = nn.functional.binary_cross_entropy_with_logits(
            forward(train_x, idx), y[idx]
        )
        loss.backward()
        _sgd_step(params, lr=0.2)
    # Assert
    with torch.no_grad():
        loss1 = nn.functional.binary_cross_entropy_with_logits(
            forward(train_x, full), y
        )
        scores = forward(test_x, torch.arange(len(te))).numpy()
    # Better than the initial model and than the best constant predictor (the
    # base-rate entropy): the features, not just the intercept, were learned.
    rate = float(y.mean())
    base = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
    assert loss1 < 0.6 * loss0
    assert loss1 < 0.95 * base
    auc = binary_auc(te.labels, scores)
    assert 0.65 < auc < split.info["bayes_test_auc"] + 0.02


def test_multiclass_top_model_learns_a_mixed_table() -> None:
    # Prepare: k = 5 classes from a linear score of 3 numeric columns plus a
    # per-category effect of one categorical column (numpy only: fast).
    k, n = 5, 3000
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 3)).astype(np.float32)
    c = rng.integers(0, 6, size=(n, 1))
    score = x @ rng.standard_normal((3, k)) + 2.0 * rng.standard_normal((6, k))[c[:, 0]]
    y = (score + 0.3 * rng.gumbel(size=(n, k))).argmax(axis=1)
    xt, ct, yt = torch.from_numpy(x), torch.from_numpy(c), torch.from_numpy(y)
    test = slice(2400, n)
    f = BottomModel(3, [6], hidden=(32,), out_dim=16, generator=_gen(0))
    h = TopModel(16, hidden=(), num_outputs=num_outputs_for(k), generator=_gen(1))
    params = [*f.parameters(), *h.parameters()]
    # Execute
    for _ in range(300):
        idx = torch.from_numpy(rng.choice(2400, 64, replace=False))
        loss = nn.functional.cross_entropy(h(f(xt[idx], ct[idx])), yt[idx])
        loss.backward()
        _sgd_step(params, lr=0.2)
    # Assert
    with torch.no_grad():
        pred = h(f(xt[test], ct[test])).argmax(dim=1).numpy()
    assert h.num_outputs == k
    assert (pred == y[test]).mean() > 0.8


def test_the_wide_part_adds_one_linear_column_that_starts_at_zero():
    numeric = torch.randn(6, 2)
    categorical = torch.tensor([[0, 1], [2, 0], [1, 1], [0, 0], [2, 1], [1, 0]])
    deep = BottomModel(2, [3, 2], hidden=(5,), out_dim=4, generator=_g(0))
    both = BottomModel(2, [3, 2], hidden=(5,), out_dim=4, generator=_g(0), wide=True)
    out = both(numeric, categorical)
    assert both.width == 5 and deep.width == 4 and out.shape == (6, 5)
    # Same deep part from the same seed; the wide column is 0 at the start.
    assert torch.equal(out[:, :4], deep(numeric, categorical))
    assert torch.equal(out[:, 4], torch.zeros(6))
    # It is linear: one weight per category and per numeric column.
    with torch.no_grad():
        for p in both.wide_parameters():
            p.fill_(1.0)
    expected = numeric.sum(dim=1) + 1.0 + 2.0  # bias + one weight per column
    assert torch.allclose(both(numeric, categorical)[:, 4], expected)
    top = TopModel(5, hidden=(3,), num_outputs=1, generator=_g(1), wide=True)
    plain = TopModel(5, hidden=(3,), num_outputs=1, generator=_g(1))
    emb = torch.randn(4, 5)
    assert torch.equal(top(emb), plain(emb))  # the linear path starts at 0


def _g(seed):
    return torch.Generator().manual_seed(seed)


def test_wide_columns_reach_the_logit_with_weight_one_so_the_wide_part_learns():
    # Prepare: a node with a wide column (its last), at its start of 0
    bottom = BottomModel(0, [4], hidden=(3,), out_dim=2, generator=_g(0), wide=True)
    top = TopModel(3, hidden=(3,), generator=_g(1), wide=True, wide_columns=[2])
    plain = TopModel(3, hidden=(3,), generator=_g(1))
    codes = torch.tensor([[0], [1], [2], [3]])
    emb = bottom(torch.zeros(4, 0), codes)

    # Execute
    loss = torch.nn.functional.binary_cross_entropy_with_logits(
        top(emb).squeeze(1), torch.tensor([1.0, 0.0, 1.0, 0.0])
    )
    loss.backward()

    # Assert: the wide column is added to the logit as is; at the start it is 0,
    # so the logits are the plain model's, and yet the wide weights get gradient
    assert top.skip is not None
    assert top.skip.weight.tolist() == [[0.0, 0.0, 1.0]]
    torch.testing.assert_close(top(emb), plain(emb))
    assert bottom.wide_embedding is not None
    grad = bottom.wide_embedding.weight.grad
    assert grad is not None and bool((grad.abs() > 0).all())


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"wide_columns": [0]}, r"wide_columns \[0\] given without wide=True"),
        ({"wide": True, "wide_columns": [3]}, r"wide_columns must be in \[0, 3\)"),
    ],
)
def test_top_model_refuses_bad_wide_columns(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        TopModel(3, **kwargs)
