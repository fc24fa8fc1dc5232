"""Virtual SuperNodes of the in-process grid: ids, contexts, one ClientApp call.

What a Flower SuperNode does around its ClientApp, for the nodes of
:class:`~tpsl_flwr.engines.inprocess.InProcessGrid` (read from Flower 1.42's
``server/superlink/fleet/vce/vce_api.py`` and
``supernode/runtime/run_clientapp.py``):

- node ids (and run and task ids) are random unsigned 64-bit integers, never
  ``0..N-1`` nor the SuperLink's id (:func:`draw_id`);
- each node has its own persistent :class:`flwr.app.Context`, with
  ``partition-id`` and ``num-partitions`` in its ``node_config``
  (:func:`make_nodes`);
- a ClientApp runs under Flower's process-wide ``TaskIdentity``
  (:func:`task_identity`), its reply is validated with Flower's own
  ``validate_message`` (:func:`check_reply`), and an exception in a handler
  becomes an error reply (``ErrorCode.CLIENT_APP_RAISED_EXCEPTION``) that
  leaves the node's context as it was (:meth:`VirtualNode.handle`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from logging import ERROR
from uuid import uuid4

from flwr.app import (
    ConfigRecord,
    Context,
    Error,
    Message,
    RecordDict,
    UserConfig,
    UserConfigValue,
)
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.logger import log
from flwr.server.utils.validator import validate_message
from flwr.supercore.task_identity import TaskIdentity

from tpsl_flwr.engines.message_copy import copy_context
from tpsl_flwr.wire import protocol as P

__all__ = [
    "ClientAppCallable",
    "VirtualNode",
    "check_reply",
    "draw_id",
    "instruction_problems",
    "make_nodes",
    "task_identity",
]

ClientAppCallable = Callable[[Message, Context], Message]
"""Anything called like a ClientApp: ``flwr.clientapp.ClientApp`` or a function."""

_ID_EXCLUDE = frozenset({0, SUPERLINK_NODE_ID})


@dataclass
class VirtualNode:
    """One virtual SuperNode of an :class:`~tpsl_flwr.engines.inprocess.InProcessGrid`.

    Parameters
    ----------
    node_id : int
        Random unsigned 64-bit node id, as Flower assigns it.
    partition_id : int
        The node's ``node_config["partition-id"]``.
    context : Context
        The node's persistent context; ``context.state`` carries over between
        the messages this node handles.
    """

    node_id: int
    partition_id: int
    context: Context

    def handle(
        self,
        client_app: ClientAppCallable,
        message: Message,
        *,
        run_id: int,
        task_id: int,
        copy_state: bool,
        set_identity: bool = True,
    ) -> Message:
        """Run ``client_app`` on ``message`` as a SuperNode would; return the reply.

        Parameters
        ----------
        client_app : ClientAppCallable
            The ClientApp.
        message : Message
            The instruction message addressed to this node.
        run_id : int
            The run's id (for the ``TaskIdentity``).
        task_id : int
            A fresh task id (for the ``TaskIdentity``).
        copy_state : bool
            Hand the ClientApp a copy of the context (a failed handler then
            leaves the node's state untouched) rather than the context itself.
        set_identity : bool
            Set Flower's process-wide ``TaskIdentity`` to this node while the
            ClientApp runs. ``False`` for nodes on threads of their own, where
            it would race with the other nodes and the server (a reply takes
            its ids from the message it answers, not from the identity).

        Returns
        -------
        Message
            The ClientApp's reply, or an error reply if it raised or returned
            something that is not a valid reply to ``message``. Only a
            successful call updates ``context.state``.
        """
        ctx = copy_context(self.context) if copy_state else self.context
        try:
            if set_identity:
                with task_identity(run_id, self.node_id, task_id):
                    reply = client_app(message, ctx)
            else:
                reply = client_app(message, ctx)
            check_reply(reply, message)
        except Exception as ex:  # reported as an error reply, as Flower does
            log(ERROR, "ClientApp raised an exception", exc_info=ex)
            reason = str(type(ex)) + ":<'" + str(ex) + "'>"
            err = Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason)
            reply = Message(err, reply_to=message)
            reply.metadata.__dict__["_message_id"] = uuid4().hex
        else:  # only a successful call updates the node's context
            self.context.state = ctx.state
        return reply


def draw_id(rng: random.Random, taken: set[int]) -> int:
    """Draw a random unsigned 64-bit id that is not reserved nor in ``taken``.

    Parameters
    ----------
    rng : random.Random
        The generator (seeded for reproducible ids).
    taken : set[int]
        Ids already in use.

    Returns
    -------
    int
        Neither 0 nor Flower's ``SUPERLINK_NODE_ID`` nor in ``taken``.

    Examples
    --------
    >>> 0 < draw_id(random.Random(0), set()) < 2**64
    True
    """
    while True:
        value = rng.getrandbits(64)
        if value not in _ID_EXCLUDE and value not in taken:
            return value


def make_nodes(
    rng: random.Random,
    *,
    run_id: int,
    num_nodes: int,
    run_config: UserConfig,
    node_configs: Sequence[Mapping[str, UserConfigValue]] | None = None,
    app_keeps_state: bool = False,
) -> dict[int, VirtualNode]:
    """Create ``num_nodes`` virtual nodes with random ids and fresh contexts.

    Parameters
    ----------
    rng : random.Random
        Draws the node ids.
    run_id : int
        The run's id, in every node's context.
    num_nodes : int
        Number of nodes; partition ids are ``0..num_nodes-1``.
    run_config : UserConfig
        Run config every node's context gets (a copy each).
    node_configs : Sequence[Mapping[str, UserConfigValue]] | None
        Extra per-node config, merged over ``partition-id``/``num-partitions``.
    app_keeps_state : bool
        Start every context's state with the ``protocol.APP_KEEPS_STATE``
        record (see :class:`~tpsl_flwr.engines.inprocess.InProcessGrid`).

    Returns
    -------
    dict[int, VirtualNode]
        The nodes by node id, in partition order.
    """
    nodes: dict[int, VirtualNode] = {}
    for partition_id in range(num_nodes):
        node_id = draw_id(rng, set(nodes))
        node_config: UserConfig = {
            P.PARTITION_ID: partition_id,
            P.NUM_PARTITIONS: num_nodes,
        }
        if node_configs is not None:
            node_config.update(node_configs[partition_id])
        state = RecordDict()
        if app_keeps_state:
            state[P.APP_KEEPS_STATE] = ConfigRecord({"same-object": True})
        context = Context(
            run_id=run_id,
            node_id=node_id,
            node_config=node_config,
            state=state,
            run_config=dict(run_config),
        )
        nodes[node_id] = VirtualNode(node_id, partition_id, context)
    return nodes


def check_reply(reply: object, msg: Message) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``reply`` validly answers ``msg``.

    Gives the reply its message id and applies Flower's reply validation.
    """
    if not isinstance(reply, Message):
        raise TypeError(f"ClientApp must return a Message, got {type(reply)}")
    if reply.metadata.reply_to_message_id != msg.metadata.message_id:
        raise ValueError(
            "ClientApp returned a message that is not a reply to the one it got; "
            "build it with Message(content, reply_to=message)"
        )
    reply.metadata.__dict__["_message_id"] = uuid4().hex
    problems = validate_message(reply, is_reply_message=True)
    if problems:
        raise ValueError(f"invalid reply: {problems}")


@contextmanager
def task_identity(run_id: int, node_id: int, task_id: int) -> Iterator[None]:
    """Set Flower's process-wide ``TaskIdentity`` and restore it afterwards."""
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = (
        run_id,
        node_id,
        task_id,
    )
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def instruction_problems(
    message: Message, run_id: int, node_ids: Collection[int]
) -> list[str]:
    """Why a grid must refuse ``message`` (Flower's own checks, then its ids)."""
    problems = list(validate_message(message, is_reply_message=False))
    if message.metadata.run_id != run_id:
        problems.append(f"run_id {message.metadata.run_id} is not this run's")
    if message.metadata.dst_node_id not in node_ids:
        problems.append(f"unknown dst_node_id {message.metadata.dst_node_id}")
    return problems
