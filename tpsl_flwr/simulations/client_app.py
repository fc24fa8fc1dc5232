"""The project's ClientApp (the FAB's ``clientapp``): light to import, no torch.

On Flower's deployment runtime every message runs in a fresh
``flwr-clientapp`` process that imports this module, so it imports only
Flower and this package's light modules. Each message then goes:

- to the node's **party worker** when the node config names its socket
  (``worker-socket``, e.g. ``flower-supernode --node-config "partition-id=0
  num-partitions=2 worker-socket='/run/tpsl/party-0.sock'"``): the worker
  (``tpsl-flwr party``, :mod:`tpsl_flwr.simulations.party_worker`) keeps
  torch, the data, the party and the node's state loaded and runs the same
  ClientApp (:data:`tpsl_flwr.simulations.node_app.app`); this process
  forwards the message and returns the worker's reply content
  (:func:`~tpsl_flwr.wire.worker_link.ask_worker`);
- on Flower's Ray simulation with the run config's ``party-actors = true``,
  to the node's party actor (:mod:`tpsl_flwr.simulations.party_actor`): the
  same handler in one Ray actor per node that keeps the node's state;
- otherwise to :data:`tpsl_flwr.simulations.node_app.app` in this process
  (imported on the first message), as before: the in-process engine, Ray and
  a deployment without workers behave exactly as they did.

A node's process parses only its own feature columns and ids, never a label;
the handlers and the protocol are :mod:`tpsl_flwr.wire.node_side`.
"""

from __future__ import annotations

import importlib
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from tpsl_flwr.simulations.party_actor import (
    PARTY_ACTORS,
    ask_party_actor,
    party_actors_on,
)
from tpsl_flwr.wire.worker_link import WORKER_SOCKET, ask_worker

__all__ = ["PARTY_ACTORS", "ForwardingClientApp", "app", "party_actors_on"]

_NODE_APP = "tpsl_flwr.simulations.node_app"


class ForwardingClientApp(ClientApp):
    """A ClientApp that hands each message to a party worker or to ``target``.

    Parameters
    ----------
    target
        ``"module:attribute"`` of the ClientApp that handles messages here
        when the node config names no ``worker-socket``; imported on first use.
    """

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target
        self._app: ClientApp | None = None

    def local_app(self) -> ClientApp:
        """The ClientApp that runs messages in this process (imported once)."""
        if self._app is None:
            module, _, attribute = self.target.partition(":")
            self._app = getattr(importlib.import_module(module), attribute)
        return self._app

    def __call__(self, message: Message, context: Context) -> Message:
        """Forward to the node's worker or party actor, else run locally."""
        path = context.node_config.get(WORKER_SOCKET)
        if path:
            content = ask_worker(str(path), message, context)
        elif party_actors_on(context.run_config):
            content = ask_party_actor(message, context)
        else:
            return self.local_app()(message, context)
        return Message(content, reply_to=message)


app = ForwardingClientApp(f"{_NODE_APP}:app")
"""The project's ClientApp; ``transcript-dir`` in the run config records it."""


def __getattr__(name: str) -> Any:
    """``builtin_party``/``builtin_checkpoint_dir`` from the torch module, lazily."""
    if name in ("builtin_party", "builtin_checkpoint_dir"):
        return getattr(importlib.import_module(_NODE_APP), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
