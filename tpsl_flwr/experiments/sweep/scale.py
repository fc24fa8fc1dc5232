"""Utility vs training-set size: a sweep with a ``rows`` axis.

When some dataset was run at two sizes or more, the report adds a table of
each protected configuration's utility and its gap to no protection per size,
and ``utility_vs_rows.png``. Label noise of fixed scale averages out over more
samples, so this is how a user reads what an epsilon costs on their data size.
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tpsl_flwr._util.private_files import write_private
from tpsl_flwr.experiments.sweep.guarantee import (
    color_of,
    protected,
)
from tpsl_flwr.experiments.sweep.stats import (
    UTILITY_LABEL,
    Row,
    cell,
    level_of,
    levels,
    markdown_table,
    mean_std,
    panels,
    sized_datasets,
    utility_key,
)

# Tell apart the epsilons (or sigmas) of one mechanism in utility vs rows.
STYLES = (("o", "-"), ("s", "-."), ("^", ":"), ("D", (0, (5, 1))), ("v", "-"))


def _configurations(rows: Iterable[Row]) -> list[tuple[str, str, float]]:
    """Each protected (mechanism, parameter, level) present, in table order."""
    rows = list(rows)
    found = []
    for mechanism, param, _ in protected(rows):
        runs = [r for r in rows if r["mechanism"] == mechanism]
        found += [(mechanism, param, level) for level in levels(runs, param)]
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
    return [
        r for r in rows if r["mechanism"] == mechanism and level_of(r, param) == level
    ]


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
    scaled = sized_datasets(rows)
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
        *markdown_table(header, body),
        "",
        "gap = the configuration's mean utility minus the `none` mean at that size.",
    ]


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

    scaled = sized_datasets(rows)
    if not scaled:
        return None
    fig, axes = panels(plt, len(scaled), (6, 4.5))
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
                color=color_of(mechanism),
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
    for suffix in ("png", "pdf"):
        image = io.BytesIO()
        fig.savefig(image, dpi=120, format=suffix)
        write_private(path.with_suffix(f".{suffix}"), image.getvalue())
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
