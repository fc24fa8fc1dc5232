"""Party actors: on Ray, each node's party lives in one Ray actor for the run.

Flower's Ray simulation runs a node's messages on whichever of its
``ClientAppActor`` processes is free, so a ClientApp keeps nothing between messages:
the node's bottom model and optimizer state travel in ``context.state`` with
every message, encoded by the node, pickled by Ray, stored by the simulation
process and back. For a Criteo node that is ~41 MB a message (13 tables of
2**15 x 8 and Adam's two moments), and a 1M-row epoch runs at ~2,400
samples/s against ~25,000 in-process (``bench/README.md``).

With the run config's ``party-actors = true`` the ClientApp forwards each
message to the node's **party actor** instead: a named Ray actor
(``tpsl-party-<run>-<partition>-of-<partitions>``), created on the first
message on the same Ray node as the ClientApp actor that met it (Ray's node
affinity: the data path must be valid on the host that runs the node's
messages, as without party actors), and kept for the run. It runs the message
through the node's ClientApp (:class:`ActorNode`: the same ClientApp as every
engine, :func:`~tpsl_flwr.experiments.node_party.make_node_app`) and keeps the
node's state in its own memory, so only the message and the reply cross: ids,
perturbed gradients, embeddings.

It is one process per node, as the deployment's warm executor is, which never
sees a label, the noise key or another node's columns, and keeps the node's
party in memory without encoding it (``APP_KEEPS_STATE``). It
reserves no CPU (``num_cpus=0``): it computes while the ClientApp actor that
created it waits, inside that actor's reservation, with as many torch threads
as that actor has CPUs; Ray neither counts nor limits its memory (one process
per node, beside the ClientApp actors). Like every Ray actor it can be found by
name by any job on the same cluster: a Ray cluster is one trust domain. It shares
its owner's fate: if the ClientApp actor that created it ends, it ends, and
the node's next message fails (the run stops) instead of meeting a fresh
model; a failed message leaves the state as it was. The node's
``context.state`` carries only the count of messages its actor has answered
(``tpsl.party-actor``); an actor whose count differs (a new actor, after the
old one ended) refuses the message.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import OrderedDict
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common import serde
from flwr.proto.message_pb2 import Message as ProtoMessage  # pylint: disable=E0611
from flwr.proto.recorddict_pb2 import (  # pylint: disable=E0611
    RecordDict as ProtoRecordDict,
)

from tpsl_flwr.errors import ConfigError, ProtocolError
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.protocol import parse_bool

__all__ = [
    "PARTY_ACTORS",
    "STATE_KEY",
    "ActorNode",
    "PartyActor",
    "PartyActorError",
    "actor_name",
    "ask_party_actor",
    "party_actors_on",
]

PARTY_ACTORS = "party-actors"
"""Run-config key: each node's party in one Ray actor (ray imported on use)."""

_LOG = logging.getLogger("tpsl_flwr.party_actor")
_KEEP_RUNS = 4


class PartyActorError(ProtocolError):
    """The node's party actor refused, failed or is gone."""


def party_actors_on(run_config: Any) -> bool:
    """``party-actors`` read as the label party's config reads a bool.

    By :func:`~tpsl_flwr.wire.protocol.parse_bool`, the label party's rule, so
    a node never takes the default path for a value the label party read as
    ``true``.

    Examples
    --------
    >>> [party_actors_on({"party-actors": v}) for v in (True, "TRUE", 1, "0", False)]
    [True, True, True, False, False]
    >>> party_actors_on({})
    False
    """
    raw = run_config.get(PARTY_ACTORS, False)
    try:
        return parse_bool(raw)
    except ValueError:
        raise ValueError(f"{PARTY_ACTORS} must be a boolean, got {raw!r}") from None


STATE_KEY = "tpsl.party-actor"
"""``context.state`` record: ``version``, the messages the node's actor answered."""

_HANDLES: dict[tuple[int, int, int], Any] = {}
"""This process's handles, by (run, partition, partitions): one lookup a node."""


