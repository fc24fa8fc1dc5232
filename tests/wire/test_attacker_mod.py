"""The attacker's recorder mod, driven through the in-process Grid."""

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from tpsl_flwr.attacks import BatchRecord, attack_report
from tpsl_flwr.engines.inprocess import InProcessGrid
from tpsl_flwr.errors import ConfigError, ProtocolError
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.batch_pack import gradient_batches, stack_rows
from tpsl_flwr.wire.recorder import (
    load_transcript,
    party_folder,
    record_transcript,
    score_recorded_transcript,
)

WIDTH = 3


def tiny_app(directory, seen):
    """A ClientApp whose handler counts the gradient rows it was given."""
    app = ClientApp(mods=[record_transcript(directory)])

    def handle(msg, context):
        rows = sum(grad.shape[0] for _, grad in gradient_batches(msg.content))
        seen.append((context.node_config["partition-id"], rows))
        reply = ConfigRecord({"rows": rows})
        return Message(RecordDict({"seen": reply}), reply_to=msg)

    app.train()(handle)
    app.query()(handle)
    return app


def gradient_message(node, epoch, batches, message_type=P.MSG_TRAIN):
    """A message as the label party sends it: ids and averaged gradients."""
    config = ConfigRecord({P.EPOCH: epoch, P.SPLIT: "train"})
    arrays = ArrayRecord()
    if batches:  # every batch stacked in one array per key (batch_pack)
        ids, config[P.GRAD_ROWS] = stack_rows(
            [np.asarray(ids, dtype=np.int64) for ids, _ in batches]
        )
        grads, _ = stack_rows([np.asarray(g, dtype=np.float32) for _, g in batches])
        arrays[P.IDS_KEY] = Array(ids)
        arrays[P.GRAD_KEY] = Array(grads)
    content = RecordDict({P.CONFIG: config, P.GRADS: arrays})
    return Message(content, dst_node_id=node, message_type=message_type)


def logistic_epoch(rng, y, w, batch):
    """One epoch of averaged gradients (sigmoid(z) - y) w / n, shuffled."""
    z = rng.normal(size=y.size) - 1.0
    per_sample = np.outer(1.0 / (1.0 + np.exp(-z)) - y, w)
    order = rng.permutation(y.size)
    steps = []
    for start in range(0, y.size, batch):
        ids = order[start : start + batch]
        steps.append((ids, (per_sample[ids] / ids.size).astype(np.float32)))
    return steps


