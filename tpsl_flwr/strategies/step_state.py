"""Where the label party is in the current epoch: batches, ids in flight, gradients.

One :class:`StepState` per epoch, owned by the strategy's
:class:`~tpsl_flwr.strategies.epoch_loop.EpochLoop` and handed explicitly to
the pipeline (:mod:`~tpsl_flwr.strategies.pipeline`) and the evaluation query
(:mod:`~tpsl_flwr.strategies.evaluation_query`). Everything in it is
label-independent (sample ids, their order) or already perturbed (the pending
gradients).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from tpsl_flwr.wire import protocol as P

__all__ = ["StepState", "scale_setting"]


@dataclass
class StepState:
    """Where the strategy is in the current epoch (label-independent ids only).

    ``total_steps`` is the label party's optimizer steps of the whole run that
    the learning-rate schedule spans (set when the epoch begins).
    """

    epoch: int = 0
    batches: list[np.ndarray] = field(default_factory=list)
    cursor: int = 0
    in_flight: list[np.ndarray] = field(default_factory=list)
    pending: list[tuple[np.ndarray, torch.Tensor]] = field(default_factory=list)
    samples: int = 0
    scale: float = 1.0
    total_steps: int = 0


def scale_setting(state: StepState, lr_schedule: str) -> dict[str, str]:
    """The ``lr-scale`` of the pending gradients (nothing for a constant lr).

    Train messages and the evaluation query's first message carry it.
    """
    if lr_schedule == "constant" or not state.pending:
        return {}
    return {P.LR_SCALE: repr(state.scale)}
