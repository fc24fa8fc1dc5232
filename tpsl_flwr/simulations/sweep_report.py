"""Tables and plots of a sweep, shaped like the TPSL paper's (Yang et al.).

* Table 1: no protection — test AUC and the norm (NA), spectral (SA) and
  shortest-distance (SDA) attack AUCs;
* Tables 2-3 (and the Gaussian baseline): per epsilon (or sigma), test AUC and
  every attack AUC, with the ``e^eps / (1 + e^eps)`` ceiling;
* Figure 5: test AUC vs epsilon (Laplace, Discrete; spread over seeds, the
  no-protection level drawn) and test AUC vs SDA AUC (all three mechanisms).

Every cell is ``mean ± std`` over seeds (std with ``ddof = 0``; a lone seed
shows its value only). Multi-class datasets use test accuracy and SDA top-1.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tpsl_flwr.closed_forms import auc_bound

Row = dict[str, Any]

UTILITY_LABEL = {"test_auc": "test AUC", "test_accuracy": "test accuracy"}
PROTECTED = (
    ("laplace", "epsilon", "Table 2: Laplace GradPerturb"),
    ("discrete", "epsilon", "Table 3: Discrete GradPerturb (randomized response)"),
    ("gaussian", "sigma", "Gaussian baseline (no pure DP)"),
)


def utility_key(rows: Iterable[Row]) -> str:
    """``test_auc`` if any row has it (binary data), else ``test_accuracy``."""
    return (
        "test_auc"
        if any(r.get("test_auc") is not None for r in rows)
        else "test_accuracy"
    )


def sda_key(rows: Iterable[Row]) -> str:
    """``sda`` (binary) or ``sda_top1`` (multi-class)."""
    return "sda" if any(r.get("sda") is not None for r in rows) else "sda_top1"


def _values(rows: Iterable[Row], key: str) -> np.ndarray:
    out = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
    return np.asarray([v for v in out if math.isfinite(v)], dtype=float)


def mean_std(rows: Sequence[Row], key: str) -> tuple[float, float]:
    """Mean and std of ``key`` over ``rows`` (``nan`` when no row has it)."""
    values = _values(rows, key)
    if values.size == 0:
        return math.nan, math.nan
    return float(values.mean()), float(values.std())


def cell(rows: Sequence[Row], key: str) -> str:
    """``mean ± std`` of ``key`` (``-`` when no row has it).

    Examples
    --------
    >>> cell([{"sda": 0.7}, {"sda": 0.8}], "sda")
    '0.750 ± 0.050'
    >>> cell([{"sda": None}], "sda")
    '-'
    """
    values = _values(rows, key)
    if values.size == 0:
        return "-"
    if values.size == 1:
        return f"{values[0]:.3f}"
    return f"{values.mean():.3f} ± {values.std():.3f}"


def _by_dataset(rows: Iterable[Row]) -> dict[str, list[Row]]:
    groups: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        groups[str(row["dataset"])].append(row)
    return dict(groups)


def _levels(rows: Iterable[Row], param: str) -> dict[float, list[Row]]:
    groups: dict[float, list[Row]] = defaultdict(list)
    for row in rows:
        groups[float(row[param])].append(row)
    return dict(sorted(groups.items()))


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return lines


def tables_markdown(rows: Sequence[Row]) -> str:
    """The paper's Tables 1-3 (and the Gaussian baseline) as Markdown."""
    datasets = _by_dataset(rows)
    seeds = sorted({int(r["seed"]) for r in rows if r.get("seed") not in (None, "")})
    lines = [
        "# TPSL sweep",
        "",
        f"{len(rows)} runs; cells are mean ± std over seeds {seeds}. Attack AUCs "
        "are final-epoch, pooled over the training samples, on what party 0 "
        "received: NA = norm, SA = spectral, SDA = white-box shortest distance.",
        "",
        "## Table 1: no protection",
        "",
    ]
    body = []
    for name, group in datasets.items():
        plain = [r for r in group if r["mechanism"] == "none"]
        if plain:
            utility, sda = utility_key(group), sda_key(group)
            body.append(
                [name, UTILITY_LABEL[utility], cell(plain, utility)]
                + [cell(plain, k) for k in ("norm", "spectral", sda)]
            )
    header = ["dataset", "metric", "utility", "NA", "SA", "SDA"]
    lines += _table(header, body) if body else ["(no `none` runs)"]
    for mechanism, param, title in PROTECTED:
        body = []
        for name, group in datasets.items():
            runs = [r for r in group if r["mechanism"] == mechanism]
            utility, sda = utility_key(group), sda_key(group)
            for level, level_rows in _levels(runs, param).items():
                body.append(
                    [name, f"{level:g}", cell(level_rows, utility)]
                    + [cell(level_rows, k) for k in ("norm", "cosine", "spectral", sda)]
                    + [cell(level_rows, "auc_bound")]
                )
        if not body:
            continue
        header = [
            "dataset",
            param,
            "utility",
            "norm",
            "cosine",
            "spectral",
            "SDA",
            "ceiling",
        ]
        lines += ["", f"## {title}", "", *_table(header, body)]
    lines += [
        "",
        "utility = test AUC (binary) or test accuracy (multi-class, with SDA "
        "top-1); ceiling = e^eps / (1 + e^eps), the bound on any attack's AUC.",
    ]
    return "\n".join(lines) + "\n"


