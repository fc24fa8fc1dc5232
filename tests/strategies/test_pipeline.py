"""pipeline-depth: messages sent ahead of the replies, each gradient once, in order."""

import numpy as np
import pytest
import torch

from tests.conftest import ToyBottom, toy_node, toy_table
from tpsl_flwr import ConfigError, NoiseKey, ProtocolError, make_mechanism
from tpsl_flwr.engines.inprocess import InProcessGrid
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.models import TopModel
from tpsl_flwr.parties import LabelParty, adam
from tpsl_flwr.strategies import TPSLStrategy
from tpsl_flwr.strategies.pipeline import check_pipeline_grid
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.arrays import from_array
from tpsl_flwr.wire.batch_pack import gradient_batches, id_batches
from tpsl_flwr.wire.node_side import STATE_KEY, _state_from_record, make_client_app

ROWS, TEST_ROWS, COLS, WIDTH, BATCH = 40, 8, 2, 3, 8
X, Y = toy_table(ROWS + TEST_ROWS, COLS)


def columns(part):
    return slice(COLS * part, COLS * part + COLS)


node = toy_node(X, ROWS, COLS, WIDTH)


def label_party():
    torch.manual_seed(0)
    return LabelParty(
        TopModel(2 * WIDTH, hidden=(), num_outputs=1),
        Y[:ROWS],
        make_mechanism("laplace", epsilon=1.0),
        NoiseKey.from_seed(1),
        optimizer=adam(0.05),
    )


class CountingGrid(InProcessGrid):
    """An in-process grid that counts each node's messages pushed, not pulled."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.dst, self.in_flight, self.most = {}, {}, {}

    def push_messages(self, messages):
        messages = list(messages)
        ids = list(super().push_messages(messages))
        for msg, mid in zip(messages, ids, strict=True):
            node = msg.metadata.dst_node_id
            self.dst[mid] = node
            self.in_flight[node] = self.in_flight.get(node, 0) + 1
            self.most[node] = max(self.most.get(node, 0), self.in_flight[node])
        return ids

    def pull_messages(self, message_ids):
        replies = list(super().pull_messages(message_ids))
        for reply in replies:
            self.in_flight[self.dst[reply.metadata.reply_to_message_id]] -= 1
        return replies


def run(depth, epochs=2):
    strategy = TPSLStrategy(
        label_party(),
        test_labels=Y[ROWS:],
        batch_size=BATCH,
        epochs=epochs,
        num_nodes=2,
        pipeline_depth=depth,
    )
    computed = []
    original = strategy.party.train_step

    def train_step(ids, emb, epoch=0):
        grad = original(ids, emb, epoch=epoch)
        computed.append((epoch, np.asarray(ids).copy(), grad.numpy().copy()))
        return grad

    strategy.party.train_step = train_step
    grid = CountingGrid(make_client_app(node), 2, seed=0, record_messages=True)
    grid.run_server(lambda g, _ctx: strategy.start(grid=g, timeout=10))
    return strategy, grid, computed


def node_log(grid, partition):
    """Partition's train/test messages in order: (type, epoch, ids asked, grads)."""
    out = []
    for msg in grid.sent_messages:
        if grid.partition_of(msg.metadata.dst_node_id) != partition:
            continue
        if msg.metadata.message_type == P.MSG_HELLO:
            continue
        config = msg.content.config_records[P.CONFIG]
        asked = len(id_batches(msg.content))
        sent = gradient_batches(msg.content)
        out.append((msg.metadata.message_type, config[P.EPOCH], asked, sent))
    return out


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_each_gradient_reaches_each_node_once_in_order_depth_messages_later(depth):
    # Execute
    strategy, grid, computed = run(depth)
    # Assert: 5 steps an epoch; gradient k of an epoch is in the epoch's
    # message k + 1 + depth (counting the test query), exactly once, with its
    # node's columns, and every one before the epoch's test query.
    steps = ROWS // BATCH
    assert len(computed) == 2 * steps
    for partition in (0, 1):
        log = node_log(grid, partition)
        for epoch in (0, 1):
            mine = [m for m in log if m[1] == epoch]
            assert [m[0] for m in mine] == [P.MSG_TRAIN] * (steps + depth) + [
                P.MSG_EMBED_TEST
            ]
            assert sum(m[2] for m in mine[:-1]) == steps  # every batch asked once
            carried = [(i, g) for i, m in enumerate(mine) for g in m[3]]
            assert [i for i, _ in carried] == [k + 1 + depth for k in range(steps)]
            want = [c for c in computed if c[0] == epoch]
            for (_, (ids, grad)), (_, ids_k, grad_k) in zip(carried, want, strict=True):
                np.testing.assert_array_equal(ids, ids_k)
                cols = slice(WIDTH * partition, WIDTH * partition + WIDTH)
                np.testing.assert_array_equal(grad, grad_k[:, cols])
    assert set(grid.most.values()) == {depth + 1}
    assert all(n == 0 for n in grid.in_flight.values())
    assert len(strategy.history) == 2 and "test_auc" in strategy.history[-1]


