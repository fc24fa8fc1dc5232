"""The in-process engine's message copy isolates like Flower's (de)serialisation."""

from __future__ import annotations

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)

from tpsl_flwr.engines.inprocess import InProcessGrid
from tpsl_flwr.engines.message_copy import copy_context, copy_message, copy_records


def _records() -> RecordDict:
    return RecordDict(
        {
            "arrays": ArrayRecord({"x": Array(np.arange(4.0))}),
            "config": ConfigRecord({"ids": [1, 2], "name": "a", "blob": b"\x00"}),
            "metrics": MetricRecord({"auc": 0.5, "curve": [0.1, 0.2]}),
        }
    )


def test_copied_records_are_equal_and_independent() -> None:
    # Prepare
    original = _records()

    # Execute: copy, then mutate every container of the copy
    copied = copy_records(original)
    same_values = (
        np.array_equal(copied.array_records["arrays"]["x"].numpy(), np.arange(4.0))
        and copied.config_records["config"]["ids"] == [1, 2]
        and copied.metric_records["metrics"]["curve"] == [0.1, 0.2]
    )
    arrays = copied.array_records["arrays"]
    arrays["x"] = Array(np.zeros(1))
    arrays["y"] = Array(np.ones(1))
    ids = copied.config_records["config"]["ids"]
    curve = copied.metric_records["metrics"]["curve"]
    assert isinstance(ids, list) and isinstance(curve, list)
    ids.append(3)  # type: ignore[arg-type]
    copied.config_records["config"]["name"] = "b"
    curve.append(0.3)  # type: ignore[arg-type]
    del copied["metrics"]

    # Assert
    assert same_values
    assert list(original.array_records["arrays"]) == ["x"]
    assert np.array_equal(original.array_records["arrays"]["x"].numpy(), np.arange(4.0))
    config = original.config_records["config"]
    assert config["ids"] == [1, 2] and config["name"] == "a"
    assert original.metric_records["metrics"]["curve"] == [0.1, 0.2]


def test_copied_messages_keep_metadata_content_and_errors() -> None:
    # Prepare: an instruction, a reply to it and an error reply
    grid = InProcessGrid(lambda m, c: m, 1)
    with grid.server_identity():
        instruction = Message(_records(), dst_node_id=7, message_type="train")
    reply = Message(RecordDict({"c": ConfigRecord({"k": 1})}), reply_to=instruction)
    failed = Message(Error(code=3, reason="boom"), reply_to=instruction)

    for message in (instruction, reply, failed):
        # Execute
        copied = copy_message(message)

        # Assert
        assert copied is not message
        assert copied.metadata is not message.metadata
        for field in ("dst_node_id", "message_type", "reply_to_message_id", "run_id"):
            assert getattr(copied.metadata, field) == getattr(message.metadata, field)
        assert copied.has_error() == message.has_error()
        if message.has_error():
            assert copied.error.reason == "boom" and copied.error.code == 3
        else:
            assert list(copied.content) == list(message.content)
            assert copied.content is not message.content


def test_copied_context_is_equal_and_independent() -> None:
    # Prepare
    original = Context(
        run_id=7,
        node_id=11,
        node_config={"partition-id": 1, "num-partitions": 2},
        state=_records(),
        run_config={"epochs": 1},
    )

    # Execute: copy, then mutate every container of the copy
    copied = copy_context(original)
    same_ids = (copied.run_id, copied.node_id) == (7, 11)
    copied.node_config["partition-id"] = 0
    copied.run_config["epochs"] = 2
    copied.state.config_records["config"]["name"] = "b"
    del copied.state["arrays"]

    # Assert
    assert same_ids
    assert original.node_config == {"partition-id": 1, "num-partitions": 2}
    assert original.run_config == {"epochs": 1}
    assert original.state.config_records["config"]["name"] == "a"
    assert list(original.state.array_records) == ["arrays"]
