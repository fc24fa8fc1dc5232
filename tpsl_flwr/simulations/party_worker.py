"""The party worker: one long-lived process per node that runs its messages.

``tpsl-flwr party --partition-id I --num-partitions N --socket-dir DIR
[--app-dir APP] [--run-config FILE|"k=v ..."]`` starts it on the node's
machine, next to ``flower-supernode --node-config "partition-id=I
num-partitions=N worker-socket='DIR/party-I.sock'"``. It imports torch once,
builds the party of the run config it was given (its features, bottom model
and optimizer; torch's optimizer code warmed on a throwaway model), then
serves the node's messages over a Unix socket (``DIR/party-I.sock``, 0600, in
``DIR``, which must be 0700; peers of another uid are refused:
:mod:`tpsl_flwr.wire.worker_link`). A refused peer or a malformed request (bad
header, truncated, above ``MAX_FRAME_BYTES``, undecodable) is logged in one
line and the worker serves the next connection.

Each message runs through the same ClientApp a node runs without a worker
(:func:`tpsl_flwr.experiments.node_party.make_node_app`: the wire's
``NonLabelHandlers``, the recorder mod, ``checkpoint_dir``), under a
``flwr.app.Context`` the worker keeps per run: the node's state lives here,
not in the SuperNode. The worker calls one ClientApp object for every message,
so that context says so (``protocol.APP_KEEPS_STATE``, as the in-process
engine's): the party stays in the app object and the context records only its
version, instead of an encoded copy of the whole state after every message
(~41 MB for a Criteo node). A run's first message at a worker must be its
hello: a worker restarted in the middle of a run refuses the run's next
message (the run stops, to be resumed from its checkpoints) rather than
continue from a freshly built party. A failed message leaves the context as
it was and drops the app object's party, so the run's next message fails too,
never meeting a half-updated party. A run whose run config differs from the
one given at start gets a freshly built party, as a ClientApp process would.
Every message is logged with the times
it was received and answered (``worker <partition> <type> recv <t> sent <t>``,
``time.time()`` seconds).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict

from tpsl_flwr.errors import ProtocolError
from tpsl_flwr.wire import protocol as P

__all__ = ["PartyWorker", "worker_run_config"]

_LOG = logging.getLogger("tpsl_flwr.party_worker")
_KEEP_RUNS = 4


def worker_run_config(
    app_dir: Path | None, overrides: list[str] | None
) -> dict[str, Any]:
    """The run config a node will see: the app's defaults plus ``overrides``.

    ``overrides`` as ``flwr run --run-config`` takes them (one TOML file, or
    ``key=value`` strings).
    """
    from flwr.common.config import flatten_dict, parse_config_args

    from tpsl_flwr.engines.flower_env import app_config

    config: dict[str, Any] = {}
    if app_dir is not None:
        config.update(flatten_dict(app_config(app_dir)))
    config.update(parse_config_args(overrides or None))
    return config


class PartyWorker:
    """Runs a node's messages through the node's ClientApp, keeping its contexts.

    Parameters
    ----------
    partition_id, num_partitions
        The node this worker serves; a message from a node with another
        ``partition-id``/``num-partitions`` is refused.
    run_config
        Run config to build the party for now (``None``: build on the first
        message). The first run whose config equals it (as parsed by
        ``ExperimentConfig``) gets that party.
    """

    def __init__(
        self,
        partition_id: int,
        num_partitions: int,
        run_config: dict[str, Any] | None = None,
    ) -> None:
        from tpsl_flwr.experiments.config import ExperimentConfig
        from tpsl_flwr.simulations import node_app

        self.partition_id = partition_id
        self.num_partitions = num_partitions
        self._node_app = node_app
        self._config_of = ExperimentConfig.from_run_config
        self._ready: tuple[Any, Any] | None = None
        self.contexts: OrderedDict[int, Context] = OrderedDict()
        self.app = node_app.make_node_app(self._factory)
        if run_config is not None:
            context = Context(0, 0, self._node_config(), RecordDict(), run_config)
            self._ready = (
                self._config_of(run_config),
                node_app.builtin_party(context),
            )
        _warm_torch()

    def _node_config(self) -> dict[str, bool | float | int | str]:
        return {
            P.PARTITION_ID: self.partition_id,
            P.NUM_PARTITIONS: self.num_partitions,
        }

    def _factory(self, context: Context) -> Any:
        ready, self._ready = self._ready, None
        if ready is not None and ready[0] == self._config_of(context.run_config):
            return ready[1]
        return self._node_app.builtin_party(context)

    def _context(self, context: Context, hello: bool) -> Context:
        node = context.node_config
        got = (
            P.as_int(node.get(P.PARTITION_ID, -1), "partition-id"),
            P.as_int(node.get(P.NUM_PARTITIONS, -1), "num-partitions"),
        )
        if got != (self.partition_id, self.num_partitions):
            raise ProtocolError(
                f"this worker serves partition {self.partition_id} of "
                f"{self.num_partitions}; the SuperNode's node config says "
                f"partition {got[0]} of {got[1]}"
            )
        kept = self.contexts.get(context.run_id)
        if kept is None and not hello:
            raise ProtocolError(
                f"this worker holds no state of run {context.run_id}: it did not "
                "answer the run's hello (it was restarted since, or another worker "
                "did); resume the run (resume = true), whose hello loads the last "
                "checkpoint"
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
            self.app = self._node_app.make_node_app(self._factory)
            raise
        kept.state = trial.state  # only a successful message updates the state
        _LOG.info(
            "worker %d %s recv %.4f sent %.4f",
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
