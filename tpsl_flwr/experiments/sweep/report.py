"""Tables and plots of a sweep, shaped like the TPSL paper's (Yang et al.).

* Table 1: no protection — test AUC and the norm (NA), spectral (SA) and
  shortest-distance (SDA) attack AUCs;
* Tables 2-3 (and the Gaussian baseline): per epsilon (or sigma), the label
  set's total epsilon now (every release in the privacy ledger), test AUC and
  every attack AUC, with the ``e^eps / (1 + e^eps)`` ceiling;
* Figure 5: test AUC vs epsilon (Laplace, Discrete; spread over seeds, the
  no-protection level drawn) and test AUC vs SDA AUC (all three mechanisms);
* with a ``rows`` axis (some dataset at two sizes or more): utility vs
  training-set size (:mod:`tpsl_flwr.experiments.sweep.scale`);
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

import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tpsl_flwr._util.private_files import write_private
from tpsl_flwr.attacks.ceiling import SIGMAS_OF_TOLERANCE
from tpsl_flwr.experiments.audience import keep_private, private_folder
from tpsl_flwr.experiments.experiment import RESULTS_FILE
from tpsl_flwr.experiments.sweep.pairs import pairs_markdown
from tpsl_flwr.experiments.sweep.scale import plot_utility_vs_rows, scale_markdown
from tpsl_flwr.experiments.sweep.stats import (
    COLORS,
    PROTECTED,
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
    levels,
    markdown_table,
    mean_std,
    panels,
    report_groups,
    sda_key,
    total_cell,
    utility_key,
)
from tpsl_flwr.privacy.closed_forms import auc_bound
from tpsl_flwr.privacy.mechanisms import parameter_of


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
        "its value and its standard error, SE). Attack AUCs are final-epoch, "
        "pooled over the training samples, on what party 0 received: NA = "
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
    for mechanism, param, title in PROTECTED:
        body = []
        for name, group in datasets.items():
            runs = [r for r in group if r["mechanism"] == mechanism]
            utility, sda = utility_key(group), sda_key(group)
            for level, level_rows in levels(runs, param).items():
                for denoise, part in denoise_parts(level_rows, values):
                    body.append(
                        [name, f"{level:g}", *_given(denoise), cell(part, utility)]
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
        "no pure total (inf).",
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


def _series(rows: Sequence[Row], param: str, x_key: str, y_key: str) -> np.ndarray:
    """Per level of ``param``: x mean, x std, y mean, y std (one row each)."""
    points = []
    for level, group in levels(rows, param).items():
        x_mean, x_std = (level, 0.0) if x_key == param else mean_std(group, x_key)
        y_mean, y_std = mean_std(group, y_key)
        points.append((x_mean, x_std, y_mean, y_std))
    return np.asarray(points, dtype=float).reshape(-1, 4)


@dataclass(frozen=True)
class _Look:
    """How one denoise value's series look in a Figure 5 panel."""

    label: str  # appended to each label ("" without a denoise axis)
    line: str
    marker: str
    baseline: str
    star: str
    attack: str

    @classmethod
    def of(cls, denoise: str | None, index: int) -> _Look:
        """The ``index``-th denoise value's look (the first: as without the axis)."""
        at = index % 2
        return cls(
            label="" if denoise is None else f", denoise={denoise}",
            line=("-", "--")[at],
            marker="os"[at],
            baseline=("--", ":")[at],
            star="*P"[at],
            attack="x+"[at],
        )


def _plot_mechanism(
    axes: tuple[Any, Any, Any],
    runs: Sequence[Row],
    names: tuple[str, str],
    keys: tuple[str, str],
    look: _Look,
) -> None:
    """One mechanism's series: utility vs epsilon (and its SDA), utility vs SDA."""
    ax_eps, ax_attack, ax_sda = axes
    (mechanism, param), (utility, sda) = names, keys
    color, label = COLORS[mechanism], f"{mechanism}{look.label}"
    style = {"marker": look.marker, "ls": look.line, "color": color, "label": label}
    if param == "epsilon":
        pts = _series(runs, "epsilon", "epsilon", utility)
        ax_eps.plot(pts[:, 0], pts[:, 2], **style)
        low, high = pts[:, 2] - pts[:, 3], pts[:, 2] + pts[:, 3]
        ax_eps.fill_between(pts[:, 0], low, high, color=color, alpha=0.2)
        if ax_attack is not None:
            attack = _series(runs, "epsilon", "epsilon", sda)
            dotted = {"marker": look.attack, "ls": ":", "label": f"{label} SDA AUC"}
            ax_attack.plot(attack[:, 0], attack[:, 2], **{**style, **dotted})
    pts = _series(runs, param, sda, utility)
    ax_sda.errorbar(
        pts[:, 0], pts[:, 2], xerr=pts[:, 1], yerr=pts[:, 3], capsize=3, **style
    )


