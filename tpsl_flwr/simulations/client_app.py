"""The project's ClientApp (the FAB's ``clientapp``): light to import, no torch.

On Flower's deployment runtime without the warm executor, every message runs
in a fresh ``flwr-clientapp`` process that imports this module, so it imports
only Flower and this package's light modules. Each message then goes:

- on Flower's Ray simulation with the run config's ``party-actors = true``,
  to the node's party actor (:mod:`tpsl_flwr.simulations.party_actor`): the
  same ClientApp in one Ray actor per node that keeps the node's state;
- otherwise to :data:`tpsl_flwr.simulations.node_app.app` in this process
  (imported on the first message): the in-process engine, Ray, the warm
  executor (which keeps this object, and with it the party, across messages)
  and Flower's process per message (the node's state then travels in
  ``context.state``, :mod:`tpsl_flwr.wire.state_codec`).

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

__all__ = ["PARTY_ACTORS", "ForwardingClientApp", "app", "party_actors_on"]

_NODE_APP = "tpsl_flwr.simulations.node_app"


class ForwardingClientApp(ClientApp):
    """A ClientApp that hands each message to a party actor or to ``target``.

    Parameters
    ----------
    target
        ``"module:attribute"`` of the ClientApp that handles messages here
        when the run config has no ``party-actors = true``; imported on first
        use.
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
        """Forward to the node's party actor, else run locally."""
        if party_actors_on(context.run_config):
            return Message(ask_party_actor(message, context), reply_to=message)
        return self.local_app()(message, context)


app = ForwardingClientApp(f"{_NODE_APP}:app")
"""The project's ClientApp; ``transcript-dir`` in the run config records it."""


def __getattr__(name: str) -> Any:
    """``builtin_party``/``builtin_checkpoint_dir`` from the torch module, lazily."""
    if name in ("builtin_party", "builtin_checkpoint_dir"):
        return getattr(importlib.import_module(_NODE_APP), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