def actor_name(run_id: int, partition: int, partitions: int) -> str:
    """The party actor's Ray name for one node of one run.

    Examples
    --------
    >>> actor_name(7, 0, 2)
    'tpsl-party-7-0-of-2'
    """
    return f"tpsl-party-{run_id}-{partition}-of-{partitions}"


class ActorNode:
    """Runs a node's messages through the node's ClientApp, keeping its contexts.

    The node's state lives here, not in the node's Flower context: one
    ClientApp object serves every message, so the context says so
    (``protocol.APP_KEEPS_STATE``, as the in-process engine's) and the party
    stays in the app object. A run's first message here must be its hello: a
    fresh actor refuses the run's next message rather than continue from a
    freshly built party. A failed message leaves the context as it was and
    drops the app object's party, so the run's next message fails too, never
    meeting a half-updated party. Every message is logged with the times it
    was received and answered (``actor <partition> <type> recv <t> sent <t>``,
    ``time.time()`` seconds).

    Parameters
    ----------
    partition_id, num_partitions
        The node this actor serves; a message from a node with another
        ``partition-id``/``num-partitions`` is refused.
    """

    def __init__(self, partition_id: int, num_partitions: int) -> None:
        from tpsl_flwr.simulations import node_app

        self.partition_id = partition_id
        self.num_partitions = num_partitions
        self._node_app = node_app
        self.contexts: OrderedDict[int, Context] = OrderedDict()
        self.app = node_app.make_node_app()
        _warm_torch()

    def _context(self, context: Context, hello: bool) -> Context:
        node = context.node_config
        got = (
            P.as_int(node.get(P.PARTITION_ID, -1), "partition-id"),
            P.as_int(node.get(P.NUM_PARTITIONS, -1), "num-partitions"),
        )
        if got != (self.partition_id, self.num_partitions):
            raise ProtocolError(
                f"this actor serves partition {self.partition_id} of "
                f"{self.num_partitions}; the node config says "
                f"partition {got[0]} of {got[1]}"
            )
        kept = self.contexts.get(context.run_id)
        if kept is None and not hello:
            raise ProtocolError(
                f"this actor holds no state of run {context.run_id}: it did not "
                "answer the run's hello; resume the run (resume = true), whose "
                "hello loads the last checkpoint"
            )
        if kept is None:
            kept = Context(
                context.run_id,
                context.node_id,
                dict(node),
                RecordDict({P.APP_KEEPS_STATE: ConfigRecord({"same-object": True})}),
                dict(context.run_config),
            )
            self.contexts[context.run_id] = kept
            while len(self.contexts) > _KEEP_RUNS:
                self.contexts.popitem(last=False)
        return kept

    def handle(self, message: Message, context: Context) -> Message:
        """Run ``message`` on the node's ClientApp under the run's kept context."""
        from tpsl_flwr.engines.message_copy import copy_context
        from tpsl_flwr.engines.virtual_nodes import task_identity

        received = time.time()
        kept = self._context(context, message.metadata.message_type == P.MSG_HELLO)
        trial = copy_context(kept)
        try:
            with task_identity(context.run_id, context.node_id, 0):
                reply = self.app(message, trial)
        except Exception:
            _LOG.exception("the node's ClientApp raised")
            # its party may be half-updated: a fresh app object has none, so the
            # context's version finds nothing and the run's next message fails
            self.app = self._node_app.make_node_app()
            raise
        kept.state = trial.state  # only a successful message updates the state
        _LOG.info(
            "actor %d %s recv %.4f sent %.4f",
            self.partition_id,
            message.metadata.message_type,
            received,
            time.time(),
        )
        return reply


def _warm_torch() -> None:
    """One Adam step on a throwaway model: torch's lazy imports happen now."""
    import torch

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.zeros(3, 4)).sum().backward()
    optimizer.step()


