"""One report from several sweep folders: the same data, the same settings.

``tpsl-flwr sweep report DIR [DIR ...] --out-dir OUT`` reads every finished
run of each sweep folder (those its ``runs.csv`` lists, else every
``runs/<run>/results.json`` that parses) and writes one ``runs.csv``, one set
of tables and one set of figures over all of them: seeds added later, or
another mechanism run beside the first ones, land in the same table and
figure.

Runs merge only when they are comparable. Per dataset (and size, and
denoise value) every run must have the same settings key: its run config
without what a sweep's grid sets per run (:data:`PER_RUN_SETTINGS` and every
mechanism's own parameter) and without where files live
(:data:`WHERE_SETTINGS`); and the same data (:data:`DATA_FACTS` of the
results' ``data_info``: a file given by another path is the same data, a
different sample is not). Anything else is refused with a
:class:`~tpsl_flwr.errors.ConfigError` that names the setting (or data fact),
both values and the run of each; so is a run name found in two folders (a
merged report counts each run once).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.audience import private_folder
from tpsl_flwr.experiments.experiment import RESULTS_FILE
from tpsl_flwr.experiments.sweep.run import (
    PUBLIC_CSV,
    chosen_epoch,
    run_row,
    totals_now,
    write_csv,
    write_public_csv,
)
from tpsl_flwr.privacy.mechanisms import MECHANISMS, parameter_of

__all__ = [
    "DATA_FACTS",
    "PER_RUN_SETTINGS",
    "WHERE_SETTINGS",
    "SweepRun",
    "check_mergeable",
    "read_sweep",
    "report_sweeps",
]

PER_RUN_SETTINGS = frozenset(
    {"dataset", "mechanism", "epsilon", "sigma", "seed", "rows", "denoise"}
    | {p for m in MECHANISMS if (p := parameter_of(m)) is not None}
    | {p.replace("_", "-") for m in MECHANISMS if (p := parameter_of(m)) is not None}
)
"""Run-config keys a sweep's grid sets per run: they may differ between runs."""
WHERE_SETTINGS = frozenset(
    {"out-dir", "label-dir", "data-path", "transcript-dir", "resume", "checkpoint"}
)
"""Run-config keys that say where files live or whether a run resumed; they
do not change what a run computes."""
DATA_FACTS = ("rows", "num_classes", "positive_rate", "num_numeric", "num_categorical")
"""The ``data_info`` facts two runs of one dataset must share (the split's
facts vary with the seed and are not compared)."""


@dataclass(frozen=True)
class SweepRun:
    """One finished run of a sweep folder: where it is, its name, its results."""

    folder: Path
    name: str
    results: Mapping[str, Any]

    @property
    def where(self) -> str:
        """The run's folder, for messages."""
        return str(self.folder / "runs" / self.name)


def _listed(folder: Path) -> list[str] | None:
    """The run names the folder's ``runs.csv`` lists (None without one)."""
    path = folder / "runs.csv"
    if not path.is_file():
        return None
    with path.open(newline="") as handle:
        return [row["run"] for row in csv.DictReader(handle) if row.get("run")]


