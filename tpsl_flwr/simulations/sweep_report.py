"""Tables and plots of a sweep, shaped like the TPSL paper's (Yang et al.).

* Table 1: no protection — test AUC and the norm (NA), spectral (SA) and
  shortest-distance (SDA) attack AUCs;
* Tables 2-3 (and the Gaussian baseline): per epsilon (or sigma), test AUC and
  every attack AUC, with the ``e^eps / (1 + e^eps)`` ceiling;
* Figure 5: test AUC vs epsilon (Laplace, Discrete; spread over seeds, the
  no-protection level drawn) and test AUC vs SDA AUC (all three mechanisms);
* with a ``rows`` axis (some dataset at two sizes or more): utility vs
  training-set size, per configuration and its gap to no protection (a table
  and ``utility_vs_rows.png``).

Tables and panels go per dataset, or per dataset and size (``"synthetic-ctr,
200,000 rows"``) when a dataset was run at several sizes.

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
COLORS = {"laplace": "C0", "discrete": "C1", "gaussian": "C2"}
PANELS_PER_ROW = 3
# Tell apart the epsilons (or sigmas) of one mechanism in utility vs rows.
STYLES = (("o", "-"), ("s", "-."), ("^", ":"), ("D", (0, (5, 1))), ("v", "-"))
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


def _rows_of(row: Row) -> int:
    """A run's configured dataset size (0, the default, when not recorded)."""
    value = row.get("rows")
    return 0 if value in (None, "") else int(value)


def _by_size(rows: Iterable[Row]) -> dict[int, list[Row]]:
    groups: dict[int, list[Row]] = defaultdict(list)
    for row in rows:
        groups[_rows_of(row)].append(row)
    return dict(sorted(groups.items()))


def size_label(rows: int) -> str:
    """A dataset size for people.

    Examples
    --------
    >>> size_label(200000)
    '200,000 rows'
    >>> size_label(0)
    'default rows'
    """
    return f"{rows:,} rows" if rows > 0 else "default rows"


def _groups(rows: Iterable[Row]) -> dict[str, list[Row]]:
    """Rows per dataset, split per size where a dataset has several sizes.

    Examples
    --------
    >>> list(_groups([{"dataset": "a", "rows": 10}, {"dataset": "b", "rows": 0},
    ...               {"dataset": "b", "rows": 2000}]))
    ['a', 'b, default rows', 'b, 2,000 rows']
    """
    groups: dict[str, list[Row]] = {}
    for dataset, group in _by_dataset(rows).items():
        sizes = _by_size(group)
        if len(sizes) == 1:
            groups[dataset] = group
            continue
        for size, part in sizes.items():
            groups[f"{dataset}, {size_label(size)}"] = part
    return groups


def _scaled(rows: Iterable[Row]) -> dict[str, dict[int, list[Row]]]:
    """Per dataset run at two sizes or more: its rows per size."""
    out = {name: _by_size(group) for name, group in _by_dataset(rows).items()}
    return {name: sizes for name, sizes in out.items() if len(sizes) >= 2}


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
    """The paper's Tables 1-3 (and the Gaussian baseline) as Markdown.

    With several dataset sizes, also utility vs training-set size
    (:func:`scale_markdown`).
    """
    datasets = _groups(rows)
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
    lines += scale_markdown(rows)
    lines += [
        "",
        "utility = test AUC (binary) or test accuracy (multi-class, with SDA "
        "top-1); ceiling = e^eps / (1 + e^eps), the bound on any attack's AUC.",
    ]
    return "\n".join(lines) + "\n"


def _configurations(rows: Iterable[Row]) -> list[tuple[str, str, float]]:
    """Each protected (mechanism, parameter, level) present, in table order."""
    rows = list(rows)
    found = []
    for mechanism, param, _ in PROTECTED:
        runs = [r for r in rows if r["mechanism"] == mechanism]
        found += [(mechanism, param, level) for level in _levels(runs, param)]
    return found


def config_label(mechanism: str, param: str, level: float) -> str:
    """A protected configuration for people.

    Examples
    --------
    >>> config_label("laplace", "epsilon", 1.0)
    'laplace eps=1'
    >>> config_label("gaussian", "sigma", 0.25)
    'gaussian sigma=0.25'
    """
    return f"{mechanism} {'eps' if param == 'epsilon' else 'sigma'}={level:g}"


def _runs_of(
    rows: Iterable[Row], mechanism: str, param: str, level: float
) -> list[Row]:
    return [r for r in rows if r["mechanism"] == mechanism and float(r[param]) == level]


def gap_cell(rows: Sequence[Row], plain: Sequence[Row], key: str) -> str:
    """Mean of ``key`` over ``rows`` minus its mean over ``plain`` (signed).

    Examples
    --------
    >>> gap_cell([{"test_auc": 0.73}], [{"test_auc": 0.78}], "test_auc")
    '-0.050'
    >>> gap_cell([{"test_auc": 0.73}], [], "test_auc")
    '-'
    """
    gap = mean_std(rows, key)[0] - mean_std(plain, key)[0]
    return "-" if math.isnan(gap) else f"{gap:+.3f}"


