"""The wide part: when a run has one, its optimizer, and checks of its keys.

The one rule of when a run has a wide part is :func:`resolve_wide`. ``wide =
"auto"`` (the default) builds an FTRL-trained wide part on the Criteo and
Avazu files when the training split has at most :data:`WIDE_AUTO_MAX_ROWS`
rows, and none otherwise (``synthetic-ctr``, the bundled tables, large files);
``"on"``/``"off"`` (or ``true``/``false``) decide it outright. The training row
count is a public fact the label party and every node derive alike from the
run config, so both build the same split model without any label read.

``wide-optimizer = "ftrl"`` trains each node's wide part with FTRL-proximal and
its own L1/L2 (:class:`~tpsl_flwr.parties.ftrl.FtrlProximal`; McMahan et al.,
KDD 2013), as Wide & Deep trains its wide part; the deep part keeps the run's
Adam(W). ``"adam"``: one optimizer for the whole bottom model. ``"auto"`` (the
default): ``ftrl`` where ``wide = "auto"`` turned the wide part on, ``adam``
with an explicit ``wide = "on"`` (as before). ``lr`` then sets the deep and top
parts' rate apart from the wide part's ``wide-lr``; ``lr = 0`` (auto) resolves
to 1e-3 beside FTRL
(:func:`~tpsl_flwr.parties.training_rules.resolve_training`). Helpers of
:class:`~tpsl_flwr.experiments.config.ExperimentConfig`.

``wide-l2`` (default 2) is in the units of the summed batch-mean gradients
FTRL accumulates: a code seen ``m`` times in ``E`` epochs of batch ``B`` gets
``w ~ -E m r / (B (1/eta + l2))`` for a mean residual ``r``, about logistic
regression with an L2 penalty of ``B (1/eta + l2) / E`` per sample-loss sum
(``1/eta = 1/wide-lr`` at the start).

The measurements behind these defaults are in ``docs/benchmarks.md``
("wide = auto").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Protocol, TypeVar

from tpsl_flwr.data import FILE_DATASETS
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.config_fields import WIDE_MODES, WIDE_OPTIMIZERS
from tpsl_flwr.parties.ftrl import ftrl
from tpsl_flwr.parties.optim import OptimizerFactory
from tpsl_flwr.parties.training_rules import BUDGET_EPOCHS, wide_budget

__all__ = [
    "WIDE_AUTO_MAX_ROWS",
    "WIDE_BETA",
    "WIDE_MODES",
    "WIDE_OPTIMIZERS",
    "WideFields",
    "check_wide",
    "has_wide",
    "resolve_wide",
    "wide_ftrl_settings",
    "wide_mode",
    "wide_optimizer",
]

WIDE_AUTO_MAX_ROWS = 200_000
"""``wide = "auto"``: the most training rows of a Criteo/Avazu file that get
the FTRL wide part: where it was measured to win (``docs/benchmarks.md``,
"wide = auto"). Without it the deep part alone memorizes the hashed codes in
its second epoch at every size measured, 4,000 to 200,000 training rows, and a
2-epoch run (no hold-out) returns that epoch: 100,000-row Criteo files, seed 0,
unprotected 0.748 against 0.802 with it, Laplace eps 1 0.624 against 0.770.
Larger files were not measured and keep the deep part alone.
"""
WIDE_BETA = 1.0
"""FTRL's ``beta`` (McMahan et al.'s default 1): the per-coordinate rate starts
at ``wide-lr / beta`` and falls as ``wide-lr / (beta + sqrt(sum g^2))``."""


class WideFields(Protocol):
    """The run-config fields the wide part reads; an ``ExperimentConfig`` has them.

    A protocol rather than the config class itself: the config's module
    (:mod:`~tpsl_flwr.experiments.config`) imports this one to check its keys.
    """

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def dataset(self) -> str:
        """``dataset``."""

    @property
    def wide(self) -> str | bool:
        """``wide``."""

    @property
    def wide_optimizer(self) -> str:
        """``wide-optimizer``."""

    @property
    def wide_lr(self) -> float:
        """``wide-lr``."""

    @property
    def wide_l1(self) -> float:
        """``wide-l1``."""

    @property
    def wide_l2(self) -> float:
        """``wide-l2``."""


C = TypeVar("C", bound=WideFields)

_SPELLINGS = {"auto": "auto", "on": "on", "off": "off", "true": "on", "false": "off"}


def wide_mode(value: Any) -> str:
    """``value`` of ``wide`` as one of :data:`WIDE_MODES`.

    Raises
    ------
    ConfigError
        Naming ``value`` if it is none of auto, on, off, true, false.

    Examples
    --------
    >>> wide_mode(True), wide_mode(False), wide_mode("auto"), wide_mode("TRUE")
    ('on', 'off', 'auto', 'on')
    """
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str) and value.lower() in _SPELLINGS:
        return _SPELLINGS[value.lower()]
    raise ConfigError(
        f"wide must be one of auto, on, off (or true, false), got {value!r}"
    )


def resolve_wide(cfg: C, train_rows: int | None) -> C:
    """``cfg`` with ``wide`` as ``on``/``off`` and ``wide-optimizer`` as adam/ftrl.

    The one rule, applied alike by the label party (to its label count) and by
    every node (to its own row count of the same training split): ``wide =
    "auto"`` is ``on`` for ``criteo``/``avazu`` with ``train_rows <=``
    :data:`WIDE_AUTO_MAX_ROWS`, and wherever ``wide-optimizer = "ftrl"`` was
    set (an FTRL optimizer asks for a wide part); ``off`` otherwise.
    ``wide-optimizer = "auto"`` is ``ftrl`` where ``auto`` turned the wide part
    on, else ``adam``. Explicit values are kept.

    Parameters
    ----------
    cfg : ExperimentConfig
        The run config (any :class:`WideFields`).
    train_rows : int or None
        Rows of the training split (public: derived from the run config, not
        from labels); ``None`` where they are not known, which only
        ``criteo``/``avazu`` under ``auto`` need.

    Raises
    ------
    ConfigError
        If ``auto`` needs ``train_rows`` and they are not given.

    Examples
    --------
    >>> from tpsl_flwr.experiments.config import ExperimentConfig
    >>> cfg = resolve_wide(ExperimentConfig(dataset="digits"), None)
    >>> cfg.wide, cfg.wide_optimizer
    ('off', 'adam')
    """
    wide, optimizer = _resolved(cfg, train_rows)
    if (wide, optimizer) == (cfg.wide, cfg.wide_optimizer):
        return cfg
    return dataclasses.replace(cfg, wide=wide, wide_optimizer=optimizer)


def _resolved(cfg: WideFields, train_rows: int | None) -> tuple[str, str]:
    """``(wide, wide-optimizer)`` of :func:`resolve_wide`."""
    wide = wide_mode(cfg.wide)
    if wide != "auto":
        optimizer = cfg.wide_optimizer
        return wide, "adam" if optimizer == "auto" else optimizer
    on = cfg.wide_optimizer == "ftrl"
    if not on and cfg.dataset in FILE_DATASETS:
        if train_rows is None:
            raise ConfigError(
                f"wide = 'auto' on dataset {cfg.dataset!r} is resolved from the "
                "training rows, and none were given (resolve_wide)"
            )
        on = train_rows <= WIDE_AUTO_MAX_ROWS
    optimizer = cfg.wide_optimizer
    if optimizer == "auto":
        optimizer = "ftrl" if on else "adam"
    return ("on" if on else "off"), optimizer


def has_wide(cfg: WideFields) -> bool:
    """Whether the split model of ``cfg`` has a wide part.

    ``cfg`` must be resolved (:func:`resolve_wide`) where ``auto`` depends on
    the training rows.
    """
    return _resolved(cfg, None)[0] == "on"


def check_wide(cfg: WideFields) -> None:
    """wide, wide-optimizer, wide-lr, wide-l1 and wide-l2.

    ``wide`` is already canonical (:func:`wide_mode`, in ``__post_init__``).

    Raises
    ------
    ConfigError
        Naming the first bad value, or ``wide-optimizer = "ftrl"`` with
        ``wide = "off"``.
    """
    if cfg.wide not in WIDE_MODES:
        raise ConfigError(f"wide must be one of auto, on, off, got {cfg.wide!r}")
    if cfg.wide_optimizer not in WIDE_OPTIMIZERS:
        raise ConfigError(
            f"wide-optimizer must be one of {', '.join(WIDE_OPTIMIZERS)}, "
            f"got {cfg.wide_optimizer!r}"
        )
    for key, low in (("wide-lr", 0.0), ("wide-l1", 0.0), ("wide-l2", 0.0)):
        value = getattr(cfg, key.replace("-", "_"))
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or not (value > low if key == "wide-lr" else value >= low)
        ):
            bound = "> 0" if key == "wide-lr" else ">= 0"
            raise ConfigError(f"{key} must be {bound} and finite, got {value!r}")
    if cfg.wide_optimizer == "ftrl" and cfg.wide == "off":
        raise ConfigError(
            f"wide-optimizer = {cfg.wide_optimizer!r} trains the wide part, and "
            "this run has none (wide = 'off'): set wide = 'on' or 'auto' (--wide)"
        )


def wide_optimizer(
    cfg: WideFields, train_rows: int | None = None, *, heavy_noise: bool = False
) -> OptimizerFactory | None:
    """The wide part's own optimizer factory; None: the run's Adam(W) takes it.

    ``cfg`` resolved as for :func:`has_wide`; FTRL at :func:`wide_ftrl_settings`.
    """
    found = wide_ftrl_settings(cfg, train_rows, heavy_noise=heavy_noise)
    if not found:
        return None
    return ftrl(
        found["wide-lr"], beta=WIDE_BETA, l1=found["wide-l1"], l2=found["wide-l2"]
    )


def wide_ftrl_settings(
    cfg: WideFields, train_rows: int | None = None, *, heavy_noise: bool = False
) -> dict[str, float]:
    """The wide part's FTRL rate and penalties as trained (empty: no FTRL).

    With ``train_rows`` given and ``heavy_noise`` (labels noisy enough for
    the posterior), FTRL keeps the penalty of a 2-epoch run whatever the
    epochs (:func:`~tpsl_flwr.parties.training_rules.wide_budget`:
    ``wide-lr`` times ``s``, ``wide-l1`` and ``wide-l2`` over ``s``, ``s =
    min(1, 2 / epochs)`` on at most 50,000 training rows). Public facts only:
    every node resolves the same factor from its own row count, and the label
    party checkpoints the values, so that a resume resolving others is refused
    (:mod:`~tpsl_flwr.strategies.resume_check`).
    """
    if _resolved(cfg, None) != ("on", "ftrl"):
        return {}
    scale = 1.0
    if train_rows is not None:
        epochs = int(getattr(cfg, "epochs", BUDGET_EPOCHS))
        scale = wide_budget(
            train_rows=train_rows, epochs=epochs, heavy_noise=heavy_noise
        )
    return {
        "wide-lr": cfg.wide_lr * scale,
        "wide-l1": cfg.wide_l1 / scale,
        "wide-l2": cfg.wide_l2 / scale,
    }
