"""Faults: a node that stops, a node that lies, a label party that dies; then resume.

Fast tests: the label party on a scripted grid (a silent node against the
reply-timeout, Flower's "node unavailable" reply, stray replies) and on the
in-process engine (corrupt replies through a ClientApp mod; a node or the
label party killed mid-epoch, then resumed: the gradients dispatched after the
last checkpoint equal those of an uninterrupted run). The same faults on the
real deployment runtime are in
``tests/engines/deployment/test_deployment_faults.py`` (``slow``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    RecordDict,
)
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

from tpsl_flwr.engines.inprocess import InProcessGrid
from tpsl_flwr.errors import ConfigError, ProtocolError
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run import run_inprocess_experiment
from tpsl_flwr.models import TopModel
from tpsl_flwr.parties import LabelParty
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import make_mechanism
from tpsl_flwr.release.store import LabelStore
from tpsl_flwr.simulations.client_app import builtin_checkpoint_dir as checkpoints
from tpsl_flwr.simulations.client_app import builtin_party
from tpsl_flwr.strategies import TPSLStrategy
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.batch_pack import gradient_batches, id_batches, stack_rows
from tpsl_flwr.wire.node_side import make_client_app

NODES = {101: 0, 202: 1}  # node id -> partition
WIDTH = 2


# ------------------------------------------------------------ scripted grid
class ScriptedGrid:
    """push/pull with replies from ``answer(grid, msg)`` (None: never answers)."""

    def __init__(self, answer: Callable[..., Any], nodes: dict[int, int] = NODES):
        self.nodes = dict(nodes)
        self.answer = answer
        self.sent: list[Message] = []
        self.replies: dict[str, list[Message]] = {}

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)

    def push_messages(self, messages: Any) -> list[str]:
        ids = []
        for msg in messages:
            message_id = f"m{len(self.sent)}"
            msg.metadata.__dict__["_message_id"] = message_id
            self.sent.append(msg)
            reply = self.answer(self, msg)
            if reply is not None:
                self.replies[message_id] = reply if isinstance(reply, list) else [reply]
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids: Any) -> list[Message]:
        out: list[Message] = []
        for i in list(message_ids):
            out += self.replies.pop(i, [])
        return out


def honest(grid: ScriptedGrid, msg: Message) -> Message:
    partition = grid.nodes[msg.metadata.dst_node_id]
    if msg.metadata.message_type == P.MSG_HELLO:
        info = {P.PARTITION_ID: partition, P.NUM_PARTITIONS: 2}
        info.update({P.EMBEDDING_DIM: WIDTH, P.NUM_TRAIN: 20, P.NUM_TEST: 0})
        return Message(RecordDict({P.NODE: ConfigRecord(info)}), reply_to=msg)
    batches = id_batches(msg.content)
    rng = np.random.default_rng(partition)
    out = ArrayRecord()
    if batches:  # every batch's embeddings stacked in one array (batch_pack)
        stacked, _ = stack_rows(
            [rng.normal(size=(ids.size, WIDTH)).astype(np.float32) for ids in batches]
        )
        out[P.EMBEDDINGS_KEY] = Array(stacked)
    return Message(RecordDict({P.EMBEDDINGS: out}), reply_to=msg)


def after_hello(fault: Callable[..., Any]) -> Callable[..., Any]:
    """Partition 1 answers the hello, then ``fault(grid, msg)`` replies."""

    def answer(grid: ScriptedGrid, msg: Message) -> Any:
        if (
            msg.metadata.message_type == P.MSG_HELLO
            or grid.nodes[msg.metadata.dst_node_id] == 0
        ):
            return honest(grid, msg)
        return fault(grid, msg)

    return answer


def make_strategy(num_nodes: int = 2) -> TPSLStrategy:
    torch.manual_seed(0)
    party = LabelParty(
        TopModel(2 * WIDTH, hidden=(8,), num_outputs=1),
        np.arange(20) % 2,
        make_mechanism("laplace", epsilon=1.0),
        NoiseKey.from_seed(3),
    )
    return TPSLStrategy(
        party, batch_size=8, epochs=2, num_nodes=num_nodes, node_wait=0.5
    )


def gradient_messages(sent: list[Message]) -> list[Message]:
    records = [m.content.array_records.get(P.GRADS) for m in sent]
    return [m for m, r in zip(sent, records, strict=True) if r and len(r.keys())]


@pytest.mark.parametrize("reply_timeout", [0.2, 0.6])
def test_a_silent_node_stops_the_run_within_the_reply_timeout_naming_it(
    server_identity, reply_timeout
):
    # Prepare: partition 1 answers the hello, then never again
    strategy = make_strategy()
    grid = ScriptedGrid(after_hello(lambda grid, msg: None))

    # Execute
    started = time.monotonic()
    with pytest.raises(ProtocolError) as err:
        strategy.start(grid, timeout=reply_timeout)  # type: ignore[arg-type]
    waited = time.monotonic() - started

    # Assert: one error naming the node, its partition and the bound, in time
    assert str(err.value).startswith(
        f"node 202 (partition 1) stopped answering (no reply within "
        f"{reply_timeout:g} s, the reply-timeout); restart it and resume"
    )
    assert reply_timeout <= waited < reply_timeout + 0.5
    assert strategy.party.steps == 0 and gradient_messages(grid.sent) == []


def test_flowers_node_unavailable_reply_names_the_node_not_the_superlink(
    server_identity,
):
    # Prepare: the SuperLink answers for partition 1 (its heartbeat expired)
    def unavailable(grid: ScriptedGrid, msg: Message) -> Message:
        reply = Message(
            Error(ErrorCode.NODE_UNAVAILABLE, "Node Unavailable"), reply_to=msg
        )
        reply.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
        return reply

    strategy = make_strategy()
    grid = ScriptedGrid(after_hello(unavailable))

    # Execute / Assert
    with pytest.raises(ProtocolError, match=r"^node 202 \(partition 1\) stopped "):
        strategy.start(grid, timeout=5)  # type: ignore[arg-type]
    assert gradient_messages(grid.sent) == []


def _stray(grid: ScriptedGrid, msg: Message) -> Message:
    reply = honest(grid, msg)
    reply.metadata.__dict__["_src_node_id"] = 303  # a node never sent anything
    return reply


@pytest.mark.parametrize(
    ("fault", "match"),
    [
        (_stray, r"a reply came from node 303, which was sent nothing"),
        (
            lambda grid, msg: [honest(grid, msg), honest(grid, msg)],
            r"node 202 \(partition 1\) replied twice",
        ),
        (
            lambda grid, msg: Message(Error(1, "ValueError: boom"), reply_to=msg),
            r"node 202 \(partition 1\) replied with an error: ValueError: boom",
        ),
    ],
)
def test_stray_double_and_error_replies_stop_the_run_naming_the_node(
    server_identity, fault, match
):
    strategy = make_strategy()
    grid = ScriptedGrid(after_hello(fault))
    with pytest.raises(ProtocolError, match=match):
        strategy.start(grid, timeout=5)  # type: ignore[arg-type]
    assert strategy.party.steps == 0 and gradient_messages(grid.sent) == []


def test_a_stale_registration_of_a_restarted_node_is_left_out_at_connect(
    server_identity,
):
    # Prepare: node 404 (partition 1's old id) is listed but unavailable
    def answer(grid: ScriptedGrid, msg: Message) -> Message:
        if msg.metadata.dst_node_id == 404:
            return Message(Error(ErrorCode.NODE_UNAVAILABLE, "expired"), reply_to=msg)
        return honest(grid, msg)

    nodes = {**NODES, 404: 1}

    # Execute
    needed_two = make_strategy(num_nodes=2)
    needed_two.connect(ScriptedGrid(answer, nodes), timeout=5)  # type: ignore[arg-type]

    # Assert: two nodes are enough; a run that needs all three stops
    assert [(n.node_id, n.partition) for n in needed_two.nodes] == [(101, 0), (202, 1)]
    with pytest.raises(ProtocolError, match=r"node 404 stopped answering"):
        make_strategy(num_nodes=3).connect(ScriptedGrid(answer, nodes), timeout=5)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan")])
def test_reply_timeout_must_be_positive_and_finite(bad):
    with pytest.raises(ConfigError, match="reply-timeout must be > 0 and finite"):
        ExperimentConfig(dataset="breast-cancer", reply_timeout=bad)
    assert ExperimentConfig().reply_timeout == 60.0
    parsed = ExperimentConfig.from_run_config({"reply-timeout": 5})
    assert parsed.reply_timeout == 5.0


# ------------------------------------------------------- in-process engine
SETTINGS: dict[str, Any] = {
    "dataset": "breast-cancer",
    "mechanism": "laplace",
    "epochs": 3,
    "batch_size": 128,
    "noise_seed": 5,
}
"""455 training rows: 4 steps per epoch, 1 hello + 3 x (4 steps + 1 query) per node."""


def _corrupt(kind: str):
    """A ClientApp mod: partition 1's reply to its 2nd train message goes bad."""
    seen = {"train": 0}

    def mod(msg: Message, context: Context, call_next: Any) -> Message:
        reply = call_next(msg, context)
        if (
            int(context.node_config[P.PARTITION_ID]) != 1
            or msg.metadata.message_type != P.MSG_TRAIN
        ):
            return reply
        seen["train"] += 1
        if seen["train"] != 2:
            return reply
        emb = reply.content.array_records[P.EMBEDDINGS][P.EMBEDDINGS_KEY].numpy()
        bad = {
            "nan": {P.EMBEDDINGS_KEY: np.full_like(emb, np.nan)},
            "shape": {P.EMBEDDINGS_KEY: emb[:-1]},  # one row short
            "ids": {P.EMBEDDINGS_KEY: emb, "batch-1": emb},  # a key not asked for
        }[kind]
        records = {k: Array(v) for k, v in bad.items()}
        reply.content[P.EMBEDDINGS] = ArrayRecord(records)  # type: ignore[arg-type]
        return reply

    return mod


