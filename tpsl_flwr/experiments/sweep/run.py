"""Run a sweep: every unfinished run of the grid, then the CSV, tables and plots.

The grid and its TOML file are :mod:`~tpsl_flwr.experiments.sweep.config`
(its names are re-exported here). Each run writes
``<out>/runs/<run-name>/results.json`` through
:func:`~tpsl_flwr.experiments.run.run_experiment`; a run whose results file
exists and parses is skipped, so an interrupted sweep resumes where it stopped.
Then ``runs.csv``, ``tables.md`` (the paper's Tables 1-3) and the Figure 5
plots are written from every finished run
(:mod:`tpsl_flwr.experiments.sweep.report`,
:mod:`~tpsl_flwr.experiments.sweep.scale`).

Each row names where its run's noise key came from (``key_origin``: ``os`` or
``seed``), whether that key was seeded (``seeded_key``: reproducible by
anyone who knows the seed, so utility, not protection) and whether the run
was a ``release`` or a ``rehearsal`` in the privacy ledger (``run_kind``).
Test metrics and attack AUCs are computed on the clean labels, so
``runs.csv``, ``tables.md`` and the plots are the label party's (mode
``0600``, the sweep's folder ``0700``); ``runs-public.csv`` (``0644``)
keeps only the columns of :data:`~tpsl_flwr.experiments.audience.PUBLIC_RUN_COLUMNS`.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpsl_flwr._util.private_files import write_private
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.audience import (
    PUBLIC_RUN_COLUMNS,
    is_seeded_key,
    key_origin,
    private_folder,
    write_shareable,
)
from tpsl_flwr.experiments.experiment import RESULTS_FILE
from tpsl_flwr.experiments.run import check_engine, run_experiment
from tpsl_flwr.experiments.sweep.config import (
    GRID_KEYS,
    RunSpec,
    SweepConfig,
    describe,
    load_sweep,
    run_name,
    run_noise_seed,
)
from tpsl_flwr.experiments.sweep.guarantee import (
    EPOCHS,
    guarantee_cells,
    utility_errors,
)
from tpsl_flwr.experiments.sweep.stats import (
    DIRECTION_COLUMNS,
    UNCERTAINTY_COLUMNS,
    attack_directions,
    attack_uncertainty,
    denoise_values,
)

__all__ = [
    "CSV_COLUMNS",
    "EPOCHS",
    "GRID_KEYS",
    "PUBLIC_CSV",
    "RunSpec",
    "SweepConfig",
    "chosen_epoch",
    "csv_columns",
    "describe",
    "finished",
    "load_sweep",
    "run_name",
    "run_noise_seed",
    "run_row",
    "run_sweep",
    "totals_now",
    "write_csv",
    "write_public_csv",
]

ATTACK_COLUMNS = (
    "norm",
    "cosine",
    "spectral",
    "sda",
    "sda_pooled",
    "sda_residual",
    "sda_top1",
    "auc_bound",
    "auc_bound_without_prior",
)
"""The chosen epoch's attack AUCs, each ``max(AUC, 1 - AUC)`` (its direction in
``<name>_direction``, :data:`~tpsl_flwr.experiments.sweep.stats.DIRECTION_COLUMNS`;
``sda_pooled``: the SDA's pooled-distance score beside its likelihood ratio;
``sda_residual``: the white-box energy outside the label plane), and
the ceiling (``auc_bound``: prior-aware where the top model trains on the
posterior, the plain eps one beside it)."""
CSV_COLUMNS = (
    "run",
    "dataset",
    "mechanism",
    "epsilon",
    "sigma",
    "marvell_power",
    "seed",
    "rows",
    "train_samples",
    "parameter",
    "level",
    "epsilon_at_delta",
    "delta",
    "guarantee",
    "epoch",
    "epoch_rule",
    "test_auc",
    "test_auc_se",
    "test_accuracy",
    "test_accuracy_se",
    *ATTACK_COLUMNS,
    *UNCERTAINTY_COLUMNS,
    *DIRECTION_COLUMNS,
    "epsilon_spent",
    "epsilon_total",
    "epsilon_total_now",
    "epsilon_total_now_at_delta",
    "key_origin",
    "seeded_key",
    "run_kind",
    "samples_per_second",
)
"""The columns of ``runs.csv``, ``denoise`` aside (:func:`csv_columns`)."""
PUBLIC_CSV = "runs-public.csv"
"""The shareable ``runs.csv``, its columns allowed by
:data:`~tpsl_flwr.experiments.audience.PUBLIC_RUN_COLUMNS`."""


def finished(spec: RunSpec) -> dict[str, Any] | None:
    """The run's results if it finished (its results file exists and parses).

    Raises
    ------
    ConfigError
        If the results were written with other settings than ``spec``'s (a
        changed ``[experiment]`` table over an old output folder).
    """
    path = Path(spec.config.out_dir) / RESULTS_FILE
    if not path.exists():
        return None
    try:
        results: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if "history" not in results:
        return None
    saved = results.get("config", {})
    changed = sorted(
        key
        for key, value in spec.config.to_run_config().items()
        if key != "out-dir" and saved.get(key) != value
    )
    if changed:
        raise ConfigError(
            f"{path} was written with other settings ({', '.join(changed)}); "
            "use another --out-dir or delete that run's folder"
        )
    return results


def run_row(
    name: str, results: Mapping[str, Any], epoch: str = "best"
) -> dict[str, Any]:
    """One ``runs.csv`` row: grid point, guarantee, utility and attack AUCs.

    Parameters
    ----------
    name
        The run's name.
    results
        Its ``results.json``.
    epoch
        Which epoch's test metrics and attack AUCs the row holds
        (:data:`~tpsl_flwr.experiments.sweep.stats.EPOCHS`): ``best``, the
        epoch the label party kept by its validation score (the last one when
        the run held out no validation set), or ``last``. ``epoch`` (1-based)
        and ``epoch_rule`` say which it was.

    Raises
    ------
    ConfigError
        For an unknown ``epoch``.
    """
    at, rule = chosen_epoch(results, epoch)
    history = results.get("history") or [{}]
    values = history[at] if history else {}
    attacks = values.get("attack_auc") or {}
    config = results.get("config", {})
    row: dict[str, Any] = {
        "run": name,
        "dataset": results.get("dataset", config.get("dataset")),
        "mechanism": results.get("mechanism"),
        "epsilon": results.get("epsilon"),
        "sigma": results.get("sigma"),
        "marvell_power": results.get("marvell_power"),
        "denoise": config.get("denoise"),
        "seed": config.get("seed"),
        "rows": config.get("rows"),
        "train_samples": _train_samples(results),
        **guarantee_cells(results),
        "epoch": at + 1 if history and history[at] else None,
        "epoch_rule": rule,
        "test_auc": values.get("test_auc"),
        "test_accuracy": values.get("test_accuracy"),
        "epsilon_spent": results.get("epsilon_spent"),
        "epsilon_total": results.get("epsilon_total"),
        "key_origin": key_origin(results),
        "seeded_key": is_seeded_key(results),
        "run_kind": results.get("run_kind"),
        "samples_per_second": results.get("samples_per_second"),
    }
    row.update(utility_errors(row, results.get("data_info") or {}))
    for key in ATTACK_COLUMNS:
        row[key] = attacks.get(key)
    row.update(attack_uncertainty(attacks))
    row.update(attack_directions(attacks))
    return row


def chosen_epoch(results: Mapping[str, Any], epoch: str) -> tuple[int, str]:
    """The 0-based history index of ``epoch`` (``best`` or ``last``), and its rule.

    Examples
    --------
    >>> chosen_epoch({"history": [{}, {}, {}], "best_epoch": 2}, "best")
    (1, 'best (validation)')
    >>> chosen_epoch({"history": [{}, {}, {}], "best_epoch": 2}, "last")
    (2, 'last')
    >>> chosen_epoch({"history": [{}, {}], "best_epoch": None}, "best")
    (1, 'last (no validation set)')
    """
    if epoch not in EPOCHS:
        raise ConfigError(f"epoch must be one of {', '.join(EPOCHS)}, got {epoch!r}")
    last = max(len(results.get("history") or []) - 1, 0)
    if epoch == "last":
        return last, "last"
    best = results.get("best_epoch")
    if best is None:
        return last, "last (no validation set)"
    return min(int(best) - 1, last), "best (validation)"


def _train_samples(results: Mapping[str, Any]) -> int | None:
    """Training rows of a run (``train_rows``, else the last epoch's samples)."""
    if results.get("train_rows") is not None:
        return int(results["train_rows"])
    history = results.get("history") or [{}]
    samples = history[-1].get("samples")
    return None if samples is None else int(samples)


def csv_columns(rows: list[dict[str, Any]]) -> tuple[str, ...]:
    """:data:`CSV_COLUMNS`, with ``denoise`` after ``sigma`` when the runs differ in it.

    The attack directions (:data:`~tpsl_flwr.experiments.sweep.stats.DIRECTION_COLUMNS`)
    are kept only when some run's results report one.

    Examples
    --------
    >>> "denoise" in csv_columns([{"denoise": "none"}, {"denoise": "none"}])
    False
    >>> cols = csv_columns([{"denoise": "none"}, {"denoise": "posterior"}])
    >>> cols[cols.index("sigma") + 1]
    'denoise'
    >>> "spectral_direction" in csv_columns([{"spectral_direction": "inverted"}])
    True
    """
    directed = any(r.get(c) not in (None, "") for r in rows for c in DIRECTION_COLUMNS)
    columns = tuple(c for c in CSV_COLUMNS if directed or c not in DIRECTION_COLUMNS)
    if len(denoise_values(rows)) < 2:
        return columns
    at = columns.index("sigma") + 1
    return (*columns[:at], "denoise", *columns[at:])


def csv_text(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    """``rows`` as CSV with ``columns`` (empty cells for missing values).

    Examples
    --------
    >>> rows = [{"run": "a", "seeded_key": True, "x": 1}]
    >>> csv_text(rows, ("run", "seeded_key")).splitlines()
    ['run,seeded_key', 'a,True']
    """
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row[k] for k in columns})
    return text.getvalue()


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """Write ``rows`` as ``runs.csv``: mode ``0600``, its folder made ``0700``.

    Its test metrics and attack AUCs are computed on the clean labels.
    """
    private_folder(path.parent)
    write_private(path, csv_text(rows, csv_columns(rows)).encode())


