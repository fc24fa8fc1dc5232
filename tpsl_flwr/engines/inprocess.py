"""In-process Flower engine: a ``Grid`` that calls the ClientApp directly.

:class:`InProcessGrid` implements :class:`flwr.serverapp.Grid` for N virtual
nodes living in the current process. Each node has its own persistent
:class:`flwr.app.Context` (``node_config`` with ``partition-id`` and
``num-partitions``, a ``state`` that survives across messages, the run config),
and every pushed message is delivered by calling the very same ``ClientApp``
object that Flower's Ray simulation and SuperNodes load: one ServerApp/ClientApp
pair runs unchanged on all three engines.

What it mirrors from Flower 1.42 (read from ``superlink/grid/inmemory_grid.py``,
``server/superlink/fleet/vce/vce_api.py`` and ``supernode/runtime/run_clientapp.py``;
the node side lives in :mod:`~tpsl_flwr.engines.virtual_nodes`):

- node ids are random unsigned 64-bit integers, never ``0..N-1``;
- instruction messages are validated with Flower's own ``validate_message``;
- an exception in a ClientApp handler becomes an error reply
  (``ErrorCode.CLIENT_APP_RAISED_EXCEPTION``, reason
  ``"<class 'RuntimeError'>:<'...'>"``) and the node's context is *not* updated;
- replies carry ``metadata.src_node_id`` and ``reply_to_message_id`` and come
  back in no particular order (shuffled by default);
- the ClientApp sees a copy of the message and of its context, as it would
  after (de)serialisation, so only ``context.state`` persists between messages.

No network, no TTL wait, no polling (``send_and_receive`` returns once every
node has answered). Nodes run one after another in push order, or, with
``concurrent_nodes=True``, each on a thread of its own as separate machines would
(:mod:`~tpsl_flwr.engines.node_threads`).
:func:`~tpsl_flwr.engines.inprocess_run.run_inprocess` runs a ServerApp and a
ClientApp on it in one call.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from logging import ERROR
from typing import Any
from uuid import uuid4

from flwr.app import Context, Message, RecordDict, UserConfig, UserConfigValue
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.run import Run

from tpsl_flwr.engines.message_copy import copy_message
from tpsl_flwr.engines.node_threads import Replies
from tpsl_flwr.engines.virtual_nodes import (
    ClientAppCallable,
    VirtualNode,
    draw_id,
    instruction_problems,
    make_nodes,
    task_identity,
)

__all__ = [
    "ClientAppCallable",
    "InProcessGrid",
    "MessageHook",
    "ServerMain",
    "VirtualNode",
]

ServerMain = Callable[[Grid, Context], Any]
"""A function decorated with ``@app.main()`` (``main(grid, context)``)."""

MessageHook = Callable[[Message], None]
"""Callback that observes a message (it must not modify it)."""

_SERVER_CONTEXT_NODE_ID = 0


class InProcessGrid(Grid):
    """A ``Grid`` whose N nodes run a ClientApp in this process.

    Parameters
    ----------
    client_app : ClientAppCallable
        The ``ClientApp`` (or any ``f(message, context) -> Message``).
    num_nodes : int
        Number of virtual nodes (non-label parties), at least 1.
    run_config : Mapping[str, UserConfigValue] | None
        Run config every node (and the server context) sees.
    node_configs : Sequence[Mapping[str, UserConfigValue]] | None
        Extra per-node config, one mapping per node, merged over the default
        ``{"partition-id": i, "num-partitions": num_nodes}``.
    seed : int | None
        Seed of the generator that draws node ids, the run id and the reply
        order. ``None`` draws fresh ones every time, as Flower does.
    shuffle_replies : bool
        Return replies in a random order (Flower guarantees no order).
    copy_messages : bool
        Hand the ClientApp a deep copy of each message and of its context, and
        the server a deep copy of each reply, so that no object is shared
        between the parties (Flower serialises them) and a failed handler
        leaves the node's state untouched. Array payloads are immutable bytes
        and are not duplicated, so this is cheap. With ``False`` the handler
        works on the node's context itself (faster; a failure may leave a
        half-updated state).
    strict : bool
        Raise ``ValueError`` on a message Flower would reject. With ``False``
        the message is logged and dropped, as Flower's grids do.
    record_messages : bool
        Keep every delivered message in :attr:`sent_messages` and every reply
        in :attr:`received_replies` (for transcript tests; memory grows).
    on_message : MessageHook | None
        Called with every message as it is delivered to a node.
    on_reply : MessageHook | None
        Called with every reply as the node produces it.
    app_keeps_state : bool
        Tell the ClientApp, by a ``protocol.APP_KEEPS_STATE`` record in each
        node's ``context.state``, that this grid calls the same object for
        every message of a node: TPSL's ClientApp then keeps its party in
        memory instead of encoding it into ``context.state`` after every step
        (``tpsl-flwr simulate``'s local engine; a copy of tens of MB a step on
        Criteo). Off by default: the state then round-trips through
        ``context.state`` as on every Flower runtime.
    concurrent_nodes : bool
        Run each node on a thread of its own: a node handles its messages in
        push order, different nodes at the same time (:mod:`.node_threads`;
        :meth:`pull_messages` returns the replies ready). Flower's
        ``TaskIdentity`` stays the server's, and the recorded messages are in
        the order the nodes got to them.

    Raises
    ------
    ValueError
        If ``num_nodes < 1`` or ``node_configs`` has the wrong length.

    Examples
    --------
    >>> from flwr.app import ConfigRecord, Message, RecordDict
    >>> def echo(msg, context):
    ...     pid = context.node_config["partition-id"]
    ...     return Message(RecordDict({"r": ConfigRecord({"p": pid})}), reply_to=msg)
    >>> def main(grid, context):
    ...     msgs = [
    ...         Message(RecordDict(), dst_node_id=n, message_type="query")
    ...         for n in grid.get_node_ids()
    ...     ]
    ...     return sorted(r.content["r"]["p"] for r in grid.send_and_receive(msgs))
    >>> InProcessGrid(echo, num_nodes=3).run_server(main)
    [0, 1, 2]
    """

    def __init__(
        self,
        client_app: ClientAppCallable,
        num_nodes: int,
        *,
        run_config: Mapping[str, UserConfigValue] | None = None,
        node_configs: Sequence[Mapping[str, UserConfigValue]] | None = None,
        seed: int | None = None,
        shuffle_replies: bool = True,
        copy_messages: bool = True,
        strict: bool = True,
        record_messages: bool = False,
        on_message: MessageHook | None = None,
        on_reply: MessageHook | None = None,
        app_keeps_state: bool = False,
        concurrent_nodes: bool = False,
    ) -> None:
        if num_nodes < 1:
            raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
        if node_configs is not None and len(node_configs) != num_nodes:
            raise ValueError(
                f"node_configs must have one entry per node ({num_nodes}), "
                f"got {len(node_configs)}"
            )
        self._client_app = client_app
        self._rng = random.Random(seed)
        self._shuffle = shuffle_replies
        self._copy = copy_messages
        self._strict = strict
        self._record = record_messages
        self._on_message = on_message
        self._on_reply = on_reply
        self.run_config: UserConfig = dict(run_config or {})
        self.sent_messages: list[Message] = []
        self.received_replies: list[Message] = []
        self._replies = Replies(concurrent=concurrent_nodes)
        self._concurrent = concurrent_nodes

        run_id = draw_id(self._rng, set())
        self._run = Run.create_empty(run_id=run_id)
        self._run.fab_id = "tpsl-flwr/inprocess"
        self._run.override_config = dict(self.run_config)
        self._task_id = draw_id(self._rng, set())
        self._nodes = make_nodes(
            self._rng,
            run_id=run_id,
            num_nodes=num_nodes,
            run_config=self.run_config,
            node_configs=node_configs,
            app_keeps_state=app_keeps_state,
        )

        # With concurrent nodes, which replies a pull finds ready depends on
        # timing: their shuffle draws from a generator of its own, so the task
        # ids drawn from _rng stay the same in every run of a seed.
        self._shuffle_rng = (
            random.Random(self._rng.random()) if concurrent_nodes else self._rng
        )

    # ------------------------------------------------------------------ Grid API
    def set_run(self, run: Run) -> None:
        """Replace the run information (its ``run_id`` must not change)."""
        if not isinstance(run, Run):
            raise TypeError(f"`run` must be an instance of Run, got {type(run)}")
        if run.run_id != self._run.run_id:
            raise ValueError(f"run_id must stay {self._run.run_id}, got {run.run_id}")
        self._run = run

    @property
    def run(self) -> Run:
        """Run information (a copy)."""
        return Run(**vars(self._run))

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """Create an instruction message (deprecated in Flower; kept for parity).

        The arguments are ``Message``'s; ``ttl=None`` is Flower's default.
        """
        with self.server_identity():
            return Message(
                content, dst_node_id, message_type, ttl=ttl, group_id=group_id
            )

    def get_node_ids(self) -> Iterable[int]:
        """Return the ids of all virtual nodes."""
        return list(self._nodes)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Deliver each message to its node (now, or on its thread) for its reply.

        Parameters
        ----------
        messages : Iterable[Message]
            Instruction messages, each with a ``dst_node_id`` of this grid.

        Returns
        -------
        Iterable[str]
            Ids of the accepted messages, to pass to :meth:`pull_messages`.

        Raises
        ------
        ValueError
            If a message is invalid and ``strict`` is set.
        """
        message_ids: list[str] = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid4().hex
            problems = instruction_problems(msg, self._run.run_id, self._nodes)
            if problems:
                if self._strict:
                    raise ValueError(f"Invalid message {msg.metadata}: {problems}")
                log(ERROR, "Dropping invalid message: %s", problems)
                continue
            task = functools.partial(self._deliver, msg, draw_id(self._rng, set()))
            self._replies.start(msg.metadata.message_id, msg.metadata.dst_node_id, task)
            message_ids.append(msg.metadata.message_id)
        return message_ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Return (and forget) the replies to the given message ids.

        Parameters
        ----------
        message_ids : Iterable[str]
            Ids returned by :meth:`push_messages`; unknown ids are ignored.

        Returns
        -------
        Iterable[Message]
            The replies made (concurrent nodes: waiting up to 0.1 s for one),
            in no particular order.

        Raises
        ------
        Exception
            What a hook (``on_message``, ``on_reply``) raised on a node's
            thread; a ClientApp's own exception is an error reply instead.
        """
        replies = [self._replies.take(mid) for mid in self._replies.ready(message_ids)]
        if self._shuffle:
            self._shuffle_rng.shuffle(replies)
        return replies

    def send_and_receive(
        self,
        messages: Iterable[Message],
        *,
        timeout: float | None = None,
    ) -> Iterable[Message]:
        """Push messages and return all their replies (``timeout`` is unused).

        Parameters
        ----------
        messages : Iterable[Message]
            Instruction messages.
        timeout : float | None
            Accepted for API parity; every reply is ready when this returns.

        Returns
        -------
        Iterable[Message]
            One reply (content or error) per accepted message, in no order.
        """
        del timeout
        message_ids = list(self.push_messages(messages))
        self._replies.wait_all(message_ids)
        return self.pull_messages(message_ids)

    # ------------------------------------------------------------ conveniences
    @property
    def nodes(self) -> tuple[VirtualNode, ...]:
        """The virtual nodes, ordered by partition id."""
        return tuple(self._nodes.values())

    def partition_of(self, node_id: int) -> int:
        """Return the partition id of ``node_id``."""
        return self._nodes[node_id].partition_id

    def node_context(self, node_id: int) -> Context:
        """Return the persistent context of ``node_id`` (for inspection)."""
        return self._nodes[node_id].context

    def server_context(self) -> Context:
        """Return a fresh server-side context carrying the run config."""
        return Context(
            run_id=self._run.run_id,
            node_id=_SERVER_CONTEXT_NODE_ID,
            node_config={},
            state=RecordDict(),
            run_config=dict(self.run_config),
        )

    def run_server(self, server_main: ServerApp | ServerMain) -> Any:
        """Run a ServerApp main function against this grid.

        Parameters
        ----------
        server_main : ServerApp | ServerMain
            A ``ServerApp`` whose ``@app.main()`` is registered, or the plain
            ``main(grid, context)`` function.

        Returns
        -------
        Any
            What the main function returns (``None`` for a legacy ServerApp).
            Concurrent nodes' threads are ended when it returns or raises.
        """
        context = self.server_context()
        try:
            with self.server_identity():
                if not isinstance(server_main, ServerApp):
                    return server_main(self, context)
                main_fn: ServerMain | None = getattr(server_main, "_main", None)
                if main_fn is None:  # legacy server_fn ServerApp: returns nothing
                    server_main(self, context)
                    return None
                with server_main._lifespan(context):
                    return main_fn(self, context)
        finally:
            self.close()  # concurrent nodes: their threads end with the run

    # ----------------------------------------------------------------- helpers
    def close(self) -> None:
        """End the nodes' threads once they finish their messages (if any)."""
        self._replies.close()

    def _deliver(self, msg: Message, task_id: int) -> Message:
        node = self._nodes[msg.metadata.dst_node_id]
        incoming = copy_message(msg) if self._copy else msg
        if self._record:
            self.sent_messages.append(incoming)
        if self._on_message is not None:
            self._on_message(incoming)
        reply = node.handle(
            self._client_app,
            incoming,
            run_id=self._run.run_id,
            task_id=task_id,
            copy_state=self._copy,
            set_identity=not self._concurrent,
        )
        if self._copy:
            reply = copy_message(reply)
        if self._record:
            self.received_replies.append(reply)
        if self._on_reply is not None:
            self._on_reply(reply)
        return reply

    def server_identity(self) -> AbstractContextManager[None]:
        """Return a context manager that lets this code build server messages.

        ``Message(content, dst_node_id, message_type)`` reads Flower's
        process-wide ``TaskIdentity``; :meth:`run_server` sets it for the main
        function, and tests that drive the grid by hand wrap their code in
        ``with grid.server_identity():``.

        Returns
        -------
        AbstractContextManager[None]
            Sets the identity on entry and restores the previous one on exit.
        """
        return task_identity(self._run.run_id, SUPERLINK_NODE_ID, self._task_id)
