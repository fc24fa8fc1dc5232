"""Checks of the training settings of a run config, and what ``auto`` means.

Helpers of :class:`~tpsl_flwr.experiments.config.ExperimentConfig`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.config_fields import (
    DENOISE_PRIORS,
    DENOISERS,
    LR_SCHEDULES,
    MODELS,
)

if TYPE_CHECKING:
    from tpsl_flwr.experiments.config import ExperimentConfig

__all__ = ["check_training", "resolve_denoise"]

NOISY_LABELS = ("laplace", "discrete")
"""Mechanisms whose output is a noisy label (the posterior applies)."""


def resolve_denoise(denoise: str, mechanism: str) -> str:
    """``denoise`` with ``auto`` resolved: posterior for noisy labels, else none.

    Examples
    --------
    >>> resolve_denoise("auto", "laplace"), resolve_denoise("auto", "gaussian")
    ('posterior', 'none')
    """
    if denoise != "auto":
        return denoise
    return "posterior" if mechanism in NOISY_LABELS else "none"


def check_training(cfg: ExperimentConfig) -> None:
    """model, lr-schedule, weight-decay, validation-fraction and denoise."""
    for key, choices in (
        ("lr-schedule", LR_SCHEDULES),
        ("denoise", DENOISERS),
        ("denoise-prior", DENOISE_PRIORS),
        ("model", MODELS),
    ):
        value = getattr(cfg, key.replace("-", "_"))
        if value not in choices:
            raise ConfigError(
                f"{key} must be one of {', '.join(choices)}, got {value!r}"
            )
    for key, low, high in (
        ("weight-decay", 0.0, math.inf),
        ("validation-fraction", 0.0, 0.5),
    ):
        value = getattr(cfg, key.replace("-", "_"))
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not low <= value < high
        ):
            raise ConfigError(f"{key} must be in [{low}, {high}), got {value!r}")
    if cfg.validation_fraction and cfg.mechanism == "gaussian":
        raise ConfigError(
            "validation scores noisy labels, and mechanism 'gaussian' leaves "
            "the labels clean; use validation-fraction = 0 "
            "(--validation-fraction 0) with it"
        )
    if cfg.denoise == "posterior" and cfg.mechanism not in (
        *NOISY_LABELS,
        "none",
    ):
        raise ConfigError(
            "denoise = 'posterior' needs noisy labels (mechanism laplace or "
            f"discrete), got mechanism {cfg.mechanism!r}"
        )
