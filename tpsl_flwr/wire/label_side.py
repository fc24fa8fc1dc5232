"""The label party's side of the wire: node bookkeeping, messages and replies.

Builds the messages :class:`~tpsl_flwr.strategies.TPSLStrategy` sends (only
sample ids, perturbed gradient slices and public config, see
:mod:`tpsl_flwr.wire.protocol`) and checks every reply, naming the node and its
partition in each error.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from tpsl_flwr.errors import ProtocolError
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.arrays import from_array, to_array


@dataclass(frozen=True)
class Node:
    """A non-label node: its id, partition and columns of the cut layer."""

    node_id: int
    partition: int
    width: int
    offset: int


def node_label(nodes: Sequence[Node], node_id: int) -> str:
    """``"node <id> (partition <p>)"`` for error messages."""
    for node in nodes:
        if node.node_id == node_id:
            return f"node {node_id} (partition {node.partition})"
    return f"node {node_id}"


def check_replies(
    nodes: Sequence[Node], replies: Iterable[Message], expected: Iterable[int]
) -> dict[int, Message]:
    """Index replies by sender; raise on an error reply or a missing one."""
    by_node: dict[int, Message] = {}
    for reply in replies:
        src = reply.metadata.src_node_id
        if reply.has_error():
            raise ProtocolError(
                f"{node_label(nodes, src)} replied with an error: {reply.error.reason}"
            )
        by_node[src] = reply
    missing = [n for n in expected if n not in by_node]
    if missing:
        names = ", ".join(node_label(nodes, n) for n in missing)
        raise ProtocolError(f"no reply from {names} before the timeout")
    return by_node


def hello_messages(node_ids: Sequence[int], resume_epoch: int | None) -> list[Message]:
    """Ask each node to describe itself (and, on resume, to load its checkpoint)."""
    config = ConfigRecord(
        {} if resume_epoch is None else {P.RESUME_EPOCH: resume_epoch}
    )
    return [
        Message(RecordDict({P.CONFIG: config}), dst_node_id=n, message_type=P.MSG_HELLO)
        for n in node_ids
    ]


def describe_nodes(replies: dict[int, Message]) -> list[Node]:
    """Nodes in partition order with their cut-layer columns, from hello replies."""
    described = []
    for node_id, reply in replies.items():
        info = reply.content.config_records.get(P.NODE)
        if info is None:
            raise ProtocolError(f"node {node_id} did not describe itself")
        partition = P.as_int(info[P.PARTITION_ID], "partition-id")
        width = P.as_int(info[P.EMBEDDING_DIM], "embedding-dim")
        described.append((partition, node_id, width))
    described.sort()
    partitions = [p for p, _, _ in described]
    if partitions != list(range(len(described))):
        raise ProtocolError(
            f"nodes report partitions {partitions}; expected 0..{len(described) - 1}"
        )
    nodes, offset = [], 0
    for partition, node_id, width in described:
        nodes.append(Node(node_id, partition, width, offset))
        offset += width
    return nodes


def step_message(
    node: Node,
    message_type: str,
    config: dict[str, Any],
    new_ids: Sequence[np.ndarray],
    pending: Sequence[tuple[np.ndarray, torch.Tensor]],
) -> Message:
    """One node's message: public config, ids to embed, its gradient slices."""
    content = RecordDict({P.CONFIG: ConfigRecord(config)})
    content[P.NEW_IDS] = ArrayRecord(
        {
            P.batch_key(j): to_array(ids.astype(np.int64))
            for j, ids in enumerate(new_ids)
        }
    )
    grads: dict[str, Array] = {}
    for j, (ids, grad) in enumerate(pending):
        ids_key, grad_key = P.grad_keys(j)
        grads[ids_key] = to_array(ids.astype(np.int64))
        piece = grad[:, node.offset : node.offset + node.width]
        grads[grad_key] = to_array(piece.numpy().astype(np.float32, copy=False))
    content[P.GRADS] = ArrayRecord(grads)
    return Message(content, dst_node_id=node.node_id, message_type=message_type)


def gather_embeddings(
    nodes: Sequence[Node], replies: dict[int, Message], batches: Sequence[np.ndarray]
) -> list[torch.Tensor]:
    """Each batch's concatenated embeddings, checked for shape and finiteness."""
    out = []
    for j, ids in enumerate(batches):
        key = P.batch_key(j)
        parts = []
        for node in nodes:
            name = node_label(nodes, node.node_id)
            record = replies[node.node_id].content.array_records.get(P.EMBEDDINGS)
            if record is None or key not in record:
                raise ProtocolError(f"{name} sent no embeddings for {key}")
            emb = from_array(record[key])
            if emb.shape != (ids.size, node.width):
                raise ProtocolError(
                    f"{name} sent embeddings of shape {emb.shape} for {key}; "
                    f"expected {(ids.size, node.width)}"
                )
            if not np.all(np.isfinite(emb)):
                raise ProtocolError(f"{name} sent NaN or inf embeddings for {key}")
            parts.append(torch.as_tensor(emb, dtype=torch.float32))
        out.append(torch.cat(parts, dim=1))
    return out
