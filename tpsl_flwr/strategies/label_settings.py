"""The checks of :meth:`TPSLStrategy.for_labels`, one per argument or combination.

Each returns the checked value (or resolves ``auto`` as ``tpsl-flwr simulate``
does) or raises a :class:`~tpsl_flwr.errors.ConfigError` naming the argument
and the value, before anything is written.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tpsl_flwr._util.checks import check_labels, check_positive_finite
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.parties.optim import OptimizerFactory
from tpsl_flwr.parties.training_rules import resolve_denoise
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import Mechanism, make_mechanism, parameter_of
from tpsl_flwr.privacy.posterior import DENOISE_PRIORS, DENOISERS, check_denoisable

__all__ = [
    "DEFAULT_PARAMETER",
    "DEFAULT_WEIGHT_DECAY",
    "RECORD_IDS",
    "RESERVED",
    "check_release_options",
    "checked_labels",
    "checked_record_ids",
    "denoise_of",
    "id_space_of",
    "ids_digest",
    "mechanism_of",
    "optimizer_of",
]

DEFAULT_PARAMETER = 1.0
"""``epsilon`` (``laplace``, ``discrete``, ``rr-prior``), ``sigma``
(``gaussian``) or ``marvell_power`` (``marvell``) left out."""
DEFAULT_WEIGHT_DECAY = 0.3
"""``weight_decay`` left out (AdamW; ``simulate``'s ``weight-decay``)."""
RECORD_IDS = "record-ids"
"""The binding's name for the digest of the record ids (the id space)."""
RESERVED = frozenset(
    {
        "mechanism",
        "epsilon",
        "sigma",
        "marvell_power",
        "num-classes",
        "placement",
        "reuse-noise",
        "validation-fraction",
        RECORD_IDS,
    }
)
"""Binding names an ``id_space`` may not state (the settings' own)."""


def mechanism_of(
    name: object,
    *,
    epsilon: object,
    sigma: object,
    num_classes: int,
    marvell_power: object = None,
) -> Mechanism:
    """The mechanism ``name`` at the one parameter it takes (stated or 1.0).

    Raises
    ------
    ConfigError
        For an unknown name, or a parameter the mechanism does not take.
    """
    if not isinstance(name, str):
        raise ConfigError(f"mechanism must be a name, got {name!r}")
    takes = parameter_of(name)  # an unknown name: the valid ones are listed
    given = {"epsilon": epsilon, "sigma": sigma, "marvell_power": marvell_power}
    for other, value in given.items():
        if value is not None and other != takes:
            takes_what = f"takes {takes}, not" if takes else "takes no"
            raise ConfigError(
                f"mechanism {name!r} {takes_what} {other} (got {other}={value!r}); "
                f"leave {other} out"
            )
    if takes is None:
        return make_mechanism(name, num_classes=num_classes)
    stated: Any = given[takes]
    stated = DEFAULT_PARAMETER if stated is None else stated
    return make_mechanism(name, num_classes=num_classes, **{takes: stated})


def checked_labels(
    train: object, test: object, k: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """Both label arrays in ``[0, k)``, or a ConfigError naming which one."""
    checked: dict[str, np.ndarray | None] = {"test_labels": None}
    for name, labels in (("train_labels", train), ("test_labels", test)):
        if labels is None and name == "test_labels":
            continue
        try:
            checked[name] = check_labels(labels, k)
        except ConfigError as err:
            hint = " (pass num_classes=k for k classes)" if "lie in" in str(err) else ""
            raise ConfigError(f"{name}: {err}{hint}") from None
    train_checked = checked["train_labels"]
    assert train_checked is not None
    return train_checked, checked["test_labels"]


def checked_record_ids(ids: object, n_train: int, n_test: int) -> np.ndarray:
    """One distinct integer id ``>= 0`` per label, train then test."""
    array = np.asarray(ids)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise ConfigError(
            f"record_ids must be a 1-D integer array, got {array.dtype} of shape "
            f"{array.shape}"
        )
    if array.size != n_train + n_test:
        raise ConfigError(
            f"record_ids must hold one id per label, train then test: {n_train} + "
            f"{n_test} = {n_train + n_test}, got {array.size}"
        )
    if array.min() < 0:
        raise ConfigError(f"record_ids must be >= 0, got {int(array.min())}")
    if np.unique(array).size != array.size:
        raise ConfigError("record_ids must be distinct: two labels name one record")
    return array.astype(np.int64, copy=False)


def optimizer_of(
    optimizer: object, lr: object, weight_decay: object
) -> OptimizerFactory | None:
    """``optimizer`` if given (alone), after checking ``lr`` and ``weight_decay``."""
    for name, value in (("lr", lr), ("weight_decay", weight_decay)):
        if value is None and name == "weight_decay":
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 0 <= value < math.inf
        ):
            hint = " (0: auto)" if name == "lr" else ""
            raise ConfigError(f"{name} must be >= 0{hint} and finite, got {value!r}")
    if optimizer is None:
        return None
    if not callable(optimizer):
        raise ConfigError(
            f"optimizer must be a factory params -> optimizer, got {optimizer!r}"
        )
    if lr or weight_decay is not None:
        stated = "lr" if lr else "weight_decay"
        raise ConfigError(
            f"optimizer builds the top model's optimizer with its own rate and "
            f"decay; {stated} stated beside it ({stated}="
            f"{lr if lr else weight_decay!r}) would not be used: state one of them"
        )
    factory: Callable[..., Any] = optimizer
    return factory


def check_release_options(
    mechanism: Mechanism,
    *,
    resume: bool,
    new_release: bool,
    budget: object,
    noise_key: object,
    unprotected_release: bool,
) -> None:
    """Refuse release options that contradict each other or the mechanism."""
    if budget is not None:
        check_positive_finite(budget, "budget")
    if noise_key is not None and not isinstance(noise_key, NoiseKey):
        raise ConfigError(f"noise_key must be a NoiseKey, got {noise_key!r}")
    if isinstance(noise_key, NoiseKey) and noise_key.binding is not None:
        raise ConfigError(
            f"noise_key {noise_key.fingerprint} already serves a release; a fresh "
            "release derives its own key (to continue that run: resume=True)"
        )
    if resume:
        for name, stated in (
            ("new_release", new_release),
            ("budget", budget is not None),
            ("noise_key", noise_key is not None),
        ):
            if stated:
                raise ConfigError(
                    f"resume=True continues the release bound in label_dir, under "
                    f"its key and its admission; {name} is for a fresh release "
                    "(resume=False)"
                )
    if unprotected_release and mechanism.protects and mechanism.dp_guarantee:
        raise ConfigError(
            f"unprotected_release=True is for mechanism 'none' (or a heuristic "
            f"without DP guarantee), got mechanism {mechanism.name!r}, which "
            "protects the labels; leave it out"
        )


def denoise_of(denoise: object, prior: object, mechanism: Mechanism) -> str:
    """``denoise`` with ``auto`` resolved as ``simulate`` does, checked."""
    for name, value, choices in (
        ("denoise", denoise, ("auto", *DENOISERS)),
        ("denoise_prior", prior, DENOISE_PRIORS),
    ):
        if value not in choices:
            raise ConfigError(
                f"{name} must be one of {', '.join(choices)}, got {value!r}"
            )
    eps = mechanism.epsilon if mechanism.epsilon is not None else DEFAULT_PARAMETER
    resolved = resolve_denoise(
        str(denoise), mechanism.name, classes=mechanism.num_classes, epsilon=eps
    )
    if resolved == "posterior":
        check_denoisable(mechanism)
    return resolved


def id_space_of(given: object) -> dict[str, str | int | float | bool]:
    """The embedder's extra id-space names, checked."""
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise ConfigError(f"id_space must be a mapping name -> value, got {given!r}")
    out: dict[str, str | int | float | bool] = {}
    for name, value in given.items():
        if not isinstance(name, str) or name in RESERVED:
            raise ConfigError(
                f"id_space may not name {name!r}: the binding states "
                f"{', '.join(sorted(RESERVED))} itself"
            )
        if not isinstance(value, str | int | float | bool):
            raise ConfigError(
                f"id_space[{name!r}] must be text, a number or a bool, got {value!r}"
            )
        out[name] = value
    return out


def ids_digest(ids: np.ndarray, n_train: int) -> str:
    """Which record each wire id names: the split sizes and a digest of the ids.

    Examples
    --------
    >>> ids_digest(np.arange(5), 4)[:4]
    '4+1:'
    """
    digest = hashlib.sha256(ids.astype("<i8").tobytes()).hexdigest()[:16]
    return f"{n_train}+{ids.size - n_train}:{digest}"