@pytest.mark.parametrize(
    ("kind", "match"),
    [
        ("nan", r"partition 1\) sent NaN or inf embeddings$"),
        (
            "shape",
            r"partition 1\) sent embeddings of shape \(127, (\d+)\) for 1 "
            r"batch\(es\) of 128 ids; expected \(128, \1\)$",
        ),
        ("ids", r"partition 1\) sent batch-1, which it was not asked for$"),
    ],
)
def test_a_corrupt_reply_stops_the_run_before_any_gradient_of_it_leaves(
    tmp_path, one_torch_thread, kind, match
):
    # Prepare
    cfg = ExperimentConfig(**{**SETTINGS, "epochs": 1}, out_dir=str(tmp_path))
    app = make_client_app(builtin_party, [_corrupt(kind)], checkpoint_dir=checkpoints)
    sent: list[Message] = []

    # Execute
    with pytest.raises(ProtocolError, match=match):
        run_inprocess_experiment(cfg, client_app=app, on_message=sent.append)

    # Assert: hello + 2 train messages per node left; the 3rd, which would
    # carry the gradient computed from the bad reply, never did
    assert len(sent) == 2 * 3
    assert not (tmp_path / "results.json").exists()


def _dispatched(sent: list[Message], grid: InProcessGrid, from_epoch: int):
    """``(partition, epoch, ids, grad)`` of every gradient sent in ``from_epoch+``."""
    out = []
    for msg in sent:
        epoch = int(msg.content.config_records[P.CONFIG].get(P.EPOCH, -1))
        if epoch < from_epoch:
            continue
        for ids, grad in gradient_batches(msg.content):
            out.append(
                (grid.partition_of(msg.metadata.dst_node_id), epoch, ids.tolist(), grad)
            )
    return sorted(out, key=lambda x: (x[0], x[1]))


