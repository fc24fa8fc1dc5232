"""ClientApp of the toy app: report the partition and a persistent counter."""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()

STATE_KEY = "toy-state"


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Increment this node's counter and reply with it and the partition id."""
    partition_id = int(context.node_config["partition-id"])
    fail_partition = int(msg.content["config"]["fail-partition"])
    if partition_id == fail_partition:
        raise RuntimeError(f"toy failure on partition {partition_id}")
    if STATE_KEY not in context.state:
        context.state[STATE_KEY] = ConfigRecord({"counter": 0})
    record = context.state.config_records[STATE_KEY]
    record["counter"] = int(record["counter"]) + 1
    reply = ConfigRecord(
        {
            "partition-id": partition_id,
            "num-partitions": int(context.node_config["num-partitions"]),
            "counter": int(record["counter"]),
            "node-id": str(context.node_id),
        }
    )
    return Message(RecordDict({"reply": reply}), reply_to=msg)


@app.query("echo")
def echo(msg: Message, context: Context) -> Message:
    """Reply with the message content unchanged."""
    del context
    return Message(msg.content, reply_to=msg)
