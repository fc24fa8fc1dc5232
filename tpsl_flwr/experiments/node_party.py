"""A node's side of an experiment: its party from the run config, and its ClientApp.

The mirror of :mod:`~tpsl_flwr.experiments.experiment` (the label party's side):
:func:`builtin_party` builds a non-label party over its own columns of the run
config's dataset, and :func:`make_node_app` the ClientApp that runs a node's
messages over it (the wire's node handlers, :mod:`~tpsl_flwr.wire.node_side`).
The project's ClientApp (:mod:`tpsl_flwr.simulations.node_app`, reached through
:mod:`tpsl_flwr.simulations.client_app`, which imports no torch) is one such app;
the in-process engine of :func:`~tpsl_flwr.experiments.run.run_experiment`
builds its own.

A node's process parses only its own feature columns and ids
(:meth:`~tpsl_flwr.experiments.config.ExperimentConfig.load_party`), never a
label; the handlers and the protocol are :mod:`tpsl_flwr.wire.node_side`.
"""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context
from flwr.clientapp import ClientApp

from tpsl_flwr.errors import ProtocolError
from tpsl_flwr.experiments.architecture import build_bottom
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.training_settings import training_of
from tpsl_flwr.experiments.wide_settings import resolve_wide, wide_optimizer
from tpsl_flwr.parties import NonLabelParty, adam
from tpsl_flwr.wire.node_side import PartyFactory, make_client_app, partition_of
from tpsl_flwr.wire.recorder import record_if_configured

__all__ = ["builtin_checkpoint_dir", "builtin_party", "make_node_app"]


def builtin_party(context: Context) -> NonLabelParty:
    """A non-label party over its own columns of a built-in dataset.

    The node's process parses only its own feature columns (and ids): no label
    column is read, for any dataset (:func:`~tpsl_flwr.data.load_party_view`).
    """
    cfg = ExperimentConfig.from_run_config(context.run_config)
    partition, parties = partition_of(context)
    if parties != cfg.num_parties:
        raise ProtocolError(
            f"this node is partition {partition} of {parties}, but the run config "
            f"has num-parties = {cfg.num_parties}"
        )
    view = cfg.load_party(partition)
    train, test = view.train, view.test
    # wide = auto resolved from the training rows: a public count, the label
    # party's too, so both build the same split model.
    cfg = resolve_wide(cfg, len(train))
    bottom = build_bottom(cfg, train.numeric.shape[1], train.cardinalities, partition)
    # lr = 0 resolved from the training rows: a public count, the label party's too.
    training = training_of(cfg, len(train))
    return NonLabelParty(
        {
            "train": (train.numeric, train.categorical),
            "test": (test.numeric, test.categorical),
        },
        bottom,
        adam(training.lr, cfg.weight_decay),
        wide_optimizer=wide_optimizer(
            cfg, len(train), heavy_noise=cfg.heavy_label_noise
        ),
    )


def builtin_checkpoint_dir(context: Context) -> Path | None:
    """``out-dir/checkpoints`` when the run config has ``checkpoint = true``.

    ``out-dir`` is taken as the run config states it (a relative one is
    relative to the node process's working directory, as for the label party).
    """
    cfg = ExperimentConfig.from_run_config(context.run_config)
    return Path(cfg.out_dir) / "checkpoints" if cfg.checkpoint else None


def make_node_app(factory: PartyFactory = builtin_party) -> ClientApp:
    """The node's ClientApp over ``factory``: the one assembly of handlers and mods.

    A party actor builds its app here too
    (:class:`~tpsl_flwr.simulations.party_actor.ActorNode`), so every engine
    runs the same code.
    """
    return make_client_app(
        factory,
        mods=[record_if_configured],
        checkpoint_dir=builtin_checkpoint_dir,
    )
