"""Checks of the training settings of a run config, and what ``auto`` means.

Helpers of :class:`~tpsl_flwr.experiments.config.ExperimentConfig`. The one
rule of defaults that scale with the data is :func:`resolve_training`:
``batch-size = 0`` and ``lr = 0`` (the defaults) are resolved from the number
of training rows and the epochs, public facts that the label party and every
node know alike (no label is read to choose them).
"""

from __future__ import annotations

import math
from typing import Protocol

from tpsl_flwr._util.checks import check_int
from tpsl_flwr.data.builtin import FILE_DATASETS
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.config_fields import (
    DENOISE_PRIORS,
    DENOISERS,
    LR_SCHEDULES,
    MODELS,
)
from tpsl_flwr.experiments.wide_settings import WideFields, resolve_wide
from tpsl_flwr.parties.training_rules import (
    NOISY_LABELS,
    TrainingSettings,
    heavy_label_noise,
    resolve_denoise,
    resolve_training,
)
from tpsl_flwr.validation.holdout import resolve_validation, validation_mode

__all__ = [
    "TrainingFields",
    "TrainingSettings",
    "check_training",
    "heavy_label_noise",
    "resolve_denoise",
    "resolve_training",
    "training_of",
    "validation_of",
]


class TrainingFields(WideFields, Protocol):
    """The run-config fields these checks read; an ``ExperimentConfig`` has them.

    A protocol rather than the config class itself: the config's module
    (:mod:`~tpsl_flwr.experiments.config`) imports this one to check its keys.
    """

    @property
    def mechanism(self) -> str:
        """``mechanism``."""

    @property
    def epochs(self) -> int:
        """``epochs``."""

    @property
    def batch_size(self) -> int:
        """``batch-size``."""

    @property
    def lr(self) -> float:
        """``lr``."""

    @property
    def lr_schedule(self) -> str:
        """``lr-schedule``."""

    @property
    def weight_decay(self) -> float:
        """``weight-decay``."""

    @property
    def model(self) -> str:
        """``model``."""

    @property
    def validation_fraction(self) -> float | str:
        """``validation-fraction``."""

    @property
    def denoise(self) -> str:
        """``denoise``."""

    @property
    def heavy_label_noise(self) -> bool:
        """Whether the mechanism's labels are noisy enough for the posterior."""

    @property
    def denoise_prior(self) -> str:
        """``denoise-prior``."""


def training_of(cfg: TrainingFields, train_rows: int) -> TrainingSettings:
    """:func:`resolve_training` of ``cfg``'s batch-size, lr, epochs and wide part.

    The one resolution the label party (``simulate``, ``flwr run``, sweeps)
    and every node (:mod:`~tpsl_flwr.experiments.node_party`) make alike; ``wide
    = "auto"`` is resolved from the same rows first
    (:func:`~tpsl_flwr.experiments.wide_settings.resolve_wide`).
    """
    cfg = resolve_wide(cfg, train_rows)
    held_out = validation_of(cfg, train_rows)
    return resolve_training(
        train_rows=train_rows,
        epochs=cfg.epochs,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        beside_ftrl=cfg.wide == "on" and cfg.wide_optimizer == "ftrl",
        heavy_noise=cfg.heavy_label_noise,
        lr_schedule=cfg.lr_schedule,
        held_out=held_out > 0,
    )


def validation_of(cfg: TrainingFields, train_rows: int) -> float:
    """``validation-fraction`` of ``cfg`` resolved for ``train_rows`` rows.

    The one resolution the label party (its hold-out and noise binding) and
    every node (the schedule, :func:`training_of`) make alike: the dataset
    says whether the data has hashed codes (the Criteo and Avazu files,
    :func:`~tpsl_flwr.validation.holdout.resolve_validation`).
    """
    return resolve_validation(
        cfg.validation_fraction,
        train_rows=train_rows,
        epochs=cfg.epochs,
        mechanism=cfg.mechanism,
        hashed_codes=cfg.dataset in FILE_DATASETS,
    )


def check_training(cfg: TrainingFields) -> None:
    """batch-size, lr, model, lr-schedule, weight-decay, validation and denoise."""
    check_int(cfg.batch_size, "batch-size", minimum=0)
    lr = cfg.lr
    if isinstance(lr, bool) or not isinstance(lr, int | float):
        raise ConfigError(f"lr must be a number, got {lr!r}")
    if not (lr >= 0 and math.isfinite(lr)):
        raise ConfigError(f"lr must be >= 0 (0: auto) and finite, got {lr}")
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
    wd = cfg.weight_decay
    number = isinstance(wd, int | float) and not isinstance(wd, bool)
    if not (number and 0 <= wd and math.isfinite(wd)):
        raise ConfigError(f"weight-decay must be in [0.0, inf), got {wd!r}")
    fraction = validation_mode(cfg.validation_fraction)
    if isinstance(fraction, float) and fraction > 0 and cfg.mechanism == "gaussian":
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
