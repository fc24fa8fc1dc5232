"""The optional axes of a sweep's grid: ``rows``, and ``denoises``.

``[grid] rows = [20000, 200000]`` runs every grid point once per dataset size
(:func:`check_rows`; 0: the dataset's default).

``[grid] denoises = ["none", "posterior"]`` runs every grid point once per
value of ``denoise`` (what the label party trains on: the noisy labels, the
paper's GradPerturb, or their posterior). A ``[denoise.<value>]`` table holds
run-config keys applied on top of ``[experiment]`` for the runs with that
value, since each variant has its own training settings::

    [grid]
    denoises = ["none", "posterior"]

    [denoise.none]
    lr-schedule = "constant"

    [denoise.posterior]
    lr-schedule = "cosine"

The Gaussian baseline releases no noisy label, so it has no posterior: the
grid skips its ``posterior`` runs (:func:`denoisable`). Run names gain
``_denoise-<value>`` before the seed (:func:`denoise_part`), but the two runs
of a pair (same dataset, size, mechanism, level and seed) share their noise
key, derived from the name without that part: the same noisy labels, trained
on as they are or post-processed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.config import LABEL_PARTY_ONLY, ExperimentConfig
from tpsl_flwr.experiments.training_settings import NOISY_LABELS
from tpsl_flwr.privacy.posterior import DENOISERS

__all__ = [
    "DENOISE_AXIS",
    "check_denoise_settings",
    "check_denoises",
    "check_rows",
    "denoisable",
    "denoise_part",
]

DENOISE_AXIS: tuple[str, ...] = DENOISERS
"""Values of ``grid.denoises`` (``auto`` is refused: it means one per mechanism)."""


def check_rows(rows: tuple[int, ...] | None) -> None:
    """Validate the optional ``grid.rows`` axis (``None``: no axis).

    Examples
    --------
    >>> check_rows((0, 20000))
    >>> check_rows((1.5,))
    Traceback (most recent call last):
    ...
    tpsl_flwr.errors.ConfigError: grid.rows values must be ints >= 0, got 1.5
    """
    if rows is None:
        return
    if not rows:
        raise ConfigError(f"grid.rows must not be empty, got {list(rows)!r}")
    for value in rows:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"grid.rows values must be ints >= 0, got {value!r}")


def check_denoises(denoises: tuple[str, ...] | None) -> None:
    """Validate the optional ``grid.denoises`` axis (``None``: no axis).

    Examples
    --------
    >>> check_denoises(("none", "posterior"))
    >>> check_denoises(("none", "posteriour"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tpsl_flwr.errors.ConfigError: grid.denoises: unknown value 'posteriour'; ...
    """
    if denoises is None:
        return
    if not denoises:
        raise ConfigError(f"grid.denoises must not be empty, got {list(denoises)!r}")
    for value in denoises:
        if value not in DENOISE_AXIS:
            raise ConfigError(
                f"grid.denoises: unknown value {value!r}; "
                f"valid: {', '.join(DENOISE_AXIS)}"
            )
    if len(set(denoises)) != len(denoises):
        raise ConfigError(f"grid.denoises has a repeated value: {list(denoises)!r}")


def check_denoise_settings(
    settings: Mapping[str, Any],
    denoises: tuple[str, ...] | None,
    per_run: Collection[str],
) -> None:
    """Validate the ``[denoise.<value>]`` tables (keys only; values per run).

    Raises
    ------
    ConfigError
        For a table without a ``grid.denoises`` axis, an unknown denoise value,
        a table that is not a table, or a key that is unknown, set per run
        (``per_run``) or the sweep's ``noise-seed``, each named.
    """
    if settings and denoises is None:
        tables = ", ".join(f"[denoise.{v}]" for v in settings)
        raise ConfigError(
            f"{tables}: a [denoise.<value>] table needs a grid.denoises axis"
        )
    valid = {
        f.name.replace("_", "-")
        for f in dataclasses.fields(ExperimentConfig)
        if f.name not in LABEL_PARTY_ONLY
    }
    for value, table in settings.items():
        if value not in DENOISE_AXIS:
            raise ConfigError(
                f"[denoise.{value}]: unknown denoise value {value!r}; "
                f"valid: {', '.join(DENOISE_AXIS)}"
            )
        if not isinstance(table, Mapping):
            raise ConfigError(f"denoise.{value} must be a table, got {table!r}")
        for key in table:
            name = key.replace("_", "-")
            if name == "noise-seed":
                raise ConfigError(
                    f"denoise.{value}.{key}: the noise seed is the sweep's, shared "
                    "by both runs of a pair; keep it in [experiment]"
                )
            if name in per_run:
                raise ConfigError(
                    f"denoise.{value}.{key} is set per run by the sweep; "
                    "put it in [grid]"
                )
            if name not in valid:
                raise ConfigError(
                    f"denoise.{value}: unknown run-config key {key!r}; "
                    f"valid keys: {', '.join(sorted(valid))}"
                )


def denoisable(mechanism: str, denoise: str | None) -> bool:
    """Whether the grid runs ``mechanism`` with ``denoise`` (``None``: no axis).

    Examples
    --------
    >>> denoisable("laplace", "posterior"), denoisable("gaussian", "posterior")
    (True, False)
    >>> denoisable("gaussian", "none"), denoisable("none", "posterior")
    (True, True)
    """
    return denoise != "posterior" or mechanism in (*NOISY_LABELS, "none")


def denoise_part(denoise: str | None) -> str:
    """The run-name part of a denoise value (``""`` without a denoise axis).

    Examples
    --------
    >>> denoise_part("posterior"), denoise_part(None)
    ('_denoise-posterior', '')
    """
    return "" if denoise is None else f"_denoise-{denoise}"
