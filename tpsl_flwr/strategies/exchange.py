"""One round trip to the nodes: push, then poll for the replies without idling.

Flower's ``Grid.send_and_receive`` sleeps a fixed interval between pulls once
the first pull comes back empty: 0.1 s in simulation (``InMemoryGrid``) and
3 s on the deployment runtime (``HttpGrid``). Split learning makes one round
trip per step, so that sleep, not the work, would set the pace: a node that
answers in 20 ms still costs a full interval. :func:`exchange` uses the same
public ``push_messages``/``pull_messages`` calls, but polls after 1 ms, then
backs off by doubling up to ``max_interval``, so a round trip costs about the
nodes' time to answer. Every message the label party sends passes here, and
is checked against the protocol's allow-list before it leaves.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid

from tpsl_flwr.errors import ProtocolError
from tpsl_flwr.validation import check_positive_finite
from tpsl_flwr.wire.protocol import check_outgoing

__all__ = ["FIRST_INTERVAL", "MAX_INTERVAL", "exchange", "wait_for_nodes"]

FIRST_INTERVAL = 0.001
"""Seconds before the second pull."""
MAX_INTERVAL = 0.02
"""Default longest sleep between pulls (at most 50 pulls a second)."""


def exchange(
    grid: Grid,
    messages: Iterable[Message],
    timeout: float | None,
    max_interval: float = MAX_INTERVAL,
) -> list[Message]:
    """Push ``messages`` and return their replies, as ``grid.send_and_receive``.

    Parameters
    ----------
    grid
        Any Flower ``Grid``.
    messages
        Instruction messages.
    timeout
        Seconds to wait for all replies (``None``: no limit); replies that have
        not come by then are missing from the result, as with Flower.
    max_interval
        Longest sleep between two pulls, in seconds.

    Returns
    -------
    list of Message
        The replies received, in arrival order.

    Raises
    ------
    ConfigError
        If ``max_interval`` is not a positive, finite number.
    PrivacyError
        If a message holds anything the protocol's allow-list does not
        (:func:`~tpsl_flwr.wire.protocol.check_outgoing`); nothing is sent then.
    """
    max_interval = check_positive_finite(max_interval, "max_interval")
    outgoing = list(messages)
    for message in outgoing:
        check_outgoing(message.content)
    waiting = set(grid.push_messages(outgoing))
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
    return replies


def wait_for_nodes(grid: Grid, expected: int | None, wait: float) -> list[int]:
    """The ids of the registered nodes, once ``expected`` of them are there.

    Flower may start the ServerApp before the SuperNodes register; this polls
    ``grid.get_node_ids()`` every 0.2 s for at most ``wait`` seconds
    (``expected=None``: whoever is there now).

    Raises
    ------
    ProtocolError
        If fewer than ``expected`` nodes registered in time, or none at all.
    """
    deadline = time.monotonic() + wait
    node_ids = list(grid.get_node_ids())
    while expected is not None and len(node_ids) < expected:
        if time.monotonic() > deadline:
            raise ProtocolError(
                f"expected {expected} non-label nodes, only {len(node_ids)} "
                f"registered within {wait:g} s"
            )
        time.sleep(0.2)
        node_ids = list(grid.get_node_ids())
    if not node_ids:
        raise ProtocolError("no non-label nodes are connected")
    return node_ids
