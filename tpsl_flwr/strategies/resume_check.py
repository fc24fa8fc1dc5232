"""A resume held to the settings the stopped run trained at.

A resumed run continues from its checkpoints: each party's optimizer comes
back with the rates and decay it was built with, the label party's step count
with the batches it counted. A resume whose settings resolve otherwise (``lr
= auto`` over another epoch count, another ``weight-decay``, the wide part's
FTRL rate and penalties scaled by another budget) would go on training at the
stopped run's while its results reported its own. The label party saves the
settings it resolved in every checkpoint (:func:`resolved_settings`) and a
resume is refused, naming each that changed, before anything is written or
sent: the label party checks them on the dry-run release (the experiments'
``build_strategy``, ``TPSLStrategy.for_labels``), so a refused resume leaves
the ledger, the label party's decisions and the run folder as they were.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from tpsl_flwr.errors import ResumeRefused
from tpsl_flwr.parties.optim import base_rates

__all__ = ["GIVEN_KEY", "SETTINGS_KEY", "check_resumed_settings", "resolved_settings"]

SETTINGS_KEY = "settings"
"""The checkpoint's key for :func:`resolved_settings` (the label party's state)."""


def resolved_settings(
    optimizer: torch.optim.Optimizer, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The settings a resume must keep: the optimizer's, and ``extra``.

    ``lr`` and ``weight-decay`` are read from the label party's optimizer,
    one per parameter group, as it was configured (before any schedule);
    ``extra`` holds what the label party resolved for the nodes (the wide
    part's FTRL settings), under the run-config names. The batch size and
    ``average`` are checkpointed and checked on their own, with their reasons
    (``EpochLoop.check_resumed_batch``,
    :func:`~tpsl_flwr.parties.weight_average.check_resumed_average`).

    Examples
    --------
    >>> w = torch.zeros(1, requires_grad=True)
    >>> resolved_settings(torch.optim.Adam([w], lr=0.01))
    {'lr': [0.01], 'weight-decay': [0.0]}
    """
    return {**_optimizer_settings(optimizer.param_groups), **dict(extra or {})}


def _optimizer_settings(groups: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``lr`` and ``weight-decay`` per parameter group, as configured."""
    groups = list(groups)
    return {
        "lr": list(base_rates(groups)),
        "weight-decay": [float(g.get("weight_decay", 0.0)) for g in groups],
    }


GIVEN_KEY = "given"
"""In :func:`resolved_settings`' ``extra``: what the run config gave for each
setting that a rule scales (the wide part's), so that a refusal can name the
values to pass; never compared."""


def check_resumed_settings(
    party_state: Mapping[str, Any] | None, now: Mapping[str, Any]
) -> None:
    """Refuse a resume whose resolved settings differ from the stopped run's.

    ``party_state``: the checkpoint's label party state (one written before
    the settings were saved: its optimizer's rates and decay alone);
    ``now``: this run's :func:`resolved_settings`. Settings only one of the
    two names (a wide part added or dropped is a changed model, refused when
    the weights load) are not compared here. The values the refusal tells to
    pass: the stopped one, times ``given / resolved`` where ``now[GIVEN_KEY]``
    says what the run config gave for a setting a rule scales (the wide
    part's budget over the epochs); an ``lr`` (auto or not) is taken as given.

    Raises
    ------
    ResumeRefused
        Naming each setting that changed, both values exactly, and the values
        to resume with.

    Examples
    --------
    An older checkpoint is held to its optimizer's own rates:

    >>> older = {"optimizer": {"param_groups": [{"lr": 0.01, "weight_decay": 0.3}]}}
    >>> check_resumed_settings(older, {"lr": [0.01], "weight-decay": [0.0]})
    Traceback (most recent call last):
    ...
    tpsl_flwr.errors.ResumeRefused: cannot resume: the stopped run trained with weight-decay = 0.3 and this one resolves weight-decay = 0.0: the checkpoints hold the stopped run's optimizers, which would go on at its settings while this run reported its own; resume with weight-decay = 0.3 (they resolve to the stopped run's settings at this run's epochs), or start a new run
    >>> stopped = {"settings": {"lr": [0.01], "wide-lr": 5.0}}
    >>> check_resumed_settings(stopped, {"lr": [0.01], "wide-lr": 5.0})
    >>> now = {"lr": [2 / 300], "wide-lr": 2.5, "given": {"wide-lr": 5.0}}
    >>> check_resumed_settings(stopped, now)
    Traceback (most recent call last):
    ...
    tpsl_flwr.errors.ResumeRefused: cannot resume: the stopped run trained with lr = 0.01, wide-lr = 5.0 and this one resolves lr = 0.006666666666666667, wide-lr = 2.5: the checkpoints hold the stopped run's optimizers, which would go on at its settings while this run reported its own; resume with lr = 0.01, wide-lr = 10.0 (they resolve to the stopped run's settings at this run's epochs), or start a new run
    """  # noqa: E501
    state = party_state or {}
    stopped = state.get(SETTINGS_KEY)
    if not stopped and "optimizer" in state:  # saved before the settings were
        stopped = _optimizer_settings(state["optimizer"].get("param_groups", []))
    if not stopped:
        return
    given = now.get(GIVEN_KEY) or {}
    changed = [
        name
        for name, value in now.items()
        if name != GIVEN_KEY and name in stopped and not _same(stopped[name], value)
    ]
    if changed:
        was = ", ".join(f"{n} = {_text(stopped[n])}" for n in changed)
        resolved = ", ".join(f"{n} = {_text(now[n])}" for n in changed)
        to_pass = ", ".join(
            f"{n} = {_text(_to_pass(stopped[n], given.get(n), now[n]))}"
            for n in changed
        )
        raise ResumeRefused(
            f"cannot resume: the stopped run trained with {was} and this one "
            f"resolves {resolved}: the checkpoints hold the stopped run's "
            "optimizers, which would go on at its settings while this run "
            f"reported its own; resume with {to_pass} (they resolve to the "
            "stopped run's settings at this run's epochs), or start a new run"
        )


def _to_pass(stopped: Any, given: Any, resolved: Any) -> Any:
    """What resolves to ``stopped``, where ``given`` resolved to ``resolved``."""
    numbers = all(isinstance(v, float | int) for v in (stopped, given, resolved))
    if not numbers or not resolved:
        return stopped
    value = float(stopped) * float(given) / float(resolved)
    return float(f"{value:.12g}")  # 7.5, not 7.500000000000001: within 1e-9


def _same(a: Any, b: Any) -> bool:
    """Equal, floats to 1e-9 relative (an auto value resolved twice is equal)."""
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float | int) and isinstance(b, float | int):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return bool(a == b)


def _text(value: Any) -> str:
    """A setting as the command line takes it: exact floats, one value bare."""
    if isinstance(value, list | tuple):
        items = [_text(v) for v in value]
        return items[0] if len(items) == 1 else ", ".join(items)
    return repr(value) if isinstance(value, float) else str(value)
