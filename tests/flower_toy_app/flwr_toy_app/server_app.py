"""ServerApp of the toy app: one ``train`` message per node per round."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


def wait_for_nodes(grid: Grid, expected: int, timeout_s: float) -> list[int]:
    """Return the node ids once ``expected`` nodes are connected."""
    deadline = time.monotonic() + timeout_s
    node_ids = list(grid.get_node_ids())
    while len(node_ids) < expected and time.monotonic() < deadline:
        time.sleep(0.2)
        node_ids = list(grid.get_node_ids())
    return sorted(node_ids)


@app.main()
def main(grid: Grid, context: Context) -> dict[str, Any]:
    """Send ``num-rounds`` train messages to every node and record the replies."""
    cfg = context.run_config
    expected = int(cfg.get("expected-nodes", 1))
    node_ids = wait_for_nodes(grid, expected, float(cfg["wait-for-nodes-s"]))
    rounds: list[list[dict[str, Any]]] = []
    for server_round in range(1, int(cfg["num-rounds"]) + 1):
        content = RecordDict(
            {"config": ConfigRecord({"fail-partition": int(cfg["fail-partition"])})}
        )
        messages = [
            Message(content, dst_node_id=node_id, message_type="train")
            for node_id in node_ids
        ]
        replies = grid.send_and_receive(messages)
        this_round = []
        for reply in replies:
            entry: dict[str, Any] = {"src-node-id": reply.metadata.src_node_id}
            if reply.has_error():
                entry["error"] = reply.error.reason or ""
            else:
                entry.update(dict(reply.content.config_records["reply"]))
            this_round.append(entry)
        rounds.append(sorted(this_round, key=lambda e: e["src-node-id"]))
        del server_round
    result = {"node-ids": node_ids, "rounds": rounds}
    if cfg.get("result-path"):
        Path(str(cfg["result-path"])).write_text(json.dumps(result), encoding="utf-8")
    return result
