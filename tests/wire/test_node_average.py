"""A node folds and restores its tail average only over the label party's epochs,
and says what it did in its reply."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from torch import nn

from tpsl_flwr import ProtocolError
from tpsl_flwr.engines.virtual_nodes import task_identity
from tpsl_flwr.parties import NonLabelParty, adam
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.node_side import NonLabelHandlers

X = np.random.default_rng(0).normal(size=(8, 2)).astype(np.float32)


class Bottom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 3)

    def forward(self, numeric, categorical):
        return self.layer(numeric)


def _node():
    """One node's handlers and context; ``send(**config)`` -> its reply's echo."""
    torch.manual_seed(0)
    handlers = NonLabelHandlers(
        lambda context: NonLabelParty({"train": (X, None)}, Bottom(), adam(0.05))
    )
    context = Context(1, 7, {"partition-id": 0, "num-partitions": 1}, RecordDict(), {})

    def send(**config):
        config = {k.replace("_", "-"): v for k, v in config.items()}
        with task_identity(1, 7, 1):
            msg = Message(
                RecordDict({P.CONFIG: ConfigRecord({P.SPLIT: "test", **config})}),
                dst_node_id=7,
                message_type=P.MSG_EMBED_TEST,
            )
            msg.metadata.__dict__["_message_id"] = f"m-{id(msg)}"
            reply = handlers.step(msg, context)
        return dict(reply.content.config_records.get(P.ECHO, {}))

    return send


def test_the_node_echoes_each_fold_and_the_restore():
    send = _node()
    # Act / Assert: each fold says its epoch and the count; the restore, its count
    assert send(epoch=1, average_in=1) == {P.AVERAGE_IN: 1, P.AVERAGED: 1}
    assert send(epoch=2, average_in=2) == {P.AVERAGE_IN: 2, P.AVERAGED: 2}
    assert send(epoch=2) == {}  # nothing to confirm
    assert send(epoch=2, restore_average=2) == {P.RESTORE_AVERAGE: 2}


def test_the_same_count_over_other_epochs_is_refused():
    send = _node()
    send(epoch=1, average_in=1)
    send(epoch=2, average_in=2)
    # Act / Assert: two epochs, but 2 and 3 (the label party's last is 3)
    with pytest.raises(ProtocolError, match=r"epochs \[2, 3\]\), but this node "):
        send(epoch=3, restore_average=2)
    with pytest.raises(ProtocolError, match=r"averaged 2 \(epochs \[1, 2\]\)"):
        send(epoch=3, restore_average=2)


def test_a_fold_after_a_gap_or_twice_is_refused():
    send = _node()
    send(epoch=1, average_in=1)
    for epoch in (1, 3):
        with pytest.raises(ProtocolError, match=f"fold epoch {epoch} into .* \\[1\\]"):
            send(epoch=epoch, average_in=epoch)
    assert send(epoch=2, average_in=2) == {P.AVERAGE_IN: 2, P.AVERAGED: 2}
