"""TPSLStrategy fed replies directly: no Grid engine, no Ray."""

import math

import numpy as np
import pytest
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    Metadata,
    MetricRecord,
    RecordDict,
)

from tpsl_flwr.errors import ConfigError, PrivacyError, ProtocolError
from tpsl_flwr.models import TopModel
from tpsl_flwr.parties import LabelParty
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import make_mechanism
from tpsl_flwr.strategies import TPSLStrategy
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.batch_pack import gradient_batches, id_batches, stack_rows

NODES = {101: 0, 202: 1}  # node id -> partition
WIDTH = 2


def _reply(msg, content=None, src=None, error=None):
    meta = Metadata(
        run_id=1,
        message_id="",
        src_node_id=src or msg.metadata.dst_node_id,
        dst_node_id=0,
        reply_to_message_id=msg.metadata.message_id,
        group_id="",
        created_at=0.0,
        ttl=60.0,
        message_type=msg.metadata.message_type,
    )
    if error is not None:
        from flwr.app import Error

        return Message(error=Error(code=0, reason=error), metadata=meta)
    return Message(content=content or RecordDict(), metadata=meta)


class FakeGrid:
    """Only what the strategy calls: node ids, push_messages and pull_messages."""

    def __init__(self, responder, nodes=NODES):
        self.nodes = dict(nodes)
        self.responder = responder
        self.sent = []
        self.replies = {}

    def get_node_ids(self):
        return list(self.nodes)

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            message_id = f"m{len(self.sent)}"
            msg.metadata.__dict__["_message_id"] = message_id
            self.sent.append(msg)
            reply = self.responder(self, msg)
            if reply is not None:
                self.replies[message_id] = reply
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]

    def send_and_receive(self, messages, timeout=None):
        return self.pull_messages(self.push_messages(messages))


def embeddings_for(ids, partition, value=None):
    rng = np.random.default_rng(partition)
    base = rng.normal(size=(64, WIDTH)).astype(np.float32)
    emb = base[np.asarray(ids)]
    return emb if value is None else np.full_like(emb, value)


def honest(grid, msg):
    partition = grid.nodes[msg.metadata.dst_node_id]
    if msg.metadata.message_type == P.MSG_HELLO:
        info = ConfigRecord(
            {
                P.PARTITION_ID: partition,
                P.NUM_PARTITIONS: 2,
                P.EMBEDDING_DIM: WIDTH,
                P.NUM_TRAIN: 20,
                P.NUM_TEST: 0,
            }
        )
        return _reply(msg, RecordDict({P.NODE: info}))
    batches = id_batches(msg.content)
    out = ArrayRecord()
    if batches:
        stacked, _ = stack_rows([embeddings_for(ids, partition) for ids in batches])
        out[P.EMBEDDINGS_KEY] = Array(stacked)
    return _reply(msg, RecordDict({P.EMBEDDINGS: out}))


def make_strategy(labels=None, mechanism=None, seed=3, **kwargs):
    labels = np.arange(20) % 2 if labels is None else labels
    torch.manual_seed(0)
    party = LabelParty(
        TopModel(2 * WIDTH, hidden=(8,), num_outputs=1),
        labels,
        mechanism or make_mechanism("laplace", epsilon=1.0),
        NoiseKey.from_seed(seed),
    )
    options = {"batch_size": 8, "epochs": 1, "num_nodes": 2, "node_wait": 0.5}
    options.update(kwargs)
    return TPSLStrategy(party, **options)


def test_connect_maps_node_ids_to_partitions(server_identity):
    strategy = make_strategy()
    strategy.connect(FakeGrid(honest), timeout=5)
    assert [(n.node_id, n.partition, n.offset) for n in strategy.nodes] == [
        (101, 0, 0),
        (202, 1, WIDTH),
    ]