def read_sweep(folder: str | Path) -> list[SweepRun]:
    """Every finished run of a sweep folder.

    The runs its ``runs.csv`` lists (what the sweep reported; a run left by
    an older grid in ``runs/`` is not), else every run under ``runs/``. A run
    whose results are missing or do not parse is skipped.

    Raises
    ------
    ConfigError
        If ``folder`` has no ``runs/`` folder or no finished run.
    """
    folder = Path(folder)
    runs_dir = folder / "runs"
    if not runs_dir.is_dir():
        raise ConfigError(
            f"{folder} is not a sweep folder: it has no runs/ folder "
            "(give the --out-dir of a `tpsl-flwr sweep run`)"
        )
    names = _listed(folder)
    if names is None:
        names = sorted(p.name for p in runs_dir.iterdir() if p.is_dir())
    found = []
    for name in names:
        try:
            results = json.loads((runs_dir / name / RESULTS_FILE).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(results, dict) and "history" in results:
            found.append(SweepRun(folder, name, results))
    if not found:
        raise ConfigError(f"{folder} holds no finished run (no runs/*/{RESULTS_FILE})")
    return found


def _settings(run: SweepRun) -> dict[str, Any]:
    """The run's settings key: its run config less per-run and where keys."""
    config = run.results.get("config") or {}
    skip = PER_RUN_SETTINGS | WHERE_SETTINGS
    return {k: v for k, v in config.items() if k not in skip}


def _group(run: SweepRun) -> tuple[str, Any, Any]:
    """The runs that must share settings: one dataset, size and denoise value."""
    config = run.results.get("config") or {}
    dataset = run.results.get("dataset", config.get("dataset"))
    return str(dataset), config.get("rows"), config.get("denoise")


def _differences(
    a: Mapping[str, Any], b: Mapping[str, Any]
) -> list[tuple[str, Any, Any]]:
    """Every key whose value differs between ``a`` and ``b`` (missing: None)."""
    return [
        (key, a.get(key), b.get(key))
        for key in sorted(set(a) | set(b))
        if a.get(key) != b.get(key)
    ]


def check_mergeable(runs: Iterable[SweepRun]) -> None:
    """Refuse runs that one report cannot hold, naming why.

    Raises
    ------
    ConfigError
        If one run name is in two folders, if two runs of one dataset differ
        in a data fact (:data:`DATA_FACTS`) or two runs of one dataset, size
        and denoise value in a setting: the message names the key, both
        values and both runs.
    """
    seen: dict[str, SweepRun] = {}
    settings: dict[tuple[str, Any, Any], SweepRun] = {}
    data: dict[str, SweepRun] = {}
    for run in runs:
        if run.name in seen:
            raise ConfigError(
                f"run {run.name} is in two sweep folders ({seen[run.name].folder} "
                f"and {run.folder}): a merged report counts each run once; "
                "give each folder once, or remove one of the two runs"
            )
        seen[run.name] = run
        group = _group(run)
        first = settings.setdefault(group, run)
        differ = _differences(_settings(first), _settings(run))
        if differ:
            said = "; ".join(f"{k!r}: {a!r} vs {b!r}" for k, a, b in differ)
            raise ConfigError(
                f"cannot merge sweeps with different settings ({said}) between "
                f"{first.where} and {run.where} (dataset {group[0]}); a merged "
                "report needs the same settings"
            )
        reference = data.setdefault(group[0], run)
        facts = [
            {k: (r.results.get("data_info") or {}).get(k) for k in DATA_FACTS}
            for r in (reference, run)
        ]
        differ = _differences(*facts)
        if differ:
            said = "; ".join(f"{k}: {a!r} vs {b!r}" for k, a, b in differ)
            raise ConfigError(
                f"cannot merge sweeps over different data: {group[0]} differs "
                f"({said}) between {reference.where} and {run.where}"
            )


def report_sweeps(
    folders: Sequence[str | Path], out_dir: str | Path, epoch: str = "best"
) -> dict[str, Any]:
    """One ``runs.csv``, tables and figures over every run of ``folders``.

    Parameters
    ----------
    folders
        Sweep folders (each a ``tpsl-flwr sweep run --out-dir``).
    out_dir
        Where the report goes (made ``0700``; may be one of ``folders``).
    epoch
        ``best`` or ``last``: the epoch whose values are shown
        (:func:`~tpsl_flwr.experiments.sweep.run.run_row`).

    Returns
    -------
    dict
        ``runs`` (how many), ``folders`` and ``files`` (paths written).

    Raises
    ------
    ConfigError
        If a folder is not a sweep folder or holds no finished run, or the
        runs cannot be merged (:func:`check_mergeable`), or ``epoch`` is unknown.
    """
    from tpsl_flwr.experiments.sweep.report import write_report

    chosen_epoch({}, epoch)
    if not folders:
        raise ConfigError("sweep report needs at least one sweep folder")
    runs = [run for folder in folders for run in read_sweep(folder)]
    check_mergeable(runs)
    rows = [run_row(run.name, run.results, epoch) for run in runs]
    totals_now(rows, [run.results.get("ledger") or {} for run in runs])
    out = Path(out_dir)
    private_folder(out)
    write_csv(rows, out / "runs.csv")
    files = [out / "runs.csv", *write_report(rows, out)]
    files.append(write_public_csv(rows, out / PUBLIC_CSV))
    return {"runs": len(rows), "folders": [str(f) for f in folders], "files": files}
