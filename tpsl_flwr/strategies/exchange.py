"""One round trip to the nodes: push, then poll for the replies without idling.

Flower's ``Grid.send_and_receive`` sleeps a fixed interval between pulls once
the first pull comes back empty: 0.1 s in simulation (``InMemoryGrid``) and
3 s on the deployment runtime (``HttpGrid``). Split learning makes one round
trip per step, so that sleep, not the work, would set the pace: a node that
answers in 20 ms still costs a full interval. :func:`exchange` uses the same
public ``push_messages``/``pull_messages`` calls, but polls after 1 ms, then
backs off by doubling up to ``max_interval``, so a round trip costs about the
nodes' time to answer. :func:`push` and :func:`collect` are its two halves,
for a caller that keeps messages in flight while it collects older replies
(``pipeline-depth``). Every message the label party sends passes here, and is
checked against the protocol's allow-list before it leaves.

A node that stops answering is bounded by ``timeout`` (the run config's
``reply-timeout``, 60 s by default): when it passes, each node still silent
gets an error reply in its own name (:data:`NO_REPLY`), so the caller's
:func:`~tpsl_flwr.wire.label_side.check_replies` stops the run with one error
naming the node and its partition. Flower's own error reply for a SuperNode
whose heartbeats stopped comes from the SuperLink; it is re-addressed to the
node too.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from flwr.app import Error, Message
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from tpsl_flwr._util.checks import check_positive_finite
from tpsl_flwr.wire.protocol import check_outgoing

__all__ = [
    "FIRST_INTERVAL",
    "MAX_INTERVAL",
    "NOT_DELIVERED",
    "NO_REPLY",
    "Pushed",
    "collect",
    "exchange",
    "push",
]

FIRST_INTERVAL = 0.001
"""Seconds before the second pull."""
MAX_INTERVAL = 0.02
"""Default longest sleep between pulls (at most 50 pulls a second)."""
NO_REPLY = "no reply within {timeout:g} s, the reply-timeout"
"""Reason of the error reply :func:`exchange` makes for a node silent too long."""
NOT_DELIVERED = "the grid did not accept the message for this node"
"""Reason of the error reply for a message the grid refused to push."""


def exchange(
    grid: Grid,
    messages: Iterable[Message],
    timeout: float | None,
    max_interval: float = MAX_INTERVAL,
) -> list[Message]:
    """Push ``messages`` and return their replies, as ``grid.send_and_receive``.

    :func:`push` then :func:`collect`.

    Parameters
    ----------
    grid
        Any Flower ``Grid``.
    messages
        Instruction messages.
    timeout
        Seconds to wait for all replies (``None``: no limit). A node that has
        not replied by then gets an error reply in its name, code
        ``NODE_UNAVAILABLE``, reason :data:`NO_REPLY`; so does a node whose
        message the grid did not accept (:data:`NOT_DELIVERED`).
    max_interval
        Longest sleep between two pulls, in seconds.

    Returns
    -------
    list of Message
        The replies received, in arrival order, then the error replies made
        here. An error reply Flower makes for a node (``src_node_id`` the
        SuperLink's) is re-addressed to that node.

    Raises
    ------
    ConfigError
        If ``max_interval`` is not a positive, finite number.
    PrivacyError
        If a message holds anything the protocol's allow-list does not
        (:func:`~tpsl_flwr.wire.protocol.check_outgoing`); nothing is sent then.
    """
    max_interval = check_positive_finite(max_interval, "max_interval")
    return collect(grid, push(grid, messages), timeout, max_interval)


@dataclass(frozen=True)
class Pushed:
    """Messages a grid accepted, whose replies :func:`collect` is to pull."""

    outgoing: list[Message]
    """Every message handed to the grid (accepted or not)."""
    accepted: frozenset[str]
    """The ids the grid returned for them."""


def push(grid: Grid, messages: Iterable[Message]) -> Pushed:
    """Check every message against the allow-list, then push them all now.

    Raises
    ------
    PrivacyError
        If a message holds anything the protocol's allow-list does not
        (:func:`~tpsl_flwr.wire.protocol.check_outgoing`); nothing is sent then.
    """
    outgoing = list(messages)
    for message in outgoing:
        check_outgoing(message.content)
    accepted = frozenset(i for i in grid.push_messages(outgoing) if i is not None)
    return Pushed(outgoing, accepted)


def collect(
    grid: Grid,
    pushed: Pushed,
    timeout: float | None,
    max_interval: float = MAX_INTERVAL,
) -> list[Message]:
    """The replies to ``pushed``, polling as :func:`exchange` does.

    ``timeout`` counts from this call (a message pushed earlier may wait
    behind another one at its node); replies and error replies as
    :func:`exchange` returns them.
    """
    max_interval = check_positive_finite(max_interval, "max_interval")
    waiting = set(pushed.accepted)
    deadline = None if timeout is None else time.monotonic() + timeout
    replies: list[Message] = []
    interval = min(FIRST_INTERVAL, max_interval)
    while waiting:
        arrived = list(grid.pull_messages(waiting))
        replies += arrived
        waiting -= {reply.metadata.reply_to_message_id for reply in arrived}
        if not waiting:
            break
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(interval, left))
        else:
            time.sleep(interval)
        interval = min(2 * interval, max_interval)
    return _in_the_nodes_names(pushed.outgoing, replies, waiting, timeout)


def _in_the_nodes_names(
    outgoing: list[Message],
    replies: list[Message],
    waiting: set[str],
    timeout: float | None,
) -> list[Message]:
    """``replies``, each error in its node's name, plus one for each silent node."""
    sent = {m.metadata.message_id: m for m in outgoing if m.metadata.message_id}
    named = []
    for reply in replies:
        message = sent.get(reply.metadata.reply_to_message_id)
        if (
            message is not None
            and reply.has_error()
            and reply.metadata.src_node_id != message.metadata.dst_node_id
        ):
            reply = Message(reply.error, reply_to=message)
        named.append(reply)
    answered = {reply.metadata.reply_to_message_id for reply in replies}
    for message_id, message in sent.items():
        if message_id in answered:
            continue
        reason = NO_REPLY.format(timeout=timeout) if message_id in waiting else None
        error = Error(ErrorCode.NODE_UNAVAILABLE, reason or NOT_DELIVERED)
        named.append(Message(error, reply_to=message))
    return named
