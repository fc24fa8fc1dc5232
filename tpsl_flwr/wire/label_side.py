"""The label party's side of the wire: node bookkeeping, messages and replies.

Builds the messages :class:`~tpsl_flwr.strategies.TPSLStrategy` sends (only
sample ids, perturbed gradient slices and public config, see
:mod:`tpsl_flwr.wire.protocol`) and checks every reply, naming the node and its
partition in each error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from logging import ERROR, WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.common.logger import log

from tpsl_flwr.errors import ConfigError, ProtocolError
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.arrays import from_array, to_array
from tpsl_flwr.wire.batch_pack import split_rows, stack_rows
from tpsl_flwr.wire.node_edge import read_node_error


@dataclass(frozen=True)
class Node:
    """A non-label node: its id, partition, columns of the cut layer and sizes."""

    node_id: int
    partition: int
    width: int
    offset: int
    num_train: int = 0
    num_test: int = 0


def node_label(
    nodes: Sequence[Node], node_id: int, partition: int | None = None
) -> str:
    """``"node <id> (partition <p>)"`` for error messages.

    The partition comes from ``nodes``, else from ``partition`` (what the
    node said of itself), else it is left out.
    """
    for node in nodes:
        if node.node_id == node_id:
            return f"node {node_id} (partition {node.partition})"
    if partition is not None:
        return f"node {node_id} (partition {partition})"
    return f"node {node_id}"


def node_error(nodes: Sequence[Node], reply: Message) -> ProtocolError:
    """A node's error reply as one line: node, partition, then the root cause.

    The wrapper around the cause (Ray's ``RayTaskError(ClientAppException)``
    text and its traceback) goes to the log only
    (:func:`~tpsl_flwr.wire.node_edge.read_node_error`).
    """
    found = read_node_error(reply.error.reason or "")
    name = node_label(nodes, reply.metadata.src_node_id, found.partition)
    if found.detail is not None:
        # Every line of the node's text is quoted, so none of it can pass for
        # a line of the label party's own log (a progress or epsilon line).
        quoted = "\n".join(f"  | {line}" for line in found.detail.splitlines())
        log(ERROR, "%s replied with an error; its full text:\n%s", name, quoted)
    return ProtocolError(f"{name} replied with an error: {found.cause}")


def check_replies(
    nodes: Sequence[Node], replies: Iterable[Message], expected: Iterable[int]
) -> dict[int, Message]:
    """Index replies by sender; raise on an error, a stray or a missing reply.

    Raises
    ------
    ProtocolError
        Naming the node and its partition: for an error reply (for a node
        that stopped answering, code ``NODE_UNAVAILABLE``: no reply within
        the reply-timeout or no Flower heartbeat, the message says to restart
        it and resume the run), a reply from a node that was sent nothing, a
        second reply from one node, or no reply.
    """
    expected = list(expected)
    by_node: dict[int, Message] = {}
    for reply in replies:
        src = reply.metadata.src_node_id
        name = node_label(nodes, src)
        if reply.has_error():
            if reply.error.code == ErrorCode.NODE_UNAVAILABLE:
                raise ProtocolError(
                    f"{name} stopped answering ({reply.error.reason}); restart it "
                    "and resume the run (resume = true) from the last checkpoint"
                )
            raise node_error(nodes, reply)
        if src not in expected:
            raise ProtocolError(f"a reply came from {name}, which was sent nothing")
        if src in by_node:
            raise ProtocolError(f"{name} replied twice to one message")
        by_node[src] = reply
    missing = [n for n in expected if n not in by_node]
    if missing:
        names = ", ".join(node_label(nodes, n) for n in missing)
        raise ProtocolError(f"no reply from {names} before the timeout")
    return by_node


def check_echo(
    nodes: Sequence[Node], by_node: Mapping[int, Message], expected: Mapping[str, int]
) -> None:
    """Refuse a reply that does not confirm each of ``expected``'s settings.

    A node says what it did with a setting in its reply's :data:`~.protocol.ECHO`
    record (the tail average's :data:`~.protocol.AVERAGE_IN`,
    :data:`~.protocol.AVERAGED` and :data:`~.protocol.RESTORE_AVERAGE`). A node
    that ignored the setting, such as an older tpsl-flwr that drops keys it does
    not know, replies without it: its weights are then not the ones the label
    party combines with its own, and the run stops instead of reporting the mix.

    Raises
    ------
    ProtocolError
        Naming the node, its partition, the setting, the value the label party
        expected and the one the node echoed (or that it echoed none).
    """
    for node_id, reply in by_node.items():
        echo = reply.content.config_records.get(P.ECHO, ConfigRecord())
        for key, want in expected.items():
            got = echo.get(key)
            if isinstance(got, bool) or not isinstance(got, int) or got != want:
                said = "nothing" if got is None else repr(got)
                raise ProtocolError(
                    f"{node_label(nodes, node_id)} did not confirm {key} = {want}: "
                    f"its reply echoes {key} = {said} (a node that ignores {key}, "
                    "such as an older tpsl-flwr, holds other weights than the "
                    "label party's); update tpsl-flwr on that node, or run with "
                    "average = off"
                )


def hello_messages(
    node_ids: Sequence[int], resume_epoch: int | None, *, checkpoints: bool = False
) -> list[Message]:
    """Ask each node to describe itself (and, on resume, to load its checkpoint).

    ``checkpoints``: the label party will ask for a checkpoint every epoch,
    so a node without a checkpoint folder refuses now, before the first step.
    """
    config = ConfigRecord(
        {} if resume_epoch is None else {P.RESUME_EPOCH: resume_epoch}
    )
    if checkpoints:
        config[P.CHECKPOINTS] = 1
    return [
        Message(RecordDict({P.CONFIG: config}), dst_node_id=n, message_type=P.MSG_HELLO)
        for n in node_ids
    ]


def describe_nodes(
    replies: Iterable[Message], sent: Sequence[int], expected: int | None = None
) -> list[Node]:
    """Nodes in partition order with their cut-layer columns, from hello replies.

    Parameters
    ----------
    replies
        The replies to the hello messages sent to the nodes ``sent``.
    sent
        Every node that was sent a hello (all registered nodes).
    expected
        The number of nodes the run needs (``None``: all of ``sent``). A
        SuperNode that restarts registers under a new id while Flower lists
        its old id until its heartbeat expires (up to 2 x 30 s): of more
        than ``expected`` nodes, those Flower then reports unavailable are
        left out, with a warning naming them.

    Raises
    ------
    ProtocolError
        As :func:`check_replies`, or if the partitions are not ``0..n-1``.
    """
    replies = list(replies)
    spare = 0 if expected is None else len(sent) - expected
    stale = [
        r.metadata.src_node_id
        for r in replies
        if r.has_error() and r.error.code == ErrorCode.NODE_UNAVAILABLE
    ]
    if stale and len(stale) <= spare:
        log(WARNING, "Left out unavailable nodes %s (restarted SuperNodes?)", stale)
        replies = [r for r in replies if r.metadata.src_node_id not in stale]
        sent = [n for n in sent if n not in stale]
    described = []
    for node_id, reply in check_replies([], replies, sent).items():
        info = reply.content.config_records.get(P.NODE)
        if info is None:
            raise ProtocolError(f"node {node_id} did not describe itself")
        facts = []
        for key in (P.PARTITION_ID, P.EMBEDDING_DIM, P.NUM_TRAIN, P.NUM_TEST):
            if key not in info:
                raise ProtocolError(f"node {node_id} did not report its {key}")
            facts.append(P.as_int(info[key], key))
        described.append((facts[0], node_id, *facts[1:]))
    described.sort()
    partitions = [p for p, *_ in described]
    if partitions != list(range(len(described))):
        raise ProtocolError(
            f"nodes report partitions {partitions}; expected 0..{len(described) - 1}"
        )
    nodes, offset = [], 0
    for partition, node_id, width, num_train, num_test in described:
        nodes.append(Node(node_id, partition, width, offset, num_train, num_test))
        offset += width
    return nodes


def check_sample_counts(
    nodes: Sequence[Node], *, num_train: int, num_test: int | None
) -> None:
    """Refuse nodes whose splits are not the label party's ids ``0..n-1``.

    Parameters
    ----------
    nodes
        The nodes, as :func:`describe_nodes` returned them.
    num_train
        The label party's number of training labels.
    num_test
        Its number of test labels, or ``None`` when it does not evaluate.

    Raises
    ------
    ProtocolError
        Naming the node, its partition and both numbers.
    """
    for node in nodes:
        name = node_label(nodes, node.node_id)
        if node.num_train != num_train:
            missing = (
                f" (its train partition is {num_train - node.num_train} rows "
                "short; rows are matched by position, so the count cannot tell "
                "which records are missing: compare each party's record keys, "
                "in order, with the label party's)"
                if node.num_train < num_train
                else ""
            )
            raise ProtocolError(
                f"{name} holds {node.num_train} train samples but the label party "
                f"holds {num_train} training labels: sample ids must be 0..n-1 at "
                f"every node, with n the number of labels{missing}"
            )
        if num_test is not None and node.num_test != num_test:
            held = (
                "no 'test' split"
                if node.num_test == 0
                else f"{node.num_test} test samples"
            )
            raise ProtocolError(
                f"{name} holds {held} but test_labels holds {num_test} labels: test "
                "sample ids must be 0..n-1 at every node, with n = len(test_labels)"
            )


def check_top_model(top: torch.nn.Module, nodes: Sequence[Node], outputs: int) -> None:
    """Run a zeros ``(1, total width)`` through ``top``; check the logits' width.

    The forward runs once, without gradient and in eval mode (no dropout
    draw, no batch-norm update).

    Parameters
    ----------
    top
        The label party's top model.
    nodes
        The nodes; their embedding widths add up to the top model's input.
    outputs
        Logits the labels need: 1 for binary labels, ``k`` for ``k`` classes.

    Raises
    ------
    ConfigError
        In one line: the top model's expected input (when known) and the
        nodes' total width, or the logits it returns and those needed.
    """
    width = sum(node.width for node in nodes)
    total = f"the {len(nodes)} nodes' embeddings add up to {width}"
    declared = getattr(top, "in_dim", width)
    if declared != width:
        raise ConfigError(f"the top model takes {declared} inputs but {total}")
    layout = getattr(top, "node_widths", None)
    if layout is not None:
        for node, expected in zip(nodes, layout, strict=False):
            if node.width != expected:
                raise ConfigError(
                    f"the top model expects {expected} cut-layer columns from "
                    f"partition {node.partition} but it sends {node.width} (do "
                    f"the nodes run the same model and embedding-dim?)"
                )
    training = top.training
    top.eval()
    try:
        with torch.no_grad():
            logits = top(torch.zeros((1, width), dtype=torch.float32))
    except (RuntimeError, TypeError, ValueError, IndexError) as err:
        expected = _input_width(top)
        takes = (
            f"does not take {total}"
            if expected is None
            else f"takes {expected} inputs but {total}"
        )
        reason = " ".join(str(err).split())
        raise ConfigError(
            f"the top model {takes}: a no-grad forward of a zeros (1, {width}) "
            f"tensor raised {type(err).__name__}: {reason}"
        ) from err
    finally:
        top.train(training)
    shape = tuple(getattr(logits, "shape", ()))
    if len(shape) != 2 or shape[1] != outputs:
        need = (
            "binary labels need 1 logit (sigmoid + BCE)"
            if outputs == 1
            else f"{outputs} classes need {outputs} logits (softmax + CE)"
        )
        raise ConfigError(
            f"the top model maps a (1, {width}) input to shape {shape}; {need}: "
            f"shape (1, {outputs})"
        )


def _input_width(top: torch.nn.Module) -> int | None:
    """The top model's ``in_dim``, else its first layer's ``in_features``."""
    in_dim = getattr(top, "in_dim", None)
    if isinstance(in_dim, int):
        return in_dim
    for module in top.modules():
        features = getattr(module, "in_features", None)
        if isinstance(features, int):
            return features
    return None


def step_message(
    node: Node,
    message_type: str,
    config: dict[str, Any],
    new_ids: Sequence[np.ndarray],
    pending: Sequence[tuple[np.ndarray, torch.Tensor]],
    wire_dtype: str = "float32",
) -> Message:
    """One node's message: public config, ids to embed, its gradient slices.

    Each record holds one array, its batches stacked, with their row counts in
    the config (:mod:`~tpsl_flwr.wire.batch_pack`): a message is the same few
    Flower objects whatever its number of batches. ``wire_dtype = "float16"``
    sends the gradient slices as scaled float16
    (:mod:`~tpsl_flwr.wire.wire_dtype`): cast after GradPerturb perturbed
    them, so post-processing of the release (epsilon unchanged).
    """
    config = dict(config)
    content = RecordDict()
    new_record = ArrayRecord()
    if new_ids:
        ids, config[P.BATCH_ROWS] = stack_rows([i.astype(np.int64) for i in new_ids])
        new_record[P.IDS_KEY] = to_array(ids)
    grads = ArrayRecord()
    if pending:
        ids, config[P.GRAD_ROWS] = stack_rows([i.astype(np.int64) for i, _ in pending])
        pieces = [
            g[:, node.offset : node.offset + node.width].numpy() for _, g in pending
        ]
        for (batch, _), piece in zip(pending, pieces, strict=True):
            if piece.shape != (batch.size, node.width):  # never send a misfit
                raise ProtocolError(
                    f"a gradient slice of shape {piece.shape} for {batch.size} ids; "
                    f"{node_label([node], node.node_id)} takes width {node.width}"
                )
        grads[P.IDS_KEY] = to_array(ids)
        grads[P.GRAD_KEY] = to_array(
            np.concatenate(pieces).astype(np.float32, copy=False), wire_dtype
        )
    content[P.CONFIG] = ConfigRecord(config)
    content[P.NEW_IDS] = new_record
    content[P.GRADS] = grads
    return Message(content, dst_node_id=node.node_id, message_type=message_type)


def gather_embeddings(
    nodes: Sequence[Node], replies: dict[int, Message], batches: Sequence[np.ndarray]
) -> list[torch.Tensor]:
    """Each batch's concatenated embeddings, checked for shape and finiteness.

    Each reply holds one array, the batches' embeddings stacked in the order
    they were asked for (:mod:`~tpsl_flwr.wire.batch_pack`).

    Raises
    ------
    ProtocolError
        Naming the node and its partition, if a node sent no embeddings, other
        arrays than its embeddings, embeddings of another shape than ``(rows
        asked for, its width)``, or NaN or inf.
    """
    rows = sum(ids.size for ids in batches)
    per_node: list[list[np.ndarray]] = []
    for node in nodes:
        name = node_label(nodes, node.node_id)
        record = replies[node.node_id].content.array_records.get(P.EMBEDDINGS)
        keys = set(record.keys()) if record is not None else set()
        extra = sorted(keys - {P.EMBEDDINGS_KEY})
        if extra:
            raise ProtocolError(
                f"{name} sent {', '.join(extra)}, which it was not asked for"
            )
        if record is None or P.EMBEDDINGS_KEY not in keys:
            if not batches:
                per_node.append([])
                continue
            raise ProtocolError(f"{name} sent no embeddings")
        try:
            emb = from_array(record[P.EMBEDDINGS_KEY])
        except (TypeError, ValueError, ProtocolError) as err:
            raise ProtocolError(f"{name} sent unreadable embeddings: {err}") from None
        if emb.dtype.kind != "f":
            raise ProtocolError(f"{name} sent {emb.dtype} embeddings; expected floats")
        with np.errstate(over="ignore"):  # an overflow is refused just below
            emb = emb.astype(np.float32, copy=False)
        if emb.shape != (rows, node.width):
            raise ProtocolError(
                f"{name} sent embeddings of shape {emb.shape} for {len(batches)} "
                f"batch(es) of {rows} ids; expected {(rows, node.width)}"
            )
        if not np.all(np.isfinite(emb)):
            raise ProtocolError(f"{name} sent NaN or inf embeddings")
        counts = [ids.size for ids in batches]
        per_node.append(split_rows(emb, counts, f"{name}'s embeddings"))
    return [
        torch.cat(
            [torch.as_tensor(parts[j], dtype=torch.float32) for parts in per_node],
            dim=1,
        )
        for j in range(len(batches))
    ]
