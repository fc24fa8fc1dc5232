"""A non-label party: a ClientApp serving TPSL's node protocol over its own file.

The node reads ``party-<partition-id>.csv`` only: its feature columns and record
ids, never a label. The protocol handlers come from
:func:`tpsl_flwr.make_client_app`, which checks the node config
(``partition-id``, ``num-partitions`` against the run's ``num-parties``)
before :func:`node_party` runs.
"""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context

from three_party_categorical.task import AppConfig, make_party
from tpsl_flwr import NonLabelParty, make_client_app


def node_party(context: Context) -> NonLabelParty:
    """Build the node's party: partition from the node config, data from the run's."""
    cfg = AppConfig.from_run_config(context.run_config)
    return make_party(cfg, int(context.node_config["partition-id"]))


def node_checkpoint_dir(context: Context) -> Path:
    """Where the node saves its bottom model when the label party checkpoints."""
    return AppConfig.from_run_config(context.run_config).checkpoint_dir / "nodes"


app = make_client_app(node_party, checkpoint_dir=node_checkpoint_dir)
