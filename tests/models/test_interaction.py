"""Tests of the DLRM layout: field vectors at the nodes, dot products at the top."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.architecture import build_bottom, build_top, node_fields
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.metrics.auc import binary_auc
from tpsl_flwr.models import (
    EMBEDDING_SD,
    FIELD_EMBEDDING_SD,
    BottomModel,
    TopModel,
)
from tpsl_flwr.models.interaction import DotInteractionTop
from tpsl_flwr.parties.model_state import load_checkpoint_state
from tpsl_flwr.wire.label_side import Node, check_top_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_field_bottom_sends_the_numeric_vector_then_each_columns_embedding():
    # Prepare
    g = torch.Generator().manual_seed(0)
    f = BottomModel(3, [4, 5], embedding_dim=6, out_dim=6, fields=True, generator=g)
    numeric = torch.randn(7, 3, generator=g)
    categorical = torch.tensor([[1, 2]] * 7)
    assert f.embedding is not None and f.mlp is not None

    # Execute
    out = f(numeric, categorical)

    # Assert: [mlp(numeric) | e(col 0, code 1) | e(col 1, code 2)]
    assert (f.num_fields, f.width, out.shape) == (3, 18, (7, 18))
    torch.testing.assert_close(out[:, :6], f.mlp(numeric))
    torch.testing.assert_close(out[:, 6:12], f.embedding.weight[1].expand(7, 6))
    torch.testing.assert_close(out[:, 12:], f.embedding.weight[4 + 2].expand(7, 6))


def test_field_bottom_without_numeric_columns_has_no_mlp_and_wide_adds_a_column():
    f = BottomModel(0, [4, 5, 6], embedding_dim=2, out_dim=2, fields=True, wide=True)
    assert (f.mlp, f.num_fields, f.width) == (None, 3, 7)
    out = f(torch.zeros(4, 0), torch.zeros(4, 3, dtype=torch.long))
    assert out.shape == (4, 7)
    assert torch.all(out[:, -1] == 0)  # the wide part starts at 0


def test_field_bottom_refuses_field_vectors_of_two_widths():
    with pytest.raises(ConfigError, match=r"out_dim=8.*embedding_dim=4"):
        BottomModel(2, [3], embedding_dim=4, out_dim=8, fields=True)


def test_dot_top_feeds_every_pairwise_dot_product_to_its_head():
    # Prepare: two nodes, 2 and 1 fields of width 3
    top = DotInteractionTop([2, 1], field_dim=3, hidden=(), num_outputs=1)
    head = top.head.mlp[0]
    z = torch.randn(5, 9, generator=torch.Generator().manual_seed(1))
    v = z.reshape(5, 3, 3)
    dots = torch.stack(
        [
            (v[:, 0] * v[:, 1]).sum(1),
            (v[:, 0] * v[:, 2]).sum(1),
            (v[:, 1] * v[:, 2]).sum(1),
        ],
        dim=1,
    )

    # Execute
    out = top(z)

    # Assert: one linear layer over [z | the three dot products]
    assert (top.in_dim, top.node_widths, head.in_features) == (9, (6, 3), 12)
    torch.testing.assert_close(out, head(torch.cat((z, dots), dim=1)))


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"node_fields": [], "field_dim": 2}, "node_fields must be a non-empty"),
        ({"node_fields": [2, 0], "field_dim": 2}, r"node_fields\[1\] must be >= 1"),
        ({"node_fields": [2], "field_dim": 0}, "field_dim must be >= 1, got 0"),
        ({"node_fields": 3, "field_dim": 2}, "got 3"),
    ],
)
def test_dot_top_rejects_bad_sizes(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        DotInteractionTop(**kwargs)


def test_dot_top_learns_a_product_of_two_nodes_columns_sooner_than_an_mlp_top():
    # Prepare: y = 1[u0 * u1 > 0] with u0 at node 0 and u1 at node 1 (a
    # cross-node interaction: neither node alone carries any signal).
    rng = np.random.default_rng(0)
    u = torch.tensor(rng.standard_normal((4000, 2)), dtype=torch.float32)
    y = (u[:, 0] * u[:, 1] > 0).float()
    test_u = torch.tensor(rng.standard_normal((2000, 2)), dtype=torch.float32)
    test_y = (test_u[:, 0] * test_u[:, 1] > 0).numpy()

    def fit(dot: bool) -> float:
        g = torch.Generator().manual_seed(0)
        bottoms = [
            BottomModel(1, [], embedding_dim=4, hidden=(16,), out_dim=4, generator=g)
            for _ in range(2)
        ]
        top: torch.nn.Module = (
            DotInteractionTop([1, 1], 4, hidden=(8,), generator=g)
            if dot
            else TopModel(8, hidden=(8,), generator=g)
        )
        params = [p for m in (*bottoms, top) for p in m.parameters()]
        none = torch.zeros(1, 0, dtype=torch.long)
        for step in range(250):
            rows = slice(step % 16 * 250, step % 16 * 250 + 250)
            z = torch.cat(
                [
                    b(u[rows, i : i + 1], none.expand(250, 0))
                    for i, b in enumerate(bottoms)
                ],
                dim=1,
            )
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                top(z).squeeze(1), y[rows]
            )
            loss.backward()
            with torch.no_grad():
                for p in params:
                    p -= 0.1 * p.grad
                    p.grad = None
        with torch.no_grad():
            z = torch.cat(
                [
                    b(test_u[:, i : i + 1], none.expand(2000, 0))
                    for i, b in enumerate(bottoms)
                ],
                dim=1,
            )
            return binary_auc(test_y, top(z).squeeze(1).numpy())

    # Execute
    dot_auc, mlp_auc = fit(dot=True), fit(dot=False)

    # Assert: the dot product has found the product (0.998 measured); the MLP
    # top, same steps and weights' seed, is still on its way (0.889)
    assert dot_auc > 0.97, dot_auc
    assert mlp_auc < dot_auc - 0.05, (mlp_auc, dot_auc)


def test_the_label_party_counts_each_nodes_fields_from_the_schema_as_the_node_does():
    # Prepare
    cfg = ExperimentConfig(rows=2000, num_parties=3, out_dir="unused")

    # Execute
    counts = node_fields(cfg)
    widths = []
    for partition in range(3):
        view = cfg.load_party(partition)
        bottom = build_bottom(
            cfg, view.train.numeric.shape[1], view.train.cardinalities, partition
        )
        widths.append(bottom.width)

    # Assert: 16 columns dealt round-robin to 3 nodes
    assert counts == (1 + 3, 1 + 2, 1 + 3)
    top = build_top(cfg, 1)
    assert isinstance(top, DotInteractionTop)
    assert top.node_widths == tuple(widths) == tuple(8 * c for c in counts)


def test_mlp_model_keeps_one_cut_layer_per_node():
    cfg = ExperimentConfig(rows=2000, model="mlp", embedding_dim=16, out_dir="unused")
    top = build_top(cfg, 1)
    bottom = build_bottom(cfg, 4, (3, 5), 0)
    assert isinstance(top, TopModel)
    assert (top.in_dim, bottom.width, bottom.embedding_dim) == (32, 16, 4)


def test_a_node_sending_another_layout_is_refused_naming_its_partition():
    top = DotInteractionTop([2, 3], field_dim=4)
    nodes = [Node(1, 0, 12, 0), Node(2, 1, 8, 12)]
    with pytest.raises(ConfigError, match=r"expects 8 .* partition 0 but it sends 12"):
        check_top_model(top, nodes, 1)


def test_an_unknown_model_is_refused_naming_it():
    with pytest.raises(
        ConfigError, match="model must be one of auto, dlrm, mlp, got 'fm'"
    ):
        ExperimentConfig(model="fm")


def test_auto_takes_dlrm_where_there_are_categorical_columns_else_mlp():
    ctr = ExperimentConfig(rows=2000, out_dir="unused")
    digits = ExperimentConfig(dataset="digits", out_dir="unused")
    assert (ctr.split_model, digits.split_model) == ("dlrm", "mlp")
    assert isinstance(build_top(digits, 10), TopModel)
    assert not build_bottom(digits, 32, (), 0).fields


def test_field_embeddings_start_small_and_the_mlp_layout_keeps_pytorchs_scale():
    # 40 000 draws each: the sample sd is within 2% of its target (12 sigma)
    fields = BottomModel(0, [5000], embedding_dim=8, out_dim=8, fields=True)
    mlp = BottomModel(0, [5000], embedding_dim=8, out_dim=8)
    assert fields.embedding is not None and mlp.embedding is not None
    assert (
        abs(float(fields.embedding.weight.detach().std()) / FIELD_EMBEDDING_SD - 1)
        < 0.02
    )
    assert abs(float(mlp.embedding.weight.detach().std()) / EMBEDDING_SD - 1) < 0.02


def test_each_nodes_wide_column_starts_at_weight_one_in_the_dot_top():
    top = DotInteractionTop([2, 1], field_dim=3, hidden=(4,), wide=True)
    assert top.node_widths == (7, 4)
    skip = top.head.skip
    assert skip is not None
    assert torch.nonzero(skip.weight[0]).flatten().tolist() == [6, 10]
    assert skip.weight[0, [6, 10]].tolist() == [1.0, 1.0]
    mlp_top = build_top(
        ExperimentConfig(rows=2000, model="mlp", wide=True, out_dir="unused"), 1
    )
    assert isinstance(mlp_top, TopModel) and mlp_top.skip is not None
    assert torch.nonzero(mlp_top.skip.weight[0]).flatten().tolist() == [8, 17]


def test_a_checkpoint_of_another_model_is_refused_naming_the_settings():
    written = DotInteractionTop([2, 1], field_dim=3).state_dict()
    with pytest.raises(ConfigError, match=r"top model does not fit.*model, embedding"):
        load_checkpoint_state(TopModel(9), written, "top model")
