"""Tables and plots of a sweep, shaped like the TPSL paper's (Yang et al.).

* Table 1: no protection — test AUC and the norm (NA), spectral (SA) and
  shortest-distance (SDA) attack AUCs;
* Tables 2-3 (and the Gaussian baseline): per epsilon (or sigma), the label
  set's total epsilon now (every release in the privacy ledger), test AUC and
  every attack AUC, with the ``e^eps / (1 + e^eps)`` ceiling;
* a table per further mechanism (one without a DP guarantee, such as a
  heuristic defense, titled so, its epsilon cell empty);
* the figures (:mod:`~tpsl_flwr.experiments.sweep.figures`): Figure 5's
  utility vs epsilon and utility vs SDA AUC, and the attacks against epsilon;
* with a ``rows`` axis (some dataset at two sizes or more): utility vs
  training-set size (:mod:`tpsl_flwr.experiments.sweep.scale`);
* the tables as Markdown (``tables.md``), LaTeX (``tables.tex``,
  :mod:`~tpsl_flwr.experiments.sweep.latex`) and CSV (``summary.csv``: one
  row per configuration, its means and error bars);
* with a ``denoises`` axis (runs that differ in ``denoise``): a ``denoise``
  column in every table, the plain and posterior rows of a level next to each
  other, a side-by-side table (:mod:`~tpsl_flwr.experiments.sweep.pairs`),
  and one series per mechanism and denoise value in each panel (line
  style tells the denoise values apart), each with its own no-protection
  reference.

Tables and panels go per dataset, or per dataset and size when a dataset was
run at several sizes; cells are described in
:mod:`tpsl_flwr.experiments.sweep.stats`. Every protected table has a ``key``
column: where its runs' noise keys came from, a seeded key marked ``not
secure`` (anyone who knows the seed can subtract the noise).

Everything here is computed on the clean labels (test metrics, attack AUCs
against the true labels): the files are the label party's alone, mode
``0600`` in the sweep's folder made ``0700``
(:mod:`~tpsl_flwr.experiments.audience`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tpsl_flwr._util.private_files import write_private
from tpsl_flwr.attacks.ceiling import SIGMAS_OF_TOLERANCE
from tpsl_flwr.experiments.audience import private_folder
from tpsl_flwr.experiments.experiment import RESULTS_FILE
from tpsl_flwr.experiments.sweep.figures import write_plots
from tpsl_flwr.experiments.sweep.guarantee import (
    epoch_note,
    epsilon_cell,
    protected,
)
from tpsl_flwr.experiments.sweep.latex import latex_tables, summary_csv
from tpsl_flwr.experiments.sweep.pairs import pairs_markdown
from tpsl_flwr.experiments.sweep.scale import scale_markdown
from tpsl_flwr.experiments.sweep.stats import (
    UTILITY_LABEL,
    Row,
    attack_uncertainty,
    ceiling_cell,
    ceiling_summary,
    cell,
    denoise_parts,
    denoise_values,
    key_cell,
    key_line,
    level_text,
    levels,
    markdown_table,
    report_groups,
    sda_key,
    total_cell,
    utility_key,
)

__all__ = [
    "tables_markdown",
    "with_uncertainty",
    "write_plots",
    "write_report",
    "write_tables",
]


def tables_markdown(rows: Sequence[Row]) -> str:
    """The paper's Tables 1-3 (and the Gaussian baseline) as Markdown.

    With several dataset sizes, also utility vs training-set size
    (:func:`scale_markdown`).
    """
    datasets = report_groups(rows)
    values = denoise_values(rows)
    # The denoise column, in headers and rows, only when the runs differ in it.
    column = ["denoise"] if len(values) > 1 else []
    seeds = sorted({int(r["seed"]) for r in rows if r.get("seed") not in (None, "")})
    lines = [
        "# TPSL sweep",
        "",
        f"{len(rows)} runs; cells are mean ± std over seeds {seeds} (a lone run: "
        "its value and its standard error, SE). Test metrics and attack AUCs "
        f"are at each run's {epoch_note(rows)}; attack AUCs are pooled over "
        "the training samples, on what party 0 received: NA = "
        "norm, SA = spectral, SDA = white-box shortest distance.",
        *(["", DENOISE_NOTE] if column else []),
        "",
        key_line(rows),
        "",
        "## Table 1: no protection",
        "",
    ]
    body = []
    for name, group in datasets.items():
        utility, sda = utility_key(group), sda_key(group)
        for denoise, part in denoise_parts(group, values):
            plain = [r for r in part if r["mechanism"] == "none"]
            if plain:
                body.append(
                    [name, *_given(denoise), UTILITY_LABEL[utility]]
                    + [cell(plain, k) for k in (utility, "norm", "spectral", sda)]
                )
    header = ["dataset", *column, "metric", "utility", "NA", "SA", "SDA"]
    lines += markdown_table(header, body) if body else ["(no `none` runs)"]
    for mechanism, param, title in protected(rows):
        body = []
        # A parameter other than epsilon: the epsilon the run has beside it.
        extra = ["epsilon"] if param != "epsilon" else []
        for name, group in datasets.items():
            runs = [r for r in group if r["mechanism"] == mechanism]
            utility, sda = utility_key(group), sda_key(group)
            for level, level_rows in levels(runs, param).items():
                for denoise, part in denoise_parts(level_rows, values):
                    body.append(
                        [name, level_text(param, level), *_given(denoise)]
                        + [epsilon_cell(part) for _ in extra]
                        + [cell(part, utility)]
                        + [cell(part, k) for k in ("norm", "cosine", "spectral", sda)]
                        + [ceiling_cell(part), ceiling_summary(part)]
                        + [key_cell(part), total_cell(part)]
                    )
        if not body:
            continue
        header = [
            "dataset",
            param,
            *column,
            *extra,
            "utility",
            "norm",
            "cosine",
            "spectral",
            "SDA",
            "ceiling",
            "SDA vs ceiling",
            "key",
            "total",
        ]
        lines += ["", f"## {title}", "", *markdown_table(header, body)]
    lines += pairs_markdown(rows)
    lines += scale_markdown(rows)
    lines += [
        "",
        "utility = test AUC (binary) or test accuracy (multi-class, with SDA "
        "top-1); ceiling = e^eps / (1 + e^eps), the bound on any attack's AUC "
        "(where the top model trains on the posterior, followed by the "
        "prior-aware ceiling the verdict uses); "
        "SDA vs ceiling counts the runs whose SDA AUC is above the ceiling "
        f"within sampling error, or by more than {SIGMAS_OF_TOLERANCE:g} "
        "Hanley-McNeil standard errors (ABOVE THE CEILING: the guarantee is "
        "violated; at an AUC of exactly 1, whose standard error is 0, an exact "
        "binomial test decides); key = where the runs' noise keys came from "
        "(`os`, or `seed (not secure)`: utility only); total = the label set's "
        "epsilon now, over every counted release of it in the privacy ledger "
        "(runs.csv's `epsilon_total_now`; a sweep's own runs are rehearsals, "
        "not counted, unless run with --release); pure, with the PLD epsilon at "
        "delta 1e-05 beside it where tighter, or where a Gaussian release leaves "
        "no pure total (inf). epsilon beside another parameter = the run's "
        "(eps, delta) from dp-accounting (Gaussian: its PLD epsilon at the "
        "delta shown); empty for a mechanism with no DP guarantee, whose "
        "ceiling and verdict are `-`.",
    ]
    return "\n".join(lines) + "\n"


DENOISE_NOTE = (
    "denoise = what the label party trained on: `none`, the noisy labels (the "
    "paper's GradPerturb); `posterior`, their posterior given a prior "
    "(post-processing: the same epsilon). The two runs of a pair share the "
    "noise key; each compares with the no-protection row of its own denoise "
    "value (the settings of its `[denoise.<value>]` table)."
)


def _given(denoise: str | None) -> list[str]:
    """The denoise cell of a table row (none when the runs all share one)."""
    return [] if denoise is None else [denoise]


def write_tables(rows: Sequence[Row], path: Path) -> Path:
    """Write :func:`tables_markdown` to ``path`` (mode ``0600``); return it.

    Rows without their standard errors and SDA verdict
    (:data:`~tpsl_flwr.experiments.sweep.stats.UNCERTAINTY_COLUMNS`) get them
    from their run's ``runs/<run>/results.json`` next to ``path``, where the
    sweep wrote it. The folder is made ``0700``.
    """
    rows = with_uncertainty(rows, path.parent / "runs")
    private_folder(path.parent)
    return write_private(path, tables_markdown(rows).encode())


def with_uncertainty(rows: Sequence[Row], runs_dir: Path) -> list[Row]:
    """``rows`` with each run's final-epoch standard errors and SDA verdict.

    A row that already has them, or whose results file is missing or
    unreadable, is kept as it is.
    """
    out = []
    for row in rows:
        results = runs_dir / str(row.get("run", "")) / RESULTS_FILE
        if "sda_verdict" in row or not row.get("run") or not results.is_file():
            out.append(dict(row))
            continue
        try:
            history = json.loads(results.read_text()).get("history") or [{}]
        except (OSError, ValueError):
            out.append(dict(row))
            continue
        attacks = history[-1].get("attack_auc") or {}
        out.append({**row, **attack_uncertainty(attacks)})
    return out


def write_report(rows: Sequence[Row], out_dir: Path) -> list[Path]:
    """Write every table and figure of ``rows`` into ``out_dir``; return the paths.

    ``tables.md``, ``tables.tex`` and ``summary.csv``
    (:mod:`~tpsl_flwr.experiments.sweep.latex`), then the figures as PNG,
    PDF and JSON (:func:`~tpsl_flwr.experiments.sweep.figures.write_plots`).
    Every file is the label party's: mode ``0600`` in ``out_dir`` made ``0700``.
    """
    rows = with_uncertainty(rows, out_dir / "runs")
    markdown = write_tables(rows, out_dir / "tables.md")
    text = markdown.read_text()
    files = [
        markdown,
        write_private(out_dir / "tables.tex", latex_tables(text).encode()),
        write_private(out_dir / "summary.csv", summary_csv(rows).encode()),
    ]
    return files + write_plots(rows, out_dir)
