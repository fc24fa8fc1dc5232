"""Optimizer factories: each party builds its optimizer over its own model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tpsl_flwr.errors import ConfigError

__all__ = ["OptimizerFactory", "adam"]

OptimizerFactory = Callable[[Any], torch.optim.Optimizer]


def adam(lr: float) -> OptimizerFactory:
    """An optimizer factory: Adam with learning rate ``lr``."""
    if not lr > 0:
        raise ConfigError(f"lr must be > 0, got {lr}")
    return lambda params: torch.optim.Adam(params, lr=lr)