def test_recorder_round_trip(tmp_path):
    # Prepare
    rng = np.random.default_rng(0)
    seen = []
    grid = InProcessGrid(tiny_app(tmp_path, seen), num_nodes=2, seed=0)
    nodes = list(grid.get_node_ids())
    sent = {0: [], 1: []}
    messages = []
    with grid.server_identity():
        for step in range(3):
            for node in nodes:
                part = grid.partition_of(node)
                batches = [
                    (rng.integers(0, 100, 4), rng.normal(size=(4, WIDTH)))
                    for _ in range(1 + step % 2)  # 1 or 2 batches per message
                ]
                sent[part].append((step // 2, batches))
                messages.append(gradient_message(node, step // 2, batches))
        # A message without gradients is not recorded (the first of an epoch).
        messages.append(
            Message(
                RecordDict({P.CONFIG: ConfigRecord({P.EPOCH: 5})}),
                dst_node_id=nodes[0],
                message_type=P.MSG_TRAIN,
            )
        )
        # Execute
        replies = list(grid.send_and_receive(messages))
    # Assert: the handler ran on the unchanged message.
    assert not any(r.has_error() for r in replies)
    assert sorted(rows for _, rows in seen) == sorted(
        [4 * (1 + s % 2) for s in range(3)] * 2 + [0]
    )
    for part in (0, 1):
        files = sorted(p.name for p in party_folder(tmp_path, part).iterdir())
        assert files == ["msg-000000.npz", "msg-000001.npz", "msg-000002.npz"]
        loaded = load_transcript(tmp_path, part)
        expected = [
            (epoch, counter, ids, grad)
            for counter, (epoch, batches) in enumerate(sent[part])
            for ids, grad in batches
        ]
        assert len(loaded) == len(expected) == 4
        for got, (epoch, counter, ids, grad) in zip(loaded, expected, strict=True):
            assert (got.epoch, got.message) == (epoch, counter)
            np.testing.assert_array_equal(got.ids, ids)
            np.testing.assert_array_equal(got.grad, grad.astype(np.float32))
            assert got.ids.dtype == np.int64 and got.grad.dtype == np.float32


def test_recording_continues_the_numbering_and_never_overwrites(tmp_path):
    # Prepare: two independent recorders (as two processes would be).
    seen = []
    first = InProcessGrid(tiny_app(tmp_path, seen), num_nodes=1, seed=1)
    second = InProcessGrid(tiny_app(tmp_path, seen), num_nodes=1, seed=2)
    grad = [(np.arange(2), np.ones((2, WIDTH)))]
    # Execute
    for value, grid in enumerate((first, second, first)):
        (node,) = grid.get_node_ids()
        with grid.server_identity():
            batches = [(ids, g * value) for ids, g in grad]
            grid.send_and_receive([gradient_message(node, 0, batches)])
    # Assert
    loaded = load_transcript(tmp_path, 0)
    assert [b.message for b in loaded] == [0, 1, 2]
    assert [float(b.grad[0, 0]) for b in loaded] == [0.0, 1.0, 2.0]


def test_offline_report_equals_attack_report_on_the_same_batches(tmp_path):
    # Prepare: two epochs of an unprotected logistic transcript, 1 node.
    rng = np.random.default_rng(3)
    labels = (rng.random(600) < 0.2).astype(np.int64)
    w = rng.normal(size=WIDTH)
    epoch0 = logistic_epoch(rng, labels, w, batch=64)
    epoch1 = logistic_epoch(rng, labels, w, batch=64)
    grid = InProcessGrid(tiny_app(tmp_path, []), num_nodes=1, seed=3)
    (node,) = grid.get_node_ids()
    with grid.server_identity():
        messages = [gradient_message(node, 0, [s]) for s in epoch0]
        # Epoch 1 with two batches per message and a query flushing the last.
        messages += [
            gradient_message(node, 1, epoch1[i : i + 2]) for i in range(0, 8, 2)
        ]
        messages.append(gradient_message(node, 1, epoch1[8:], P.MSG_EMBED_TEST))
        grid.send_and_receive(messages)
    # Execute
    offline = score_recorded_transcript(tmp_path, labels, partition=0)
    # Assert
    assert list(offline) == [0, 1]
    for epoch, steps in ((0, epoch0), (1, epoch1)):
        direct = attack_report(
            [BatchRecord(ids, g, labels[ids]) for ids, g in steps], classes=2
        )
        assert offline[epoch] == direct  # the very same numbers
        assert offline[epoch]["sda"] is None
        assert offline[epoch]["cosine"] == 1.0
        assert offline[epoch]["spectral"] == 1.0
        assert offline[epoch]["samples"] == 600


def test_multiclass_labels_give_no_black_box_numbers(tmp_path):
    grid = InProcessGrid(tiny_app(tmp_path, []), num_nodes=1, seed=5)
    (node,) = grid.get_node_ids()
    with grid.server_identity():
        grid.send_and_receive(
            [gradient_message(node, 0, [(np.arange(3), np.ones((3, WIDTH)))])]
        )
    report = score_recorded_transcript(tmp_path, np.array([0, 1, 2]))[0]
    assert report["classes"] == 3 and report["sda_top1"] is None


def test_missing_partition_id_is_a_protocol_error(tmp_path):
    grid = InProcessGrid(tiny_app(tmp_path, []), num_nodes=1, seed=6)
    (node,) = grid.get_node_ids()
    mod = record_transcript(tmp_path)
    context = Context(
        run_id=grid.run.run_id,
        node_id=node,
        node_config={},
        state=RecordDict(),
        run_config={},
    )
    with grid.server_identity():
        msg = gradient_message(node, 0, [(np.arange(1), np.ones((1, WIDTH)))])
    with pytest.raises(ProtocolError, match="partition-id"):
        mod(msg, context, lambda m, c: m)


def test_loader_and_offline_attack_errors(tmp_path):
    with pytest.raises(ConfigError, match="partition 7"):
        load_transcript(tmp_path, 7)
    grid = InProcessGrid(tiny_app(tmp_path, []), num_nodes=1, seed=7)
    (node,) = grid.get_node_ids()
    with grid.server_identity():
        grid.send_and_receive(
            [gradient_message(node, 0, [(np.array([0, 9]), np.ones((2, WIDTH)))])]
        )
    with pytest.raises(ConfigError, match=r"outside \[0, 5\)"):
        score_recorded_transcript(tmp_path, np.zeros(5, dtype=np.int64))
    with pytest.raises(ConfigError, match="integer"):
        score_recorded_transcript(tmp_path, np.zeros(10))
    report = score_recorded_transcript(tmp_path, np.zeros(10, dtype=np.int64))[0]
    assert math.isnan(report["norm"])  # a single class: no AUC