def test_one_round_trip_per_step_dispatches_the_perturbed_slices(server_identity):
    # Prepare: a twin label party with the same model, labels and key.
    strategy, twin = make_strategy(), make_strategy()
    grid = FakeGrid(honest)
    strategy.connect(grid, timeout=5)
    strategy.begin_epoch(0)
    # Execute: step 1 sends ids only; step 2 sends step 1's gradients.
    first = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid))
    assert all(len(m.content.array_records[P.GRADS]) == 0 for m in first)
    strategy.aggregate_train(1, [honest(grid, m) for m in first])
    second = list(strategy.configure_train(2, ArrayRecord(), ConfigRecord(), grid))
    # Assert
    ids = strategy.epoch_batches(0)[0]
    emb = np.concatenate([embeddings_for(ids, 0), embeddings_for(ids, 1)], axis=1)
    expected = twin.party.train_step(ids, torch.as_tensor(emb)).numpy()
    for msg in second:
        part = NODES[msg.metadata.dst_node_id]
        [(sent_ids, sent_grad)] = gradient_batches(msg.content)
        np.testing.assert_array_equal(sent_ids, ids)
        np.testing.assert_allclose(
            sent_grad,
            expected[:, part * WIDTH : (part + 1) * WIDTH],
            rtol=1e-6,
        )
        assert set(msg.content.config_records[P.CONFIG]) <= P.ALLOWED_CONFIG_KEYS


def test_k_steps_per_message_send_k_batches(server_identity):
    strategy = make_strategy(steps_per_message=3)
    grid = FakeGrid(honest)
    strategy.connect(grid, timeout=5)
    strategy.begin_epoch(0)
    msgs = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid))
    assert list(msgs[0].content.array_records[P.NEW_IDS]) == [P.IDS_KEY]
    batches = id_batches(msgs[0].content)
    assert len(batches) == 3
    for sent, expected in zip(batches, strategy.epoch_batches(0)[:3], strict=True):
        np.testing.assert_array_equal(sent, expected)
    strategy.aggregate_train(1, [honest(grid, m) for m in msgs])
    assert len(strategy.pending) == 3


def test_epoch_order_is_label_independent_and_covers_every_id():
    a = make_strategy(labels=np.zeros(20, dtype=int))
    b = make_strategy(labels=np.arange(20) % 2)
    for epoch in (0, 1):
        batches_a, batches_b = a.epoch_batches(epoch), b.epoch_batches(epoch)
        assert all(
            np.array_equal(x, y) for x, y in zip(batches_a, batches_b, strict=True)
        )
        assert sorted(np.concatenate(batches_a)) == list(range(20))
    assert not np.array_equal(a.epoch_batches(0)[0], a.epoch_batches(1)[0])


def _run_one_step(strategy, responder):
    grid = FakeGrid(responder)
    strategy.connect(grid, timeout=5)
    strategy.begin_epoch(0)
    msgs = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid))
    strategy.aggregate_train(1, grid.send_and_receive(msgs))


def _faulty(kind):
    def responder(grid, msg):
        if (
            msg.metadata.message_type == P.MSG_HELLO
            or grid.nodes[msg.metadata.dst_node_id] == 0
        ):
            return honest(grid, msg)
        if kind == "error":
            return _reply(msg, error="disk on fire")
        if kind == "silent":
            return None
        [ids] = id_batches(msg.content)
        emb = embeddings_for(ids, 1, math.nan if kind == "nan" else None)
        if kind == "shape":
            emb = emb[:, :1]
        record = ArrayRecord({P.EMBEDDINGS_KEY: Array(emb)})
        return _reply(msg, RecordDict({P.EMBEDDINGS: record}))

    return responder


@pytest.mark.parametrize(
    ("kind", "match"),
    [
        ("error", r"node 202 \(partition 1\) replied with an error: disk on fire"),
        ("silent", r"no reply from node 202 \(partition 1\)"),
        ("nan", r"node 202 \(partition 1\) sent NaN or inf embeddings"),
        ("shape", r"node 202 \(partition 1\) sent embeddings of shape \(8, 1\)"),
    ],
)
def test_faulty_node_stops_the_step_naming_the_node(server_identity, kind, match):
    strategy = make_strategy()
    with pytest.raises(ProtocolError, match=match):
        _run_one_step(strategy, _faulty(kind))
    assert strategy.party.steps == 0 and strategy.pending == []