def scale_markdown(rows: Sequence[Row]) -> list[str]:
    """``## Utility vs training-set size`` lines (none unless a dataset has 2+ sizes).

    One row per dataset and size: the ``none`` utility, then for each protected
    configuration its utility and its gap to ``none`` (difference of the means
    over seeds).
    """
    scaled = _scaled(rows)
    if not scaled:
        return []
    configs = _configurations(
        r for sizes in scaled.values() for part in sizes.values() for r in part
    )
    header = ["dataset", "rows", "none"]
    for config in configs:
        header += [config_label(*config), "gap"]
    body = []
    for name, sizes in scaled.items():
        utility = utility_key(r for part in sizes.values() for r in part)
        for size, part in sizes.items():
            plain = [r for r in part if r["mechanism"] == "none"]
            line = [name, f"{size:,}" if size else "default", cell(plain, utility)]
            for config in configs:
                runs = _runs_of(part, *config)
                line += [cell(runs, utility), gap_cell(runs, plain, utility)]
            body.append(line)
    return [
        "",
        "## Utility vs training-set size",
        "",
        *_table(header, body),
        "",
        "gap = the configuration's mean utility minus the `none` mean at that size.",
    ]


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


def _panels(plt: Any, count: int, size: tuple[float, float]) -> tuple[Any, list]:
    """A figure of ``count`` panels, at most :data:`PANELS_PER_ROW` a row."""
    count = max(1, count)
    cols = min(count, PANELS_PER_ROW)
    lines = math.ceil(count / cols)
    fig, axes = plt.subplots(
        lines, cols, figsize=(size[0] * cols, size[1] * lines), squeeze=False
    )
    flat = list(axes.flat)
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def write_plots(rows: Sequence[Row], out_dir: Path) -> list[Path]:
    """Figure 5's two panels (and utility vs rows, if swept); return the PNG paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = _groups(rows)
    paths = [
        out_dir / "fig5_utility_vs_epsilon.png",
        out_dir / "fig5_utility_vs_sda.png",
    ]
    fig_eps, axes_eps = _panels(plt, len(datasets), (5, 4))
    fig_sda, axes_sda = _panels(plt, len(datasets), (5, 4))
    for ax_eps, ax_sda, (name, group) in zip(
        axes_eps, axes_sda, datasets.items(), strict=False
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
            color = COLORS[mechanism]
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
    scale = plot_utility_vs_rows(rows, out_dir / "utility_vs_rows.png")
    return paths if scale is None else [*paths, scale]


def plot_utility_vs_rows(rows: Sequence[Row], path: Path) -> Path | None:
    """Utility vs dataset size, one panel per dataset run at several sizes.

    One line per configuration (``none`` black dashed; epsilons or sigmas of a
    mechanism told apart by marker and line style), error bars the std over
    seeds. Runs at
    the default size (``rows = 0``) are left out: it has no place on the log
    axis. Returns ``None`` (and writes nothing) unless a dataset has 2+ sizes.
    """
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scaled = _scaled(rows)
    if not scaled:
        return None
    fig, axes = _panels(plt, len(scaled), (6, 4.5))
    for ax, (name, sizes) in zip(axes, scaled.items(), strict=False):
        sized = {size: part for size, part in sizes.items() if size > 0}
        group = [r for part in sized.values() for r in part]
        utility = utility_key(group)
        plain = {
            s: [r for r in p if r["mechanism"] == "none"] for s, p in sized.items()
        }
        _errorbar(ax, plain, utility, fmt="k--", marker="o", label="none")
        drawn: dict[str, int] = defaultdict(int)
        for mechanism, param, level in _configurations(group):
            runs = {s: _runs_of(p, mechanism, param, level) for s, p in sized.items()}
            marker, line = STYLES[drawn[mechanism] % len(STYLES)]
            drawn[mechanism] += 1
            _errorbar(
                ax,
                runs,
                utility,
                marker=marker,
                ls=line,
                color=COLORS[mechanism],
                label=config_label(mechanism, param, level),
            )
        ax.set_xscale("log")
        ax.set_xticks(list(sized), [short_count(n) for n in sized])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("rows (dataset size, log scale)")
        ax.set_ylabel(UTILITY_LABEL[utility])
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.suptitle("Utility vs training-set size (mean ± std over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def short_count(count: int) -> str:
    """A count for an axis tick.

    Examples
    --------
    >>> [short_count(n) for n in (300, 20000, 1500, 3000000)]
    ['300', '20k', '1.5k', '3M']
    """
    if count >= 1_000_000:
        return f"{count / 1_000_000:g}M"
    if count >= 1_000:
        return f"{count / 1_000:g}k"
    return str(count)


def _errorbar(ax: Any, by_size: dict[int, list[Row]], key: str, **style: Any) -> None:
    """One line of ``key``'s mean ± std over seeds against the dataset size."""
    points = [(size, *mean_std(part, key)) for size, part in by_size.items() if part]
    points = [p for p in points if not math.isnan(p[1])]
    if not points:
        return
    x, y, err = np.asarray(points, dtype=float).T
    ax.errorbar(x, y, yerr=err, capsize=3, **style)
