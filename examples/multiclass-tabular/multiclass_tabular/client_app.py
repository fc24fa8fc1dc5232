"""A non-label party: a ClientApp serving TPSL's node protocol over its own file.

The node reads ``party-<partition-id>.csv`` only: its feature columns and record
ids, never a label. The protocol handlers come from
:func:`tpsl_flwr.make_client_app`.
"""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context

from multiclass_tabular.task import AppConfig, make_party
from tpsl_flwr import NonLabelParty, make_client_app


def node_party(context: Context) -> NonLabelParty:
    """Build the node's party: partition from the node config, data from the run's.

    Raises
    ------
    ValueError
        If the node's ``num-partitions`` is not the run's ``num-parties``.
    """
    cfg = AppConfig.from_run_config(context.run_config)
    partition = int(context.node_config["partition-id"])
    partitions = int(context.node_config["num-partitions"])
    if partitions != cfg.num_parties:
        raise ValueError(
            f"this node is partition {partition} of {partitions}, but the run "
            f"config has num-parties = {cfg.num_parties}"
        )
    return make_party(cfg, partition)


def node_checkpoint_dir(context: Context) -> Path:
    """Where the node saves its bottom model when the label party checkpoints."""
    return AppConfig.from_run_config(context.run_config).checkpoint_dir / "nodes"


app = make_client_app(node_party, checkpoint_dir=node_checkpoint_dir)
