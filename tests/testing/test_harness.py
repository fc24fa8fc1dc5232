"""The public harness: run_strategy reports what each node got and what was computed."""

import math

import numpy as np
import pytest
import torch

from tests.conftest import toy_node, toy_table
from tpsl_flwr import ConfigError, NoiseKey, ProtocolError, make_mechanism
from tpsl_flwr.models import TopModel
from tpsl_flwr.parties import LabelParty, adam
from tpsl_flwr.privacy.accounting import privacy_spent
from tpsl_flwr.privacy.perturb import candidate_gradients
from tpsl_flwr.strategies import TPSLStrategy
from tpsl_flwr.testing import run_strategy
from tpsl_flwr.wire.node_side import make_client_app

ROWS, TEST_ROWS, COLS, WIDTH = 24, 8, 2, 3
X, Y = toy_table(ROWS + TEST_ROWS, COLS)
node = toy_node(X, ROWS, COLS, WIDTH)


# A linear top model: g_0 - g_1 = w for every sample, never zero.
def make_strategy(mechanism, epochs=2):
    torch.manual_seed(0)
    party = LabelParty(
        TopModel(2 * WIDTH, hidden=(), num_outputs=1),
        Y[:ROWS],
        mechanism,
        NoiseKey.from_seed(1),
        optimizer=adam(0.05),
    )
    return TPSLStrategy(
        party, test_labels=Y[ROWS:], batch_size=8, epochs=epochs, num_nodes=2
    )


def spy_on_top(strategy):
    """Record the top model's parameters before each step (to recompute g_j)."""
    party, tops = strategy.party, []
    original = party.train_step

    def spy(ids, emb, epoch=0):
        tops.append({k: v.clone() for k, v in party.top.state_dict().items()})
        return original(ids, emb, epoch=epoch)

    party.train_step = spy
    return tops


def per_class(strategy, top_state, embeddings):
    twin = TopModel(2 * WIDTH, hidden=(), num_outputs=1)
    twin.load_state_dict(top_state)
    return candidate_gradients(twin, torch.as_tensor(embeddings)).numpy()


def test_each_node_receives_its_columns_of_the_computed_gradient():
    # Prepare
    strategy = make_strategy(make_mechanism("laplace", epsilon=1.0))
    # Execute
    report = run_strategy(strategy, make_client_app(node), num_nodes=2, seed=0)
    # Assert: 3 steps x 2 epochs; every node got every step, in order, and its
    # slice is exactly its columns of the gradient computed for the same ids.
    assert [(c.epoch, c.step) for c in report.computed] == [
        (e, s) for e in range(2) for s in range(3)
    ]
    offsets = {n.partition: n.offset for n in strategy.nodes}
    for partition, received in report.dispatched.items():
        assert len(received) == len(report.computed)
        for sent, step in zip(received, report.computed, strict=True):
            assert (sent.epoch, sent.step) == (step.epoch, step.step)
            np.testing.assert_array_equal(sent.ids, step.ids)
            off = offsets[partition]
            np.testing.assert_array_equal(
                sent.gradient, step.gradient[:, off : off + WIDTH]
            )
    assert report.history is strategy.history and len(report.history) == 2
    assert "test_auc" in report.history[-1]
    assert any(m.metadata.message_type == "query.hello" for m in report.messages)


def test_none_dispatches_exactly_the_clean_gradients():
    # Prepare
    strategy = make_strategy(make_mechanism("none"))
    tops = spy_on_top(strategy)
    # Execute
    report = run_strategy(strategy, make_client_app(node), num_nodes=2, seed=0)
    # Assert: what the nodes got, side by side, is the gradient of the mean BCE
    # at the true labels, nothing added.
    for k, (top_state, step) in enumerate(zip(tops, report.computed, strict=True)):
        g = per_class(strategy, top_state, step.embeddings)
        clean = g[np.arange(step.ids.size), Y[step.ids]] / step.ids.size
        sent = np.concatenate([report.dispatched[p][k].gradient for p in (0, 1)], 1)
        np.testing.assert_allclose(sent, clean, rtol=1e-5, atol=1e-8)
    assert report.epsilon_spent == math.inf


def test_laplace_moves_each_gradient_along_g0_minus_g1():
    # Prepare
    strategy = make_strategy(make_mechanism("laplace", epsilon=1.0))
    tops = spy_on_top(strategy)
    # Execute
    report = run_strategy(strategy, make_client_app(node), num_nodes=2, seed=0)
    # Assert: perturbed - clean = t (g0 - g1) per sample, t != 0 (noise moved it).
    moved = 0
    for top_state, step in zip(tops, report.computed, strict=True):
        g = per_class(strategy, top_state, step.embeddings) / step.ids.size
        clean = g[np.arange(step.ids.size), Y[step.ids]]
        direction = g[:, 0] - g[:, 1]
        shift = step.gradient - clean
        t = np.sum(shift * direction, axis=1) / np.sum(direction**2, axis=1)
        np.testing.assert_allclose(shift, t[:, None] * direction, rtol=1e-4, atol=1e-7)
        moved += int(np.sum(np.abs(t) > 1e-3))
    assert moved > 0.9 * ROWS * 2


@pytest.mark.parametrize(
    ("mechanism", "epsilon"),
    [
        (make_mechanism("laplace", epsilon=1.0), 1.0),
        (make_mechanism("discrete", epsilon=2.0), 2.0),
        (make_mechanism("none"), math.inf),
    ],
)
def test_epsilon_spent_is_the_mechanisms(mechanism, epsilon):
    strategy = make_strategy(mechanism)
    report = run_strategy(strategy, make_client_app(node), num_nodes=2)
    expected = privacy_spent(
        mechanism=mechanism, placement="logits", epochs=2, reuse_noise=True
    )
    assert report.epsilon_spent == epsilon == expected.epsilon
    assert report.privacy == report.result.privacy == expected


def test_train_step_is_restored_after_a_run_and_after_a_failure():
    strategy = make_strategy(make_mechanism("laplace", epsilon=1.0))
    run_strategy(strategy, make_client_app(node), num_nodes=2)
    assert "train_step" not in vars(strategy.party)

    def broken(context):
        raise RuntimeError("no features here")

    strategy = make_strategy(make_mechanism("laplace", epsilon=1.0))
    with pytest.raises(ProtocolError, match="no features here"):
        run_strategy(strategy, make_client_app(broken), num_nodes=2)
    assert "train_step" not in vars(strategy.party)


def test_num_nodes_must_match_the_strategys():
    strategy = make_strategy(make_mechanism("none"))
    with pytest.raises(ConfigError, match=r"num_nodes \(2\), got 3"):
        run_strategy(strategy, make_client_app(node), num_nodes=3)