def test_fewer_nodes_than_expected_times_out_with_a_message(server_identity):
    strategy = make_strategy(num_nodes=3)
    with pytest.raises(ProtocolError, match="expected 3 non-label nodes, only 2"):
        strategy.connect(FakeGrid(honest), timeout=5)


def test_cut_layer_width_must_match_the_top_model(server_identity):
    strategy = make_strategy()
    wide = {101: 0, 202: 1}

    def three_wide(grid, msg):
        reply = honest(grid, msg)
        reply.content[P.NODE][P.EMBEDDING_DIM] = 3
        return reply

    with pytest.raises(ConfigError, match="takes 4 inputs but the 2 nodes"):
        strategy.connect(FakeGrid(three_wide, wide), timeout=5)


def test_duplicate_partitions_are_rejected(server_identity):
    strategy = make_strategy()
    with pytest.raises(ProtocolError, match=r"partitions \[0, 0\]"):
        strategy.connect(FakeGrid(honest, {101: 0, 202: 0}), timeout=5)


def test_fail_closed_nothing_is_dispatched_when_perturbation_fails(server_identity):
    strategy = make_strategy()
    with torch.no_grad():
        next(strategy.party.top.parameters()).fill_(math.nan)
    with pytest.raises(PrivacyError, match="not finite"):
        _run_one_step(strategy, honest)
    assert strategy.pending == []


def test_ids_outside_the_labels_are_rejected():
    strategy = make_strategy()
    with pytest.raises(ConfigError, match="sample id 25 is outside the 20"):
        strategy.party.train_step(np.array([1, 25]), torch.zeros(2, 4))


@pytest.mark.parametrize("name", ["batch_size", "epochs", "steps_per_message"])
def test_bad_strategy_settings_name_the_value(name):
    with pytest.raises(ConfigError, match=f"{name} must be an integer >= 1, got 0"):
        make_strategy(**{name: 0})


@pytest.mark.parametrize("bad", [0, -0.5, math.inf])
def test_poll_interval_must_be_positive_and_finite(bad):
    with pytest.raises(
        ConfigError, match=f"poll_interval must be > 0 and finite, got {bad}"
    ):
        make_strategy(poll_interval=bad)


@pytest.mark.parametrize(
    ("tamper", "match"),
    [
        (lambda c: c[P.CONFIG].__setitem__("loss", "0.31"), "config key 'loss'"),
        (lambda c: c.__setitem__("debug", ConfigRecord({"y": 1})), "'debug'"),
        (
            lambda c: c[P.GRADS].__setitem__("labels-0", Array(np.zeros(8))),
            "array 'labels-0'",
        ),
        (
            lambda c: c.__setitem__("tpsl.stats", MetricRecord({"auc": 0.9})),
            "metric record 'tpsl.stats'",
        ),
    ],
)
def test_a_message_off_the_allow_list_stops_the_run_before_it_leaves(
    server_identity, monkeypatch, tamper, match
):
    # Prepare: a wire-format bug that adds something to every training message.
    from tpsl_flwr.strategies import epoch_loop

    honest_message = epoch_loop.step_message

    def leaky(*args, **kwargs):
        msg = honest_message(*args, **kwargs)
        tamper(msg.content)
        return msg

    monkeypatch.setattr(epoch_loop, "step_message", leaky)
    strategy = make_strategy()
    grid = FakeGrid(honest)
    # Execute / Assert: the run stops; only the hello messages were pushed.
    with pytest.raises(PrivacyError, match=match):
        strategy.start(grid=grid, timeout=5)
    assert {m.metadata.message_type for m in grid.sent} == {P.MSG_HELLO}


@pytest.mark.parametrize("name", ["train_config", "evaluate_config"])
def test_start_refuses_configs_it_would_have_to_send(server_identity, name):
    strategy = make_strategy()
    with pytest.raises(ConfigError, match=f"does not send {name}"):
        strategy.start(grid=FakeGrid(honest), **{name: ConfigRecord({"lr": 0.1})})