def bottoms_of(grid):
    """Each node's bottom-model parameters, from its context.state."""
    out = {}
    for vnode in grid.nodes:
        state = _state_from_record(vnode.context.state.config_records[STATE_KEY])
        out[vnode.partition_id] = state["bottom"]
    return out


def reference(depth, epochs=2):
    """Hand-written split learning, the bottoms ``depth`` steps stale.

    Message ``m`` of an epoch carries gradient ``m - 1 - depth``: a bottom model
    applies gradient ``k`` (recomputing batch ``k``'s forward with its current
    parameters) only after it has embedded batch ``k + depth``.
    """
    party = label_party()
    bottoms, optimizers = [], []
    for part in (0, 1):
        torch.manual_seed(part)
        bottoms.append(ToyBottom(COLS, WIDTH))
        optimizers.append(torch.optim.Adam(bottoms[-1].parameters(), lr=0.05))
    order = TPSLStrategy(label_party(), batch_size=BATCH, epochs=epochs)

    def apply(ids, grad):
        for part in (0, 1):
            optimizers[part].zero_grad()
            rows = torch.as_tensor(X[ids][:, columns(part)])
            cols = slice(WIDTH * part, WIDTH * part + WIDTH)
            bottoms[part](rows, None).backward(grad[:, cols])
            optimizers[part].step()

    for epoch in range(epochs):
        batches, grads = order.epoch_batches(epoch), []
        for m, ids in enumerate(batches):
            if m - 1 - depth >= 0:
                apply(*grads[m - 1 - depth])
            with torch.no_grad():
                emb = torch.cat(
                    [
                        bottoms[p](torch.as_tensor(X[ids][:, columns(p)]), None)
                        for p in (0, 1)
                    ],
                    dim=1,
                )
            grads.append((ids, party.train_step(ids, emb, epoch=epoch)))
        for k in range(max(0, len(batches) - 1 - depth), len(batches)):
            apply(*grads[k])  # the rest, before the test query
    return party, [b.state_dict() for b in bottoms]


@pytest.mark.parametrize("depth", [0, 1])
def test_the_pipelined_strategy_is_the_delayed_reference(depth):
    # Execute
    strategy, grid, _ = run(depth)
    party, bottoms = reference(depth)
    other, _ = reference(1 - depth)
    # Assert: same top and bottoms as the hand-written loop of the same depth,
    # not those of the other depth (the delay changes the training).
    for name, value in strategy.party.top.state_dict().items():
        torch.testing.assert_close(value, party.top.state_dict()[name])
        assert not torch.allclose(value, other.top.state_dict()[name])
    for partition, state in bottoms_of(grid).items():
        for name, value in state.items():
            torch.testing.assert_close(value, bottoms[partition][name])


def test_pipeline_depth_is_refused_on_ray_and_checked():
    from flwr.superlink.grid import InMemoryGrid

    grid = InMemoryGrid.__new__(InMemoryGrid)
    with pytest.raises(ConfigError, match="pipeline-depth 1 needs nodes"):
        check_pipeline_grid(grid, 1)
    check_pipeline_grid(grid, 0)
    with pytest.raises(ConfigError, match="pipeline_depth must be an integer >= 0"):
        TPSLStrategy(label_party(), pipeline_depth=-1)
    with pytest.raises(ConfigError, match="pipeline-depth must be an integer >= 0"):
        ExperimentConfig(pipeline_depth=-1)


def test_a_bad_reply_stops_the_pipelined_run_before_anything_is_computed_from_it():
    # Prepare: partition 1's third train reply holds NaN embeddings.
    from flwr.app import Array, ArrayRecord

    app, seen = make_client_app(node), []

    def faulty(msg, context):
        reply = app(msg, context)
        if msg.metadata.message_type == P.MSG_TRAIN:
            seen.append(context.node_config["partition-id"])
            if seen.count(1) == 3 and context.node_config["partition-id"] == 1:
                record = reply.content.array_records[P.EMBEDDINGS]
                emb = from_array(record[P.EMBEDDINGS_KEY]) * np.nan
                reply.content[P.EMBEDDINGS] = ArrayRecord(
                    {P.EMBEDDINGS_KEY: Array(emb)}
                )
        return reply

    strategy = TPSLStrategy(
        label_party(), batch_size=BATCH, epochs=1, num_nodes=2, pipeline_depth=1
    )
    grid = InProcessGrid(faulty, 2, seed=0, record_messages=True)
    # Execute
    with pytest.raises(ProtocolError, match=r"partition 1\) sent NaN or inf"):
        grid.run_server(lambda g, _ctx: strategy.start(grid=g, timeout=10))
    # Assert: two steps computed (batches 0 and 1); the messages sent carry
    # gradients 0 and 1 at most, none of batch 2.
    assert strategy.party.steps == 2
    batches = strategy.epoch_batches(0)
    for partition in (0, 1):
        carried = [ids for m in node_log(grid, partition) for ids, _ in m[3]]
        assert len(carried) <= 2
        for ids, want in zip(carried, batches, strict=False):
            np.testing.assert_array_equal(ids, want)