def _assert_same_gradients(got: list[Any], want: list[Any]) -> None:
    assert [g[:3] for g in got] == [w[:3] for w in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g[3], w[3])


def _uninterrupted(out_dir: Any) -> list[Any]:
    """Every gradient an uninterrupted run dispatches from epoch 1 on."""
    sent: list[Message] = []
    _, grid = run_inprocess_experiment(
        ExperimentConfig(out_dir=str(out_dir), **SETTINGS), on_message=sent.append
    )
    return _dispatched(sent, grid, from_epoch=1)


def _assert_resume_continues(out_dir: str, reference: list[Any]) -> None:
    """Resume ``out_dir`` after epoch 0: epochs 1 and 2 dispatch ``reference``.

    Same ids, same noise, same models, and nothing of epoch 0 is resent.
    """
    sent: list[Message] = []
    resumed, grid = run_inprocess_experiment(
        ExperimentConfig(out_dir=out_dir, resume=True, **SETTINGS),
        on_message=sent.append,
    )
    got = _dispatched(sent, grid, from_epoch=0)
    assert {epoch for _, epoch, _, _ in got} == {1, 2}
    _assert_same_gradients(got, reference)
    assert [h["epoch"] for h in resumed["history"]] == [1, 2, 3]


class _LabelPartyKilled(BaseException):
    """The label party's process dying (not an error it could handle)."""