def test_start_honours_evaluate_fn_and_returns_the_privacy(server_identity):
    strategy = make_strategy(epochs=2)
    calls = []

    def evaluate_fn(epoch, arrays):
        calls.append((epoch, sorted(arrays)))
        return MetricRecord({"central_score": float(epoch)})

    result = strategy.start(grid=FakeGrid(honest), evaluate_fn=evaluate_fn)
    assert [c[0] for c in calls] == [1, 2]
    assert calls[0][1] == sorted(strategy.party.top.state_dict())
    assert [h["central_score"] for h in strategy.history] == [1.0, 2.0]
    assert result.evaluate_metrics_serverapp[2]["central_score"] == 2.0
    assert result.epsilon_spent == 1.0
    assert result.privacy is not None and result.privacy.auc_bound == pytest.approx(
        math.e / (1 + math.e)
    )


def test_an_embedded_strategy_checkpoints_and_resumes_through_its_store(
    server_identity, tmp_path
):
    # Prepare: an embedder's own binding, store and first run of one epoch.
    from tpsl_flwr.privacy.accounting import privacy_spent
    from tpsl_flwr.release.store import LabelRecords, LabelStore, NoiseBinding

    mechanism = make_mechanism("laplace", epsilon=1.0)
    binding = NoiseBinding.of(
        mechanism=mechanism,
        placement="logits",
        reuse_noise=True,
        id_space={"ids": "mine-v1"},
    )
    store = LabelStore(tmp_path / "label-party")
    labels = LabelRecords(np.arange(25), np.arange(25) % 2)  # train and test

    def open_release(resume, epochs=1):
        return store.open_release(
            binding,
            resume=resume,
            labels=labels,
            privacy=privacy_spent(mechanism=mechanism, epochs=epochs),
        )

    def embedded(resume, epochs):
        release = open_release(resume, epochs)
        torch.manual_seed(0)
        party = LabelParty(
            TopModel(2 * WIDTH, hidden=(8,), num_outputs=1),
            np.arange(20) % 2,
            mechanism,
            release.key,
        )
        return TPSLStrategy(
            party,
            batch_size=8,
            epochs=epochs,
            num_nodes=2,
            node_wait=0.5,
            store=store,
            release=release,
        )

    first = embedded(resume=False, epochs=1)
    first.start(grid=FakeGrid(honest))
    # Execute
    second = embedded(resume=True, epochs=2)
    grid = FakeGrid(honest)
    second.start(grid=grid)
    # Assert: epoch 1 was restored, only epoch 2 ran, the nodes were told to
    # resume and to checkpoint, and the key is the first run's.
    assert second.start_epoch == 1
    assert [h["epoch"] for h in second.history] == [1, 2]
    assert second.history[0] == first.history[0]
    assert second.party.key == first.party.key
    hello = [m for m in grid.sent if m.metadata.message_type == P.MSG_HELLO]
    assert all(m.content[P.CONFIG][P.RESUME_EPOCH] == 1 for m in hello)
    queries = [m for m in grid.sent if m.metadata.message_type == P.MSG_EMBED_TEST]
    assert all(m.content[P.CONFIG][P.CHECKPOINT_EPOCH] == 1 for m in queries)
    assert open_release(resume=True).start_epoch == 2


def test_a_release_under_another_key_is_refused(server_identity, tmp_path):
    from tpsl_flwr.release.store import Release

    with pytest.raises(PrivacyError, match="is not the label party's"):
        make_strategy(release=Release(key=NoiseKey.from_seed(99), origin="seed"))


def test_without_a_store_the_nodes_are_never_asked_to_checkpoint(server_identity):
    strategy = make_strategy()
    grid = FakeGrid(honest)
    strategy.start(grid=grid)
    assert all(P.CHECKPOINT_EPOCH not in m.content[P.CONFIG] for m in grid.sent)
