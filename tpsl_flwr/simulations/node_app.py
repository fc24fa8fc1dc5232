"""The node's ClientApp with torch: the wire's node handlers over the built-in data.

This is what runs a non-label node's messages: in the warm executor's one
process (:mod:`tpsl_flwr.engines.executor.warm`), in Flower's per-message
``flwr-clientapp`` process, or in a node's party actor on Ray
(:mod:`tpsl_flwr.simulations.party_actor`). Flower loads
:mod:`tpsl_flwr.simulations.client_app`, which imports no torch and hands each
message to this app or to the party actor.

A node's process parses only its own feature columns and ids
(:meth:`~tpsl_flwr.experiments.config.ExperimentConfig.load_party`), never a
label; the party is built by :mod:`~tpsl_flwr.experiments.node_party`, the
handlers and the protocol are :mod:`tpsl_flwr.wire.node_side`.
"""

from __future__ import annotations

from tpsl_flwr.experiments.node_party import (
    builtin_checkpoint_dir,
    builtin_party,
    make_node_app,
)

__all__ = ["app", "builtin_checkpoint_dir", "builtin_party", "make_node_app"]

app = make_node_app()
"""The node's torch ClientApp; ``transcript-dir`` in the run config records it."""