def _plot_baseline(
    ax_eps: Any, ax_sda: Any, plain: Sequence[Row], keys: tuple[str, str], look: _Look
) -> None:
    """The no-protection level: a line (and band) vs epsilon, a star vs SDA."""
    utility, sda = keys
    base, base_std = mean_std(plain, utility)
    if math.isnan(base):
        return
    label = f"no protection{look.label}"
    ax_eps.axhline(base, color="k", ls=look.baseline, label=label)
    ax_eps.axhspan(base - base_std, base + base_std, color="k", alpha=0.08)
    sda_mean, _ = mean_std(plain, sda)
    ax_sda.plot([sda_mean], [base], "k", marker=look.star, ms=12, ls="", label=label)


def _plot_ceiling(ax_attack: Any, group: Sequence[Row]) -> None:
    """The eps-DP ceiling on the SDA axis, over the epsilons of ``group``."""
    eps_values = sorted(
        {
            float(r["epsilon"])
            for r in group
            if parameter_of(r["mechanism"]) == "epsilon"
        }
    )
    if eps_values:
        grid = np.geomspace(min(eps_values), max(eps_values), 50)
        ax_attack.plot(
            grid,
            [auc_bound(e) for e in grid],
            color="red",
            lw=1,
            label="eps-DP ceiling (any attack)",
        )
        ax_attack.legend(fontsize=7, loc="lower right")
    ax_attack.set_ylabel("SDA attack AUC (dotted)")
    ax_attack.set_ylim(0.5, 1.02)


def write_plots(rows: Sequence[Row], out_dir: Path) -> list[Path]:
    """Figure 5's two panels (and utility vs rows, if swept); return the PNG paths.

    With runs that differ in ``denoise``, each mechanism (and no protection)
    has one series per denoise value, told apart by line style and marker.
    The PNGs plot test metrics and attack AUCs: mode ``0600``, in ``out_dir``
    made ``0700``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = report_groups(rows)
    values = denoise_values(rows)
    paths = [
        out_dir / "fig5_utility_vs_epsilon.png",
        out_dir / "fig5_utility_vs_sda.png",
    ]
    fig_eps, axes_eps = panels(plt, len(datasets), (5, 4))
    fig_sda, axes_sda = panels(plt, len(datasets), (5, 4))
    for ax_eps, ax_sda, (name, group) in zip(
        axes_eps, axes_sda, datasets.items(), strict=False
    ):
        keys = utility, sda = utility_key(group), sda_key(group)
        # Right axis of the epsilon panel: the SDA attack beside its ceiling.
        ax_attack = ax_eps.twinx() if sda == "sda" else None
        for index, (denoise, part) in enumerate(denoise_parts(group, values)):
            look = _Look.of(denoise, index)
            for mechanism, param, _ in PROTECTED:
                runs = [r for r in part if r["mechanism"] == mechanism]
                if runs:
                    axes = (ax_eps, ax_attack, ax_sda)
                    _plot_mechanism(axes, runs, (mechanism, param), keys, look)
            plain = [r for r in part if r["mechanism"] == "none"]
            _plot_baseline(ax_eps, ax_sda, plain, keys, look)
        if ax_attack is not None:
            _plot_ceiling(ax_attack, group)
        ax_eps.set_xscale("log", base=2)
        ax_eps.set_xlabel("epsilon")
        ax_sda.set_xlabel("SDA attack AUC" if sda == "sda" else "SDA attack top-1")
        for ax in (ax_eps, ax_sda):
            ax.set_ylabel(UTILITY_LABEL[utility])
            ax.set_title(name)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="upper left" if ax is ax_eps else "best")
    fig_eps.suptitle("Utility vs epsilon (mean ± std over seeds)")
    fig_sda.suptitle("Utility vs SDA attack (mean ± std over seeds)")
    private_folder(out_dir)
    for fig, path in zip((fig_eps, fig_sda), paths, strict=True):
        fig.tight_layout()
        image = io.BytesIO()
        fig.savefig(image, dpi=120, format="png")
        plt.close(fig)
        write_private(path, image.getvalue())
    scale = plot_utility_vs_rows(rows, out_dir / "utility_vs_rows.png")
    return paths if scale is None else [*paths, keep_private(scale)]
