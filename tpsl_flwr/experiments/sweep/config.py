"""The grid of a sweep: its TOML file, its runs, their names and noise seeds.

The TOML file has a ``[grid]`` table (what varies) and an ``[experiment]``
table (shared settings: any :class:`~tpsl_flwr.experiments.config.ExperimentConfig`
field, kebab-case)::

    [grid]
    datasets = ["synthetic-ctr"]
    mechanisms = ["none", "laplace", "discrete", "gaussian"]
    epsilons = [0.5, 1, 2, 4, 8]      # laplace, discrete, rr-prior
    sigmas = [0.25, 1, 4]             # gaussian
    marvell-powers = [0.5, 2]         # marvell (max-norm takes none)
    seeds = [0, 1, 2]
    rows = [20000, 100000]            # optional: dataset sizes (0: default)
    denoises = ["none", "posterior"]  # optional: plain and posterior runs

    [experiment]
    epochs = 1
    batch-size = 256

    [denoise.posterior]               # optional: on top of [experiment]
    weight-decay = 0.3

``none`` and ``max-norm`` run once per dataset and seed,
``laplace``/``discrete``/``rr-prior`` once per epsilon, ``gaussian`` once per
sigma, ``marvell`` once per power (``docs/baselines.md``); with a ``rows``
axis, all of that once per dataset size (run names gain ``_rows<N>`` after
the dataset); with a ``denoises`` axis, all of that once per denoise value,
``none`` included,
except ``gaussian`` with ``posterior`` (run names gain ``_denoise-<value>``
before the seed; :mod:`~tpsl_flwr.experiments.sweep.axes`). Each run is a
:class:`RunSpec` writing under ``<out>/runs/<run-name>/``; running them is
:mod:`tpsl_flwr.experiments.sweep.run`'s job.

A ``noise-seed >= 0`` in ``[experiment]`` is a sweep setting, not run config:
each run's key is derived from it and the run's name without its denoise part
(:func:`run_noise_seed`), so the plain and posterior runs of a pair release
the same noisy labels and no other two runs share noise words (seeded keys
are reproducible and NOT secure). Without it every run draws its own key from
the OS.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.sweep.axes import (
    check_denoise_settings,
    check_denoises,
    check_rows,
    denoisable,
    denoise_part,
)
from tpsl_flwr.privacy.mechanisms import MECHANISMS, parameter_of

__all__ = [
    "GRID_KEYS",
    "RunSpec",
    "SweepConfig",
    "describe",
    "load_sweep",
    "run_name",
    "run_noise_seed",
]

GRID_KEYS = (
    "datasets",
    "mechanisms",
    "epsilons",
    "sigmas",
    "marvell-powers",
    "seeds",
    "rows",
    "denoises",
)
# Fixed per run by the sweep itself; not allowed in [experiment]. With a rows
# (denoises) axis in [grid], rows (denoise) is too.
_AXES = {"epsilon": "epsilons", "sigma": "sigmas", "marvell_power": "marvell_powers"}
"""The grid axis of each mechanism parameter."""
_PER_RUN = (
    "dataset",
    "mechanism",
    "epsilon",
    "sigma",
    "marvell-power",
    "seed",
    "out-dir",
    "resume",
)
# A grid point: dataset, rows, mechanism, (param, value), denoise, seed.
_Point = tuple[str, int | None, str, tuple[str, float | None], str | None, int]


@dataclass(frozen=True)
class RunSpec:
    """One experiment of a sweep: its name and its full configuration."""

    name: str
    config: ExperimentConfig


@dataclass(frozen=True)
class SweepConfig:
    """The grid of a sweep and the settings every run shares.

    Parameters
    ----------
    datasets, mechanisms, seeds
        The grid axes (each non-empty).
    epsilons
        Budgets of ``laplace`` and ``discrete`` runs (each > 0).
    sigmas
        Noise std of ``gaussian`` runs (each > 0).
    marvell_powers
        Power-constraint scales of ``marvell`` runs (each > 0; the TOML key
        ``marvell-powers``).
    rows
        Optional axis of dataset sizes (ints >= 0; 0: the dataset's default).
        ``None`` (no axis): every run takes ``rows`` from ``experiment``.
    denoises
        Optional axis of ``denoise`` values (``none``, ``posterior``).
        ``None`` (no axis): every run takes ``denoise`` from ``experiment``.
    experiment
        Shared :class:`ExperimentConfig` settings (kebab-case keys).
    denoise_settings
        Per denoise value, settings applied on top of ``experiment`` to the
        runs with that value (the ``[denoise.<value>]`` tables; needs
        ``denoises``).

    Raises
    ------
    ConfigError
        On an empty axis, an unknown mechanism, a missing epsilon/sigma list, a
        bad value (each message names the key and the value) or a shared (or
        per-denoise) setting that is unknown or set per run.
    """

    datasets: tuple[str, ...] = ("synthetic-ctr",)
    mechanisms: tuple[str, ...] = ("none", "laplace", "discrete")
    epsilons: tuple[float, ...] = (1.0,)
    sigmas: tuple[float, ...] = ()
    marvell_powers: tuple[float, ...] = ()
    seeds: tuple[int, ...] = (0,)
    rows: tuple[int, ...] | None = None
    denoises: tuple[str, ...] | None = None
    experiment: Mapping[str, Any] = field(default_factory=dict)
    denoise_settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("datasets", "mechanisms", "seeds"):
            if not getattr(self, name):
                raise ConfigError(f"grid.{name} must not be empty")
        for mechanism in self.mechanisms:
            if mechanism not in MECHANISMS:
                raise ConfigError(
                    f"grid.mechanisms: unknown mechanism {mechanism!r}; "
                    f"valid: {', '.join(MECHANISMS)}"
                )
        for parameter, axis in _AXES.items():
            takers = [m for m in self.mechanisms if parameter_of(m) == parameter]
            if takers and not getattr(self, axis):
                raise ConfigError(
                    f"grid.{_key(axis)} is empty but {'/'.join(takers)} is swept"
                )
        for name in _AXES.values():
            for value in getattr(self, name):
                if not (
                    isinstance(value, float) and math.isfinite(value) and value > 0
                ):
                    raise ConfigError(
                        f"grid.{_key(name)} values must be > 0 and finite, "
                        f"got {value!r}"
                    )
        for seed in self.seeds:
            if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
                raise ConfigError(f"grid.seeds values must be ints >= 0, got {seed!r}")
        check_rows(self.rows)
        check_denoises(self.denoises)
        per_run = set(_PER_RUN)
        if self.rows is not None:
            per_run.add("rows")
        if self.denoises is not None:
            per_run.add("denoise")
        check_denoise_settings(self.denoise_settings, self.denoises, per_run)
        for key in self.experiment:
            if key.replace("_", "-") in per_run:
                raise ConfigError(
                    f"experiment.{key} is set per run by the sweep; put it in [grid]"
                )
        # Validate the shared settings once (unknown keys, types, values).
        if not self.runs():
            raise ConfigError(
                f"the grid has no runs: mechanisms {list(self.mechanisms)} "
                f"with denoises {list(self.denoises or ())}"
            )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> SweepConfig:
        """Build from a parsed TOML document (its tables: see the module)."""
        unknown = set(data) - {"grid", "experiment", "denoise"}
        if unknown:
            raise ConfigError(
                f"unknown table(s) {', '.join(sorted(unknown))}; "
                "valid: grid, experiment, denoise"
            )
        grid = dict(data.get("grid", {}))
        bad = set(grid) - set(GRID_KEYS)
        if bad:
            raise ConfigError(
                f"unknown grid key(s) {', '.join(sorted(bad))}; "
                f"valid: {', '.join(GRID_KEYS)}"
            )
        values: dict[str, Any] = {}
        for key in GRID_KEYS:
            if key not in grid:
                continue
            raw = grid[key]
            if not isinstance(raw, list):
                raise ConfigError(f"grid.{key} must be a list, got {raw!r}")
            field_name = key.replace("-", "_")
            if field_name in _AXES.values():
                values[field_name] = tuple(_number(f"grid.{key}", v) for v in raw)
            elif key in ("seeds", "rows"):
                values[key] = tuple(raw)
            else:
                values[key] = tuple(_text(f"grid.{key}", v) for v in raw)
        experiment = data.get("experiment", {})
        if not isinstance(experiment, Mapping):
            raise ConfigError(f"[experiment] must be a table, got {experiment!r}")
        per_denoise = data.get("denoise", {})
        if not isinstance(per_denoise, Mapping):
            raise ConfigError(
                "[denoise] must hold one [denoise.<value>] table per denoise "
                f"value, got {per_denoise!r}"
            )
        return cls(
            **values,
            experiment=dict(experiment),
            denoise_settings=dict(per_denoise),
        )

    def runs(self, out_dir: str | Path = "sweep") -> list[RunSpec]:
        """Every run of the grid, in a fixed order, written under ``out_dir``."""
        specs: list[RunSpec] = []
        experiment = {k: v for k, v in self.experiment.items() if k != "noise-seed"}
        base_noise = self.experiment.get("noise-seed", -1)
        if isinstance(base_noise, bool) or not isinstance(base_noise, int):
            raise ConfigError(
                f"experiment.noise-seed must be an int, got {base_noise!r}"
            )
        for dataset, rows, mechanism, (param, value), denoise, seed in self._points():
            name = run_name(
                dataset, mechanism, param, value, seed, rows=rows, denoise=denoise
            )
            settings: dict[str, Any] = {
                "audit": True,  # the tables need the attack AUCs
                **experiment,
                **(self.denoise_settings.get(denoise, {}) if denoise else {}),
                "dataset": dataset,
                "mechanism": mechanism,
                "seed": seed,
                "out-dir": str(Path(out_dir) / "runs" / name),
            }
            if rows is not None:
                settings["rows"] = rows
            if denoise is not None:
                settings["denoise"] = denoise
            if param:
                settings[param.replace("_", "-")] = value
            cfg = _experiment(name, settings)
            if base_noise >= 0:
                # Both runs of a plain/posterior pair: one key, the same noise.
                pair = run_name(dataset, mechanism, param, value, seed, rows=rows)
                cfg = dataclasses.replace(
                    cfg, noise_seed=run_noise_seed(base_noise, pair)
                )
            specs.append(RunSpec(name, cfg))
        return specs

    def _points(self) -> Iterator[_Point]:
        """Each run's dataset, rows, mechanism, (param, value), denoise, seed."""
        sizes: tuple[int | None, ...] = self.rows if self.rows is not None else (None,)
        denoises: tuple[str | None, ...] = self.denoises or (None,)
        for dataset, rows, mechanism in itertools.product(
            self.datasets, sizes, self.mechanisms
        ):
            for point, denoise, seed in itertools.product(
                self._params(mechanism), denoises, self.seeds
            ):
                # gaussian has no posterior: skipped, not refused.
                if denoisable(mechanism, denoise):
                    yield dataset, rows, mechanism, point, denoise, seed

    def _params(self, mechanism: str) -> list[tuple[str, float | None]]:
        """The (parameter, value) points of ``mechanism``: one per axis value."""
        parameter = parameter_of(mechanism)
        if parameter is None:
            return [("", None)]
        return [(parameter, value) for value in getattr(self, _AXES[parameter])]


def _key(axis: str) -> str:
    """A grid axis field as the TOML file names it (``marvell-powers``)."""
    return axis.replace("_", "-")


def run_noise_seed(base: int, name: str) -> int:
    """A run's own noise seed: a hash of the sweep's seed and the run's name.

    Distinct names give distinct seeds (up to a 2^-63 collision chance), so
    no two runs of a sweep release noise from the same key, except the two
    runs of a plain/posterior pair: the sweep passes their name without the
    denoise part (the same noisy labels, post-processed or not).

    Examples
    --------
    >>> run_noise_seed(0, "digits_none_seed0") != run_noise_seed(0, "digits_none_seed1")
    True
    """
    digest = hashlib.sha256(f"tpsl-flwr sweep run {base}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def _experiment(name: str, settings: Mapping[str, Any]) -> ExperimentConfig:
    try:
        return ExperimentConfig.from_run_config(settings)
    except ConfigError as err:
        raise ConfigError(f"run {name}: {err}") from None


def _number(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{key} values must be numbers, got {value!r}")
    return float(value)


def _text(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key} values must be strings, got {value!r}")
    return value


_NAME_PARTS = {"epsilon": "eps", "sigma": "sigma", "marvell_power": "power"}
"""How a run's name spells its mechanism's parameter."""


def run_name(
    dataset: str,
    mechanism: str,
    param: str,
    value: float | None,
    seed: int,
    *,
    rows: int | None = None,
    denoise: str | None = None,
) -> str:
    """A run's folder name: its grid point, each axis that is swept included.

    ``_rows<N>`` goes after the dataset when a rows axis is swept,
    ``_denoise-<value>`` before the seed when a denoises axis is.

    Examples
    --------
    >>> run_name("synthetic-ctr", "laplace", "epsilon", 0.5, 2)
    'synthetic-ctr_laplace_eps0.5_seed2'
    >>> run_name("digits", "none", "", None, 0)
    'digits_none_seed0'
    >>> run_name("synthetic-ctr", "marvell", "marvell_power", 2.0, 0)
    'synthetic-ctr_marvell_power2_seed0'
    >>> run_name("synthetic-ctr", "laplace", "epsilon", 1.0, 0, rows=200000)
    'synthetic-ctr_rows200000_laplace_eps1_seed0'
    >>> run_name("synthetic-ctr", "none", "", None, 0, denoise="posterior")
    'synthetic-ctr_none_denoise-posterior_seed0'
    """
    size = "" if rows is None else f"_rows{rows}"
    middle = "" if value is None else f"_{_NAME_PARTS.get(param, param)}{value:g}"
    return f"{dataset}{size}_{mechanism}{middle}{denoise_part(denoise)}_seed{seed}"


def load_sweep(
    path: str | Path, experiment: Mapping[str, Any] | None = None
) -> SweepConfig:
    """Read and validate a sweep TOML file.

    Parameters
    ----------
    path
        The sweep TOML file.
    experiment
        Run-config keys (kebab-case) set on top of the file's ``[experiment]``
        table: the CLI's ``--data-path`` and ``--cache-dir``, so a shipped
        config runs on the user's file without an edited copy.

    Raises
    ------
    ConfigError
        If the file is not valid TOML or a key/value is bad (named in the message).
    """
    try:
        with Path(path).open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    if experiment:
        table = data.get("experiment", {})
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [experiment] must be a table, got {table!r}")
        data["experiment"] = {**table, **experiment}
    try:
        return SweepConfig.from_mapping(data)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def describe(sweep: SweepConfig) -> str:
    """A one-line summary of the grid (for the CLI)."""
    rows = "" if sweep.rows is None else f", rows {list(sweep.rows)}"
    if sweep.denoises is not None:
        rows += f", denoises {list(sweep.denoises)}"
    return (
        f"{len(sweep.runs())} runs: datasets {list(sweep.datasets)}, "
        f"mechanisms {list(sweep.mechanisms)}, epsilons {list(sweep.epsilons)}, "
        f"sigmas {list(sweep.sigmas)}, "
        + (
            f"marvell-powers {list(sweep.marvell_powers)}, "
            if sweep.marvell_powers
            else ""
        )
        + f"seeds {list(sweep.seeds)}{rows}"
    )