def write_tables(rows: Sequence[Row], path: Path) -> Path:
    """Write :func:`tables_markdown` to ``path``; return it."""
    path.write_text(tables_markdown(rows), encoding="utf-8")
    return path


def _series(rows: Sequence[Row], param: str, x_key: str, y_key: str) -> np.ndarray:
    """Per level of ``param``: x mean, x std, y mean, y std (one row each)."""
    points = []
    for level, group in _levels(rows, param).items():
        x_mean, x_std = (level, 0.0) if x_key == param else mean_std(group, x_key)
        y_mean, y_std = mean_std(group, y_key)
        points.append((x_mean, x_std, y_mean, y_std))
    return np.asarray(points, dtype=float).reshape(-1, 4)


def write_plots(rows: Sequence[Row], out_dir: Path) -> list[Path]:
    """Figure 5's two panels; return the PNG paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = _by_dataset(rows)
    width = max(1, len(datasets))
    colors = {"laplace": "C0", "discrete": "C1", "gaussian": "C2"}
    paths = [
        out_dir / "fig5_utility_vs_epsilon.png",
        out_dir / "fig5_utility_vs_sda.png",
    ]
    fig_eps, axes_eps = plt.subplots(1, width, figsize=(5 * width, 4), squeeze=False)
    fig_sda, axes_sda = plt.subplots(1, width, figsize=(5 * width, 4), squeeze=False)
    for ax_eps, ax_sda, (name, group) in zip(
        axes_eps[0], axes_sda[0], datasets.items(), strict=False
    ):
        utility, sda = utility_key(group), sda_key(group)
        plain = [r for r in group if r["mechanism"] == "none"]
        # Right axis of the epsilon panel: the SDA attack beside its ceiling.
        ax_attack = ax_eps.twinx() if sda == "sda" else None
        base, base_std = mean_std(plain, utility)
        for mechanism, param, _ in PROTECTED:
            runs = [r for r in group if r["mechanism"] == mechanism]
            if not runs:
                continue
            color = colors[mechanism]
            if param == "epsilon":
                pts = _series(runs, "epsilon", "epsilon", utility)
                ax_eps.plot(pts[:, 0], pts[:, 2], "o-", color=color, label=mechanism)
                ax_eps.fill_between(
                    pts[:, 0],
                    pts[:, 2] - pts[:, 3],
                    pts[:, 2] + pts[:, 3],
                    color=color,
                    alpha=0.2,
                )
                if ax_attack is not None:
                    attack = _series(runs, "epsilon", "epsilon", sda)
                    ax_attack.plot(
                        attack[:, 0],
                        attack[:, 2],
                        "x:",
                        color=color,
                        label=f"{mechanism} SDA AUC",
                    )
            pts = _series(runs, param, sda, utility)
            ax_sda.errorbar(
                pts[:, 0],
                pts[:, 2],
                xerr=pts[:, 1],
                yerr=pts[:, 3],
                fmt="o-",
                color=color,
                capsize=3,
                label=mechanism,
            )
        if not math.isnan(base):
            ax_eps.axhline(base, color="k", ls="--", label="no protection")
            ax_eps.axhspan(base - base_std, base + base_std, color="k", alpha=0.08)
            sda_mean, _ = mean_std(plain, sda)
            ax_sda.plot([sda_mean], [base], "k*", ms=12, label="no protection")
        if ax_attack is not None:
            eps_values = sorted(
                {
                    float(r["epsilon"])
                    for r in group
                    if r["mechanism"] in ("laplace", "discrete")
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
    for fig, path in zip((fig_eps, fig_sda), paths, strict=True):
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return paths
