"""The split model a run config names: each node's bottom model and the top model.

``model = "dlrm"``: each node sends one vector per field (each categorical
column's embedding, one MLP vector for its numeric columns) and the label party's
:class:`~tpsl_flwr.models.interaction.DotInteractionTop` takes their pairwise dot
products. ``model = "mlp"``: each node sends one MLP output and the top model is
an MLP (:class:`~tpsl_flwr.models.TopModel`). Both sides build from the public
schema alone: the label party counts each node's fields from the column
partition, never from the data. ``model = "auto"`` is resolved by
:attr:`~tpsl_flwr.experiments.config.ExperimentConfig.split_model`; ``wide =
"auto"`` by :func:`~tpsl_flwr.experiments.wide_settings.resolve_wide`, which
both sides apply to the run config before building (the label party to its
training-label count, each node to its own training rows: the same number).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from tpsl_flwr.experiments.wide_settings import has_wide
from tpsl_flwr.models import BottomModel, TopModel, field_count
from tpsl_flwr.models.interaction import DotInteractionTop

if TYPE_CHECKING:
    from tpsl_flwr.experiments.config import ExperimentConfig

__all__ = ["build_bottom", "build_top", "node_fields"]


def build_bottom(
    cfg: ExperimentConfig,
    num_numeric: int,
    cardinalities: Sequence[int],
    partition: int,
) -> BottomModel:
    """Partition ``partition``'s bottom model, seeded by ``seed`` and partition.

    Parameters
    ----------
    cfg : ExperimentConfig
        The run config (``model``, ``embedding-dim``, ``bottom-hidden``,
        ``wide``, ``seed``), ``wide`` resolved
        (:func:`~tpsl_flwr.experiments.wide_settings.resolve_wide`).
    num_numeric, cardinalities
        The node's numeric column count and its categorical cardinalities.
    partition : int
        The node's partition index.

    Returns
    -------
    BottomModel
        With ``fields=True`` for ``dlrm``.
    """
    generator = torch.Generator().manual_seed(cfg.seed * 1000 + partition + 1)
    fields = cfg.split_model == "dlrm"
    return BottomModel(
        num_numeric,
        cardinalities,
        # mlp: 4-wide embeddings per column before the MLP (the model's default)
        embedding_dim=cfg.embedding_dim if fields else 4,
        hidden=(cfg.bottom_hidden,),
        out_dim=cfg.embedding_dim,
        generator=generator,
        wide=has_wide(cfg),
        fields=fields,
    )


def node_fields(cfg: ExperimentConfig) -> tuple[int, ...]:
    """Fields each node sends under ``dlrm``, in partition order (public schema).

    :func:`~tpsl_flwr.models.field_count` of each node's columns, as its
    :attr:`BottomModel.num_fields`.
    """
    counts = []
    for partition in range(cfg.num_parties):
        columns = cfg.party_columns(partition)
        counts.append(field_count(len(columns.numeric), len(columns.categorical)))
    return tuple(counts)


def build_top(cfg: ExperimentConfig, num_outputs: int) -> nn.Module:
    """The label party's top model for ``cfg``, seeded by ``seed``.

    Parameters
    ----------
    cfg : ExperimentConfig
        The run config (``model``, ``embedding-dim``, ``top-hidden``,
        ``num-parties``, ``wide``, ``seed``), ``wide`` resolved as for
        :func:`build_bottom`.
    num_outputs : int
        Logits out.

    Returns
    -------
    torch.nn.Module
        :class:`DotInteractionTop` for ``dlrm``, :class:`TopModel` for ``mlp``.
    """
    generator = torch.Generator().manual_seed(cfg.seed)
    wide = has_wide(cfg)
    if cfg.split_model == "dlrm":
        return DotInteractionTop(
            node_fields(cfg),
            cfg.embedding_dim,
            hidden=(cfg.top_hidden,),
            num_outputs=num_outputs,
            generator=generator,
            wide=wide,
        )
    width = cfg.embedding_dim + wide
    return TopModel(
        cfg.num_parties * width,
        hidden=(cfg.top_hidden,),
        num_outputs=num_outputs,
        generator=generator,
        wide=wide,
        wide_columns=[(p + 1) * width - 1 for p in range(cfg.num_parties)]
        if wide
        else [],
    )
