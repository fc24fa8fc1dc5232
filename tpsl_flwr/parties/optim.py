"""Optimizer factories and the learning-rate schedule every party follows.

Each party builds its optimizer over its own model. The label party decides the
schedule (it counts the steps) and tells the nodes each step's learning-rate
scale with the gradients it applies to, so all models follow one schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from tpsl_flwr.errors import ConfigError

__all__ = [
    "OptimizerFactory",
    "adam",
    "base_rates",
    "lr_scale",
    "set_lr_scale",
]

OptimizerFactory = Callable[[Any], torch.optim.Optimizer]
SCHEDULES = ("constant", "cosine", "restarts")


def adam(lr: float, weight_decay: float = 0.0) -> OptimizerFactory:
    """An optimizer factory: Adam, or AdamW when ``weight_decay > 0``.

    AdamW's decay is decoupled from the gradient (Loshchilov and Hutter,
    "Decoupled Weight Decay Regularization", ICLR 2019): it shrinks the
    weights towards 0 by ``lr * weight_decay`` per step, whatever the noise in
    the gradient, which is what keeps a model trained on noisy labels from
    fitting them ever harder.
    """
    if not lr > 0:
        raise ConfigError(f"lr must be > 0, got {lr}")
    if not weight_decay >= 0:
        raise ConfigError(f"weight_decay must be >= 0, got {weight_decay}")
    if weight_decay == 0:
        return lambda params: _fused(torch.optim.Adam, params, lr=lr)
    return lambda params: _fused(
        torch.optim.AdamW, params, lr=lr, weight_decay=weight_decay
    )


def _fused(
    cls: Callable[..., torch.optim.Optimizer], params: Any, **kwargs: Any
) -> torch.optim.Optimizer:
    """``cls(params, fused=True, ...)``, or the per-tensor loop where fusing is refused.

    torch's fused Adam(W) updates every element in one kernel per parameter
    group: on a Criteo node's embedding tables (13 x 2**15 x 8 weights, dense
    updates) a step takes ~2.5 ms instead of ~9.6 ms on one CPU core
    (``bench/README.md``, "Fused Adam"). It computes the same update rule; the
    results differ from the per-tensor loop only in float rounding (~1e-9).
    torch refuses it for parameters it cannot fuse (e.g. on a device without a
    fused kernel); those keep the per-tensor loop.
    """
    params = list(params)
    try:
        return cls(params, fused=True, **kwargs)
    except (RuntimeError, ValueError):
        return cls(params, **kwargs)


def lr_scale(
    schedule: str, step: int, total_steps: int, *, cycle_steps: int = 0
) -> float:
    """The learning-rate multiplier of ``step`` (0-based) of ``total_steps``.

    ``constant``: 1. ``cosine``: ``(1 + cos(pi * step / total_steps)) / 2``,
    from 1 at the first step to almost 0 at the last (Loshchilov and Hutter,
    "SGDR", ICLR 2017, without restarts). ``restarts``: the same cosine over
    each cycle of ``cycle_steps`` steps, restarted at 1 after each (SGDR with
    a fixed period; the last cycle spans the steps left), so the model at the
    end of every cycle was trained to a rate near 0, as at the end of a
    ``cosine`` run of one cycle; ``cycle_steps = 0``: one cycle, the whole run.

    Examples
    --------
    >>> lr_scale("cosine", 0, 10), lr_scale("cosine", 5, 10)
    (1.0, 0.5)
    >>> lr_scale("constant", 9, 10)
    1.0
    >>> [round(lr_scale("restarts", s, 10, cycle_steps=4), 2) for s in range(10)]
    [1.0, 0.85, 0.5, 0.15, 1.0, 0.85, 0.5, 0.15, 1.0, 0.5]
    >>> lr_scale("restarts", 5, 10) == lr_scale("cosine", 5, 10)
    True
    """
    if schedule not in SCHEDULES:
        raise ConfigError(
            f"lr schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}"
        )
    if total_steps < 1 or not 0 <= step:
        raise ConfigError(
            f"step {step} of {total_steps} total steps is not a training step"
        )
    if cycle_steps < 0:
        raise ConfigError(f"cycle_steps must be >= 0, got {cycle_steps}")
    if schedule == "constant":
        return 1.0
    step = min(step, total_steps)
    if schedule == "restarts" and 0 < cycle_steps < total_steps:
        start = (min(step, total_steps - 1) // cycle_steps) * cycle_steps
        length = min(cycle_steps, total_steps - start)
        return 0.5 * (1.0 + math.cos(math.pi * (step - start) / length))
    return 0.5 * (1.0 + math.cos(math.pi * step / total_steps))


def set_lr_scale(optimizer: torch.optim.Optimizer, scale: float) -> None:
    """Set every parameter group's learning rate to its initial one times ``scale``.

    The initial rate is remembered in the group (``initial_lr``, as torch's
    schedulers do), so scales do not compound and survive ``state_dict``.
    """
    if not (0.0 <= scale <= 1.0 and math.isfinite(scale)):
        raise ConfigError(f"lr scale must be in [0, 1], got {scale!r}")
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
        group["lr"] = group["initial_lr"] * scale


def base_rates(param_groups: Iterable[Mapping[str, Any]]) -> tuple[float, ...]:
    """Each parameter group's rate before any schedule (``initial_lr``, else ``lr``).

    The rates a run was configured with, read the same way from a live
    optimizer's ``param_groups`` and from a checkpoint's
    (``state_dict()["param_groups"]``): :func:`set_lr_scale` keeps the
    configured rate as ``initial_lr`` and schedules ``lr``.

    Examples
    --------
    >>> w = torch.zeros(1, requires_grad=True)
    >>> opt = torch.optim.Adam([w], lr=0.01)
    >>> set_lr_scale(opt, 0.5)
    >>> base_rates(opt.param_groups), base_rates(opt.state_dict()["param_groups"])
    ((0.01,), (0.01,))
    """
    return tuple(float(g.get("initial_lr", g["lr"])) for g in param_groups)