def write_public_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    """Write the shareable columns of ``rows`` to ``path`` (mode ``0644``).

    The columns are those of :func:`csv_columns` that
    :data:`~tpsl_flwr.experiments.audience.PUBLIC_RUN_COLUMNS` allows.
    """
    columns = tuple(c for c in csv_columns(rows) if c in PUBLIC_RUN_COLUMNS)
    return write_shareable(path, csv_text(rows, columns))


def totals_now(rows: list[dict[str, Any]], ledgers: list[dict[str, Any]]) -> None:
    """Each row's label-set total as the ledger has it now (after every run).

    ``epsilon_total`` is as of the run's own release; a later run over the
    same labels raises the set's total, which ``epsilon_total_now`` shows
    (pure: ``inf`` once a release has no pure guarantee, such as a Gaussian
    one) with ``epsilon_total_now_at_delta`` beside it (dp-accounting's PLD
    at ``delta = 1e-5``). Each run's total is read from the ledger folder its
    release was recorded in.
    """
    from tpsl_flwr.release.ledger import PrivacyLedger

    books: dict[str | None, PrivacyLedger] = {}
    for row, ledger in zip(rows, ledgers, strict=True):
        label_set, folder = ledger.get("label_set"), ledger.get("folder")
        if not label_set:
            continue
        if folder not in books:
            books[folder] = PrivacyLedger(folder)
        total = books[folder].total_now(label_set)
        if total is not None:
            now = total.to_dict()
            row["epsilon_total_now"] = now["epsilon"]
            row["epsilon_total_now_at_delta"] = now["epsilon_at_delta"]