class PartyActor:
    """The actor's body: an :class:`ActorNode` for one node, answering bytes.

    Parameters
    ----------
    partition_id, num_partitions
        The node this actor serves (a message naming another is refused, as is
        one of another Flower node id than its first message's).
    threads
        Torch threads: the CPUs of the ClientApp actor that created it.
    """

    def __init__(self, partition_id: int, num_partitions: int, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)  # the forwarding actor's CPUs, not Ray's 1
        self.node = ActorNode(partition_id, num_partitions)
        self.version = -1  # messages answered - 1
        self.node_id: int | None = None

    def handle(
        self,
        message: bytes,
        run_id: int,
        node_id: int,
        node_config: dict[str, Any],
        run_config: dict[str, Any],
        expected: int,
    ) -> tuple[bool, bytes, int]:
        """``(True, reply content protobuf, version)``, or ``(False, reason, version)``.

        ``expected`` is the version the node's context records; another
        version here means this actor did not train the node so far.
        """
        if self.node_id is None:
            self.node_id = node_id
        if node_id != self.node_id:
            reason = f"this actor serves node {self.node_id}, not node {node_id}"
            return False, reason.encode(), self.version
        if expected != self.version:
            reason = (
                f"this actor holds the node's state after {self.version + 1} "
                f"message(s), the node's context after {expected + 1}: it did not "
                "train this node (was its actor restarted?); refusing a fresh model"
            )
            return False, reason.encode(), self.version
        try:
            proto = ProtoMessage()
            proto.ParseFromString(message)
            context = Context(run_id, node_id, node_config, RecordDict(), run_config)
            reply = self.node.handle(serde.message_from_proto(proto), context)
            if reply.has_error():
                raise PartyActorError(reply.error.reason)
            body = serde.recorddict_to_proto(reply.content).SerializeToString()
        except Exception as ex:  # pylint: disable=broad-exception-caught
            return False, f"{type(ex).__name__}: {ex}".encode(), self.version
        self.version += 1
        return True, body, self.version


@functools.cache
def _remote_class() -> Any:
    import ray

    return ray.remote(num_cpus=0)(PartyActor)


def _handle(context: Context) -> tuple[str, Any]:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = context.node_config
    partition = P.as_int(node.get(P.PARTITION_ID, -1), "partition-id")
    partitions = P.as_int(node.get(P.NUM_PARTITIONS, -1), "num-partitions")
    name = actor_name(context.run_id, partition, partitions)
    key = (context.run_id, partition, partitions)
    if key not in _HANDLES:
        runtime = ray.get_runtime_context()
        here = runtime.get_node_id()
        try:
            cpus = runtime.get_assigned_resources().get("CPU", 1)
        except AssertionError:  # a driver, not a Ray worker (tests): no CPUs given
            cpus = 1
        threads = max(1, int(cpus))
        _HANDLES[key] = (
            _remote_class()
            .options(
                name=name,
                get_if_exists=True,
                scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
            )
            .remote(partition, partitions, threads)
        )
    return name, _HANDLES[key]


def ask_party_actor(message: Message, context: Context) -> RecordDict:
    """Have the node's party actor handle ``message``; return the reply content.

    Raises
    ------
    ConfigError
        If this process is not a Ray worker (``party-actors`` is for Flower's
        Ray simulation only).
    PartyActorError
        If the actor's ClientApp raised (its reason in the message) or the
        actor is gone (its owner ended): never a fresh party.
    """
    import ray

    if not ray.is_initialized():
        raise ConfigError(
            f"{PARTY_ACTORS} = true needs Flower's Ray simulation (this ClientApp "
            "runs outside Ray); set it only with the ray engine"
        )
    name, actor = _handle(context)
    record = context.state.config_records.get(STATE_KEY)
    expected = -1 if record is None else P.as_int(record["version"], "actor version")
    request = serde.message_to_proto(message).SerializeToString()
    try:
        ok, body, version = ray.get(
            actor.handle.remote(
                request,
                context.run_id,
                context.node_id,
                dict(context.node_config),
                dict(context.run_config),
                expected,
            )
        )
    except ray.exceptions.RayError as err:
        raise PartyActorError(f"party actor {name} is gone ({err})") from err
    if not ok:
        raise PartyActorError(f"party actor {name}: {body.decode(errors='replace')}")
    context.state[STATE_KEY] = ConfigRecord({"version": version})
    proto = ProtoRecordDict()
    proto.ParseFromString(body)
    return serde.recorddict_from_proto(proto)
