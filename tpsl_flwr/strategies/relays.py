"""Several SuperNodes per party (``supernodes-per-party``), one party worker.

On Flower's deployment runtime a SuperNode runs one ``flwr-clientapp`` process
at a time, and each message costs a fresh one (~2 s, most of it CPU in Python's
start and Flower's imports; ``bench/README.md``, "The CPU a message costs").
With ``pipeline-depth = d`` the label party has up to ``d + 1`` messages in
flight per party, but one SuperNode still runs them one after another. With
``r`` SuperNodes per party, all forwarding to that party's one worker
(``worker-socket``), the label party sends a party's messages to its SuperNodes
in turn, so up to ``r`` process cycles overlap on the party's machine.

What keeps that correct:

* **Order.** Every message to a party after the hello carries
  :data:`~tpsl_flwr.wire.protocol.SEQUENCE`, the count of the party's messages
  sent before it in this run (public: it is the same whatever the labels).
  The worker runs a run's messages strictly in that order, holding one that
  arrives early until its predecessors have run
  (:mod:`~tpsl_flwr.wire.worker_order`). The computation is then exactly that
  of one SuperNode with the same pipeline depth.
* **One worker per party.** Each SuperNode's hello reply passes through its
  worker, which adds its random name (:data:`~tpsl_flwr.wire.protocol.WORKER_ID`);
  :func:`group_relays` refuses, before any training step, a party whose
  SuperNodes do not all report the same worker and the same description, a
  SuperNode with no worker, or a party with another number of SuperNodes.
* **Nothing new leaves the label party.** A relay gets what its party's one
  SuperNode would get; the sequence number is on the protocol's allow-list.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from flwr.app import ConfigRecord, Message
from flwr.serverapp import Grid
from flwr.superlink.grid import HttpGrid

from tpsl_flwr.errors import ConfigError, ProtocolError
from tpsl_flwr.strategies.exchange import exchange
from tpsl_flwr.strategies.node_count import refuse_extra_nodes, wait_for_nodes
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.label_side import (
    Node,
    check_replies,
    describe_nodes,
    hello_messages,
)

if TYPE_CHECKING:
    from tpsl_flwr.strategies.tpsl_strategy import TPSLStrategy

__all__ = ["Relays", "check_relay_grid", "group_relays", "hello_nodes"]


def hello_nodes(
    strategy: TPSLStrategy, grid: Grid, timeout: float, resume_epoch: int | None
) -> tuple[list[Node], Relays | None]:
    """Wait for the nodes, say hello, learn each party's partition and width.

    ``strategy.num_nodes`` parties of ``strategy.supernodes_per_party``
    SuperNodes each (``num_nodes = None``: whoever is registered), waiting up
    to ``strategy.node_wait`` seconds. Returns one
    :class:`~tpsl_flwr.wire.label_side.Node` per party, in partition order
    (its first SuperNode), and the parties' :class:`Relays` (``None`` for one
    SuperNode per party).

    Raises
    ------
    ConfigError
        :func:`check_relay_grid`.
    ProtocolError
        As :func:`~tpsl_flwr.strategies.node_count.wait_for_nodes`,
        :func:`group_relays` and
        :func:`~tpsl_flwr.wire.label_side.describe_nodes`.
    """
    num_nodes, per_party = strategy.num_nodes, strategy.supernodes_per_party
    check_relay_grid(grid, per_party)
    expected = None if num_nodes is None else num_nodes * per_party
    wait = strategy.node_wait
    node_ids = wait_for_nodes(grid, expected, wait)
    hello = hello_messages(node_ids, resume_epoch)  # may start each node's app
    replies = exchange(grid, hello, timeout + wait, strategy.poll_interval)
    relays = None
    if per_party > 1:
        replies, node_ids, relays = group_relays(replies, node_ids, per_party)
    nodes = describe_nodes(replies, node_ids, num_nodes)
    refuse_extra_nodes(nodes, num_nodes)
    return nodes, relays


def check_relay_grid(grid: Grid, per_party: int) -> None:
    """Refuse ``per_party > 1`` anywhere but Flower's deployment runtime.

    Raises
    ------
    ConfigError
        Naming the setting, for a simulation or in-process grid.
    """
    if per_party > 1 and not isinstance(grid, HttpGrid):
        raise ConfigError(
            f"supernodes-per-party = {per_party} is for Flower's deployment runtime "
            "(several flower-supernode processes per party, one party worker); "
            f"this grid is {type(grid).__name__}: use supernodes-per-party = 1"
        )


class Relays:
    """Each party's SuperNodes: messages go to them in turn, numbered.

    Parameters
    ----------
    groups
        The first SuperNode's id (the one :attr:`TPSLStrategy.nodes` names) ->
        every SuperNode id of that party, the first one first.
    """

    def __init__(self, groups: dict[int, list[int]]) -> None:
        self.groups = {first: list(ids) for first, ids in groups.items()}
        self.first_of = {n: first for first, ids in groups.items() for n in ids}
        self.sent = dict.fromkeys(groups, 0)

    def route(self, messages: Sequence[Message]) -> None:
        """Number each message and address it to its party's next SuperNode.

        Raises
        ------
        ProtocolError
            For a message to a node that is no party's first SuperNode.
        """
        for message in messages:
            first = message.metadata.dst_node_id
            ids = self.groups.get(first)
            if ids is None:
                raise ProtocolError(f"no party's first SuperNode is node {first}")
            count = self.sent[first]
            self.sent[first] = count + 1
            config = message.content.config_records.get(P.CONFIG)
            if config is None:
                config = message.content[P.CONFIG] = ConfigRecord()
            config[P.SEQUENCE] = count
            message.metadata.dst_node_id = ids[count % len(ids)]

    def merge(
        self, outgoing: Sequence[Message], replies: list[Message]
    ) -> list[Message]:
        """``replies``, each from a relay re-made in its party's first node's name."""
        sent = {m.metadata.message_id: m for m in outgoing}
        merged = []
        for reply in replies:
            message = sent.get(reply.metadata.reply_to_message_id)
            if message is None:
                merged.append(reply)
                continue
            relay = message.metadata.dst_node_id
            first = self.first_of.get(relay, relay)
            if first == relay:
                merged.append(reply)
                continue
            message.metadata.dst_node_id = first
            body = reply.error if reply.has_error() else reply.content
            merged.append(Message(body, reply_to=message))
            message.metadata.dst_node_id = relay
        return merged


def group_relays(
    replies: list[Message], sent: Sequence[int], per_party: int
) -> tuple[list[Message], list[int], Relays]:
    """Each party's first SuperNode's hello reply, and the party's SuperNodes.

    Parameters
    ----------
    replies
        The hello replies of every node in ``sent``.
    sent
        Every node sent a hello, in the order registered.
    per_party
        ``supernodes-per-party``.

    Returns
    -------
    tuple
        The hello replies of each party's first SuperNode (for
        :func:`~tpsl_flwr.wire.label_side.describe_nodes`), their node ids, and
        the :class:`Relays`.

    Raises
    ------
    ProtocolError
        As :func:`~tpsl_flwr.wire.label_side.check_replies`; or, naming the
        partition, a party with another number of SuperNodes than
        ``per_party``, a SuperNode without a party worker, or SuperNodes of one
        party whose descriptions or workers differ.
    """
    by_node = check_replies([], replies, sent)
    parties: dict[object, list[int]] = defaultdict(list)
    for node_id in sent:
        info = by_node[node_id].content.config_records.get(P.NODE)
        if info is None:
            raise ProtocolError(f"node {node_id} did not describe itself")
        parties[info.get(P.PARTITION_ID)].append(node_id)
    groups = {}
    for partition, ids in parties.items():
        infos = [dict(by_node[n].content.config_records[P.NODE]) for n in ids]
        if len(ids) != per_party:
            raise ProtocolError(
                f"partition {partition} has {len(ids)} SuperNode(s) {ids}, but the "
                f"run has supernodes-per-party = {per_party}: start that many "
                "flower-supernode processes per party, all with the party's "
                "worker-socket"
            )
        if not all(info.get(P.WORKER_ID) for info in infos):
            raise ProtocolError(
                f"a SuperNode of partition {partition} {ids} has no party worker: "
                f"supernodes-per-party = {per_party} needs every SuperNode of a "
                "party to forward to the party's one worker (worker-socket)"
            )
        if any(info != infos[0] for info in infos):
            raise ProtocolError(
                f"the SuperNodes {ids} of partition {partition} do not describe one "
                "party (different workers or data): give them the same "
                "worker-socket"
            )
        groups[ids[0]] = ids
    firsts = list(groups)
    return [by_node[n] for n in firsts], firsts, Relays(groups)