def check_releases(specs: list[Any], new_release: bool, release: bool) -> None:
    """Refuse, before any run, a sweep that would release a file's labels twice.

    A sweep's runs are rehearsals (the label party starts every node): the
    ledger records them and refuses none. Counted as releases (``release``),
    runs over one file are releases of one label set: that is the label
    party's decision to take once, with ``--new-release``, not a refusal in
    the middle of the sweep.
    """
    from tpsl_flwr.data.builtin import FILE_DATASETS

    on_files = [s.name for s in specs if s.config.dataset in FILE_DATASETS]
    if release and len(on_files) > 1 and not new_release:
        raise ConfigError(
            f"this sweep runs {len(on_files)} experiments over the labels of a data "
            f"file ({on_files[0]}, ...): each is a release of those labels and their "
            "epsilons add up in the privacy ledger; pass --new-release to "
            "acknowledge them (tpsl-flwr ledger show lists earlier releases)"
        )


def run_sweep(
    sweep: SweepConfig,
    out_dir: str | Path,
    engine: str = "local",
    progress: bool = True,
    new_release: bool = False,
    privacy_budget: float = 0.0,
    release: bool = False,
    unprotected_release: bool = False,
    epoch: str = "best",
) -> dict[str, Any]:
    """Run every unfinished run of ``sweep``, then write the CSV, tables and plots.

    Parameters
    ----------
    sweep
        The grid.
    out_dir
        Output folder, made ``0700`` (``runs/<run-name>/``, ``runs.csv``,
        ``tables.md``, PNGs: mode ``0600``; ``runs-public.csv``: ``0644``).
    engine
        ``"local"`` (in-process, default) or ``"ray"`` (Flower's Ray simulation).
    progress
        Show a tqdm progress bar.
    new_release
        The label party's one decision for the whole sweep: each of its runs
        may be a further release of labels the privacy ledger already holds
        (:mod:`tpsl_flwr.release.ledger`). Needed only with ``release``: a sweep's
        runs are rehearsals otherwise (recorded, never refused).
    privacy_budget
        ``> 0``: every release is refused if it would take its label set's
        total epsilon above this.
    release, unprotected_release
        Count every run as a release; allow unprotected ones
        (``--release``, ``--unprotected-release``). With ``release``, a sweep
        of several runs over a file's labels (criteo, avazu) is refused
        before any run starts unless ``new_release``.
    epoch
        The epoch whose values the CSV, tables and figures show: ``best``
        or ``last`` (:func:`run_row`).

    Returns
    -------
    dict
        ``ran`` and ``skipped`` (run names), ``rows`` (the CSV rows) and
        ``files`` (paths written).

    Raises
    ------
    ConfigError
        If ``engine`` or ``epoch`` is unknown, or several runs counted as releases would
        release a file's labels without ``new_release``.
    """
    from flwr.common.logger import FLOWER_LOGGER
    from tqdm import tqdm

    from tpsl_flwr.experiments.sweep.report import write_report

    check_engine(engine)
    chosen_epoch({}, epoch)  # an unknown epoch fails before any run
    out = Path(out_dir)
    specs = sweep.runs(out)
    check_releases(specs, new_release, release)
    decisions: dict[str, Any] = {
        "new_release": new_release,
        "privacy_budget": privacy_budget,
        "release": release,
        "unprotected_release": unprotected_release,
    }
    specs = [
        dataclasses.replace(spec, config=dataclasses.replace(spec.config, **decisions))
        for spec in specs
    ]
    private_folder(out / "runs")  # every run's results are the label party's
    private_folder(out)
    ran: list[str] = []
    skipped: list[str] = []
    rows: list[dict[str, Any]] = []
    ledgers: list[dict[str, Any]] = []
    # Flower sets its logger to DEBUG on import: quiet it after importing it.
    level = FLOWER_LOGGER.level
    FLOWER_LOGGER.setLevel(logging.WARNING)
    try:
        bar = tqdm(specs, desc="sweep", unit="run", disable=not progress)
        for spec in bar:
            bar.set_postfix_str(spec.name)
            results = finished(spec)
            if results is None:
                Path(spec.config.out_dir).mkdir(parents=True, exist_ok=True)
                results = run_experiment(spec.config, engine)
                ran.append(spec.name)
            else:
                skipped.append(spec.name)
            rows.append(run_row(spec.name, results, epoch))
            ledgers.append(results.get("ledger") or {})
    finally:
        FLOWER_LOGGER.setLevel(level)
    totals_now(rows, ledgers)
    write_csv(rows, out / "runs.csv")
    files = [out / "runs.csv", *write_report(rows, out)]
    files.append(write_public_csv(rows, out / PUBLIC_CSV))
    return {"ran": ran, "skipped": skipped, "rows": rows, "files": files}