@pytest.mark.parametrize("who", ["node", "label party"])
def test_killed_mid_epoch_then_resumed_dispatches_the_same_gradients(
    tmp_path, monkeypatch, one_torch_thread, who
):
    # Prepare: an uninterrupted run, and one killed in its 2nd epoch (0-based
    # epoch 1) after 2 of its 4 steps, once epoch 0's checkpoint is written
    reference = _uninterrupted(tmp_path / "ref")
    out_dir = str(tmp_path / "run")
    if who == "node":
        calls = {"n": 0}
        default = make_client_app(builtin_party, checkpoint_dir=checkpoints)

        def app(msg: Message, context: Context) -> Message:
            if int(context.node_config[P.PARTITION_ID]) == 1:
                calls["n"] += 1  # hello + epoch 0 (5) + 2 steps of epoch 1
                if calls["n"] > 1 + 5 + 2:
                    raise RuntimeError("SuperNode killed")
            return default(msg, context)

        with pytest.raises(ProtocolError, match=r"partition 1\).*SuperNode killed"):
            run_inprocess_experiment(
                ExperimentConfig(out_dir=out_dir, **SETTINGS), client_app=app
            )
    else:
        steps = {"n": 0}
        train_step = LabelParty.train_step

        def dies(self: LabelParty, *args: Any, **kwargs: Any) -> torch.Tensor:
            steps["n"] += 1
            if steps["n"] > 4 + 2:
                raise _LabelPartyKilled
            return train_step(self, *args, **kwargs)

        monkeypatch.setattr(LabelParty, "train_step", dies)
        with pytest.raises(_LabelPartyKilled):
            run_inprocess_experiment(ExperimentConfig(out_dir=out_dir, **SETTINGS))
        monkeypatch.setattr(LabelParty, "train_step", train_step)

    # Execute and assert: resume (healthy parties) from the checkpoint of epoch 0
    _assert_resume_continues(out_dir, reference)
    assert (tmp_path / "run" / "results.json").exists()


def test_a_label_party_killed_between_the_nodes_checkpoint_and_its_own_resumes(
    tmp_path, monkeypatch, one_torch_thread
):
    """The nodes keep their previous checkpoint, which the resume then needs."""
    reference = _uninterrupted(tmp_path / "ref")
    out_dir = str(tmp_path / "run")
    save = LabelStore.save_checkpoint

    def dies(self: LabelStore, epoch: int, *args: Any, **kwargs: Any) -> Any:
        if epoch == 1:  # the nodes have written epoch 1's checkpoint already
            raise _LabelPartyKilled
        return save(self, epoch, *args, **kwargs)

    monkeypatch.setattr(LabelStore, "save_checkpoint", dies)
    with pytest.raises(_LabelPartyKilled):
        run_inprocess_experiment(ExperimentConfig(out_dir=out_dir, **SETTINGS))
    monkeypatch.setattr(LabelStore, "save_checkpoint", save)

    _assert_resume_continues(out_dir, reference)
