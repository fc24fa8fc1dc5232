"""The sweep's figures, as a paper uses them: error bars, labels, ceilings.

Three figures, one panel per dataset (per dataset and size with a ``rows``
axis), each written as PNG and PDF with a JSON sidecar of the numbers drawn
(``<figure>.json``: every point, its label, its error bar and what that bar
is, the ceiling, the caption):

* ``fig5_utility_vs_epsilon``: utility against epsilon, every mechanism that
  has one: the pure ``(eps, 0)`` ones at their epsilon, the Gaussian baseline
  at its ``(eps, delta)`` from dp-accounting's PLD accountant (its points
  labelled with sigma); the no-protection level as a line with its band.
  A mechanism with no DP guarantee (its epsilon is None) has no place here;
  the caption names it.
* ``fig5_utility_vs_sda``: utility against the white-box shortest-distance
  attack (SDA), every mechanism, no DP guarantee included (labelled by its
  own parameter), with each eps-DP mechanism's ceiling curve: its utilities
  at ``e^eps / (1 + e^eps)`` (the prior-aware ceiling where the top model
  trained on the posterior), the AUC no attack can pass (Yang et al., TPSL,
  Theorem 1 and Section 5).
* ``attacks_vs_epsilon``: one panel per mechanism: the norm (NA), spectral
  (SA) and SDA attack AUCs against epsilon (or the mechanism's own parameter
  where it has no epsilon), each with its error bar, beside the ceiling and
  the no-protection AUCs: the paper's "false sense of security" (NA and SA
  near 0.5 where SDA is not).

Every point is labelled with its epsilon, sigma or parameter. Error bars are
the standard deviation over seeds where a point has several runs, else the
run's own standard error (Hanley-McNeil over the test set for a test AUC,
binomial for an accuracy, over the attacked samples for an attack AUC); the
caption says which, and at which epoch (:data:`~.stats.EPOCHS`) the values
are. No panel has a second y axis.

The figures plot clean-label statistics: every file is the label party's
(mode ``0600``, in the sweep's folder made ``0700``).
"""

from __future__ import annotations

import io
import json
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tpsl_flwr._util.private_files import write_private
from tpsl_flwr.experiments.audience import keep_private, private_folder
from tpsl_flwr.experiments.sweep.figure_data import Point, Recorder
from tpsl_flwr.experiments.sweep.guarantee import (
    APPROX_DP,
    NO_DP,
    PURE_DP,
    color_of,
    epoch_note,
    protected,
)
from tpsl_flwr.experiments.sweep.scale import plot_utility_vs_rows
from tpsl_flwr.experiments.sweep.stats import (
    OWN_SE,
    SEEDS,
    UTILITY_LABEL,
    Row,
    denoise_parts,
    denoise_values,
    estimate,
    levels,
    panels,
    report_groups,
    sda_key,
    utility_key,
    values_of,
)
from tpsl_flwr.privacy.closed_forms import auc_bound

__all__ = ["FIGURES", "Point", "build_figures", "write_plots"]

FIGURES = ("fig5_utility_vs_epsilon", "fig5_utility_vs_sda", "attacks_vs_epsilon")
"""The figures' names (each written as ``.png``, ``.pdf`` and ``.json``)."""
ATTACKS = (("norm", "NA", "C4"), ("spectral", "SA", "C5"), ("sda", "SDA", "C3"))
"""The attacks of ``attacks_vs_epsilon``: row key, short name, colour."""
"""Where a series' point labels go, in points from the point."""
SIGMA = "\u03c3"
SYMBOLS = {"epsilon": "ε", "sigma": SIGMA, "marvell_power": "P"}


def _label(param: str, level: float, mechanism: str) -> str:
    """A point's label: ``ε=1``, sigma's symbol ``=0.5``, ``power=4``.

    A mechanism without a parameter is labelled with its name.
    """
    if math.isnan(level):
        return mechanism
    return f"{SYMBOLS.get(param, param)}={level:g}"


def _x_epsilon(rows: Sequence[Row]) -> float:
    """The epsilon a level of runs sits at: pure, else its ``(eps, delta)`` one."""
    for key in ("epsilon", "epsilon_at_delta"):
        values = values_of(rows, key)
        if values.size:
            return float(values.mean())
    return math.nan


def _guarantee(rows: Sequence[Row]) -> str:
    """The guarantee of a mechanism's runs (:data:`~.stats.NO_DP` if any says so)."""
    said = {str(r.get("guarantee") or "") for r in rows}
    if NO_DP in said:
        return NO_DP
    if said <= {PURE_DP, ""} and values_of(rows, "epsilon").size:
        return PURE_DP
    if APPROX_DP in said or values_of(rows, "epsilon_at_delta").size:
        return APPROX_DP
    return PURE_DP if values_of(rows, "epsilon").size else NO_DP


def _ceiling(rows: Sequence[Row]) -> float:
    """The runs' plain ε ceiling ``e^eps / (1 + e^eps)`` (not the prior-aware one)."""
    for key in ("auc_bound_without_prior", "auc_bound"):
        bounds = values_of(rows, key)
        if bounds.size:
            return float(bounds.mean())
    eps = values_of(rows, "epsilon")
    return auc_bound(float(eps.mean())) if eps.size else math.nan


def _level_points(
    runs: Sequence[Row], param: str, x_key: str | None, y_key: str
) -> list[Point]:
    """One point per level of ``param``, its label the level.

    x is the level's epsilon (``x_key`` None), the level (``x_key`` is
    ``param``) or ``x_key``'s value; y is ``y_key``'s.
    """
    out = []
    for level, part in levels(runs, param).items():
        if x_key is None:
            x, xerr, x_spread = _x_epsilon(part), 0.0, ""
        elif x_key == param:
            # A mechanism without a parameter: its one level at x = 0.
            x, xerr, x_spread = (0.0 if math.isnan(level) else level), 0.0, ""
        else:
            x, xerr, x_spread = estimate(part, x_key)
        y, yerr, spread = estimate(part, y_key)
        label = _label(param, level, str(part[0]["mechanism"]))
        out.append(Point(label, x, xerr, y, yerr, len(part), spread or x_spread))
    return out


def _suffix(denoise: str | None) -> str:
    return "" if denoise is None else f", denoise={denoise}"


def _line(index: int) -> str:
    return ("-", "--")[index % 2]


def _utility_vs_epsilon(
    ax: Any, rec: Recorder, title: str, group: Sequence[Row]
) -> list[str]:
    """One panel of utility vs epsilon; returns the mechanisms left out."""
    utility = utility_key(group)
    panel = rec.panel(title, "epsilon", UTILITY_LABEL[utility])
    left_out = []
    values = denoise_values(group)
    for index, (denoise, part) in enumerate(denoise_parts(group, values)):
        for mechanism, param, _ in protected(part):
            runs = [r for r in part if r["mechanism"] == mechanism]
            guarantee = _guarantee(runs)
            if guarantee == NO_DP:
                left_out.append(mechanism)
                continue
            name = mechanism + _suffix(denoise)
            if guarantee == APPROX_DP:
                delta = values_of(runs, "delta")
                name += f" (ε at δ={delta[0]:g})" if delta.size else " (ε, δ)"
            style: dict[str, Any] = {"marker": "os"[index % 2], "ls": _line(index)}
            points = _level_points(runs, param, None, utility)
            rec.points(ax, panel, name, points, color=color_of(mechanism), **style)
        plain = [r for r in part if r["mechanism"] == "none"]
        base, err, _ = estimate(plain, utility)
        if math.isfinite(base):
            name = "no protection" + _suffix(denoise)
            style = {
                "color": "k",
                "ls": ("--", ":")[index % 2],
                "lw": 1,
            }
            rec.level(ax, panel, name, base, err, **style)
    ax.set_xscale("log", base=2)
    return list(dict.fromkeys(left_out))


def _utility_vs_sda(ax: Any, rec: Recorder, title: str, group: Sequence[Row]) -> None:
    """One panel of utility vs SDA, with each eps-DP mechanism's ceiling curve."""
    utility, sda = utility_key(group), sda_key(group)
    x_label = "SDA attack AUC" if sda == "sda" else "SDA attack top-1"
    panel = rec.panel(title, x_label, UTILITY_LABEL[utility])
    values = denoise_values(group)
    for index, (denoise, part) in enumerate(denoise_parts(group, values)):
        for mechanism, param, _ in protected(part):
            runs = [r for r in part if r["mechanism"] == mechanism]
            color, name = color_of(mechanism), mechanism + _suffix(denoise)
            style: dict[str, Any] = {
                "marker": "os"[index % 2],
                "ls": _line(index),
                "color": color,
            }
            if _guarantee(runs) == NO_DP:
                name += " (no DP guarantee)"
            points = _level_points(runs, param, sda, utility)
            # Labels on the left: a point's ceiling tick is on its right.
            left = ((-30, 5), (-30, -11))[len(panel["series"]) % 2]
            rec.points(ax, panel, name, points, offset=left, **style)
            if sda == "sda" and _guarantee(runs) == PURE_DP:
                ceiling = [
                    (_ceiling(p), estimate(p, utility)[0])
                    for p in levels(runs, param).values()
                ]
                ceiling = [c for c in ceiling if math.isfinite(c[0] + c[1])]
                if ceiling:
                    xs, ys = zip(*ceiling, strict=True)
                    rec.line(
                        ax,
                        panel,
                        f"{name}: ε ceiling",
                        (xs, ys),
                        color=color,
                        ls=":",
                        marker="|",
                        ms=16,
                        mew=2.5,
                        lw=1,
                    )
        plain = [r for r in part if r["mechanism"] == "none"]
        x, xerr, _ = estimate(plain, sda)
        y, yerr, spread = estimate(plain, utility)
        star = Point("no protection", x, xerr, y, yerr, len(plain), spread)
        style = {
            "color": "k",
            "marker": "*P"[index % 2],
            "ms": 12,
            "ls": "",
        }
        rec.points(ax, panel, "no protection" + _suffix(denoise), [star], **style)
    ax.set_xlim(right=1.02)


def _attack_panels(group: Sequence[Row]) -> list[tuple[str | None, str, str, list]]:
    """``(denoise, mechanism, param, runs)`` of each panel of the attack figure."""
    values = denoise_values(group)
    out = []
    for denoise, part in denoise_parts(group, values):
        for mechanism, param, _ in protected(part):
            runs = [r for r in part if r["mechanism"] == mechanism]
            out.append((denoise, mechanism, param, runs))
    return out


def _attacks_panel(
    ax: Any,
    rec: Recorder,
    title: str,
    part: tuple[str | None, str, str, list],
    plain: Sequence[Row],
) -> None:
    """NA, SA and SDA against epsilon (or the parameter) for one mechanism."""
    denoise, mechanism, param, runs = part
    guarantee = _guarantee(runs)
    if guarantee == NO_DP:
        x_label, x_key = param, param
    else:
        x_label = "epsilon" if guarantee == PURE_DP else "epsilon at delta"
        x_key = None
    heading = f"{title}: {mechanism}{_suffix(denoise)}"
    heading += f" ({guarantee})" if guarantee != PURE_DP else ""
    panel = rec.panel(heading, x_label, "attack AUC")
    attacks = (
        ATTACKS
        if any(r.get("sda") is not None for r in runs)
        else (("sda_top1", "SDA top-1", "C3"),)
    )
    for key, short, color in attacks:
        points = _level_points(runs, param, x_key, key)
        # Labels on the SDA points only: the three attacks share their x.
        labelled = key.startswith("sda")
        style: dict[str, Any] = {"color": color, "marker": "o", "ls": "-"}
        rec.points(ax, panel, short, points, labelled=labelled, **style)
        base, err, _ = estimate(plain, key)
        if math.isfinite(base) and points:
            style = {"color": color, "ls": "--", "lw": 1}
            rec.level(ax, panel, f"{short}, no protection", base, err, **style)
    if guarantee == PURE_DP and attacks == ATTACKS:
        eps = values_of(runs, "epsilon")
        if eps.size:
            grid = np.geomspace(eps.min(), eps.max(), 50) if eps.min() > 0 else eps
            ceiling = [auc_bound(float(e)) for e in grid]
            style = {
                "color": "k",
                "lw": 1.5,
                "marker": "_",
                "ms": 14,
                "markevery": [0, -1],
            }
            name = "ε-DP ceiling (any attack)"
            rec.line(ax, panel, name, (list(grid), ceiling), **style)
        if values_of(runs, "auc_bound_without_prior").size:
            aware = [
                (float(level), float(values_of(part, "auc_bound").mean()))
                for level, part in levels(runs, param).items()
            ]
            xs, ys = zip(*aware, strict=True)
            style = {"color": "k", "ls": "--", "marker": "_", "ms": 12, "lw": 1}
            rec.line(ax, panel, "prior-aware ceiling", (xs, ys), **style)
    if guarantee != NO_DP:
        ax.set_xscale("log", base=2)
    ax.set_ylim(top=1.02)


def _caption(rec: Recorder, rows: Sequence[Row], extra: Sequence[str]) -> str:
    """What the error bars are, at which epoch the values are, and notes."""
    spreads: dict[str, list[int]] = {SEEDS: [], OWN_SE: [], "": []}
    for panel in rec.panels:
        for series in panel["series"]:
            for p in series.get("points", []):
                spreads[p["spread"]].append(p["runs"])
    seeds, own, bare = spreads[SEEDS], spreads[OWN_SE], spreads[""]
    if seeds and not own:
        low, high = min(seeds), max(seeds)
        runs = f"{low}" if low == high else f"{low}-{high}"
        bars = f"Error bars: ± std over seeds ({runs} runs a point)."
    elif own and not seeds:
        bars = (
            "Error bars: ± each run's own standard error (one run a point; "
            "Hanley-McNeil over the test set or the attacked samples)."
        )
    elif seeds and own:
        bars = (
            f"Error bars: ± std over seeds where a point has several runs "
            f"({len(seeds)} points), else the run's own standard error "
            f"({len(own)} points)."
        )
    else:
        bars = "No error bars: every point is one run that reports no SE."
    if bare and (seeds or own):
        bars += f" {len(bare)} point(s) of one run without an SE have none."
    return " ".join([f"Values at each run's {epoch_note(rows)}.", bars, *extra])


def build_figures(rows: Sequence[Row]) -> dict[str, tuple[Any, dict[str, Any]]]:
    """The three figures of :data:`FIGURES`, each with the numbers it drew.

    Returns
    -------
    dict
        Per figure name: the matplotlib figure (the caller saves and closes
        it) and its data: ``caption``, ``epoch`` and ``panels`` (each with
        its ``series``: ``points`` with their labels and error bars, or a
        ``ceiling`` or ``baseline`` line).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = report_groups(rows)
    out: dict[str, tuple[Any, dict[str, Any]]] = {}

    fig, axes = panels(plt, len(groups), (5.5, 4.5), layout="constrained")
    rec, left_out = Recorder(), []
    for ax, (name, group) in zip(axes, groups.items(), strict=False):
        left_out += _utility_vs_epsilon(ax, rec, name, group)
        _finish(ax, name, "epsilon (log scale)", UTILITY_LABEL[utility_key(group)])
    notes = [
        "Gaussian: at its (ε, δ) from dp-accounting's PLD accountant, "
        f"labelled with {SIGMA}.",
    ]
    for mechanism in dict.fromkeys(left_out):
        notes.append(f"Not shown: {mechanism} ({NO_DP}; see utility vs SDA).")
    out[FIGURES[0]] = _done(fig, rec, rows, "Utility vs ε", notes)

    fig, axes = panels(plt, len(groups), (5.5, 4.5), layout="constrained")
    rec = Recorder()
    for ax, (name, group) in zip(axes, groups.items(), strict=False):
        _utility_vs_sda(ax, rec, name, group)
        sda = "SDA attack AUC" if sda_key(group) == "sda" else "SDA attack top-1"
        _finish(ax, name, sda, UTILITY_LABEL[utility_key(group)])
    notes = [
        "Dotted curves: each ε-DP mechanism's utility at its ceiling "
        "e^ε/(1+e^ε), the AUC no attack can pass (where the top model trained "
        "on the posterior, the tables' verdicts use the higher prior-aware one).",
    ]
    no_dp = [
        m
        for m, _, _ in protected(rows)
        if _guarantee([r for r in rows if r["mechanism"] == m]) == NO_DP
    ]
    if no_dp:
        notes.append(f"{', '.join(no_dp)}: {NO_DP}, labelled with their own parameter.")
    out[FIGURES[1]] = _done(fig, rec, rows, "Utility vs SDA attack", notes)

    parts = [
        (
            name,
            part,
            [
                r
                for r in group
                if r["mechanism"] == "none"
                and (part[0] is None or r.get("denoise") == part[0])
            ],
        )
        for name, group in groups.items()
        for part in _attack_panels(group)
    ]
    fig, axes = panels(plt, len(parts), (5, 4), layout="constrained")
    rec = Recorder()
    for ax, (name, part, plain) in zip(axes, parts, strict=False):
        _attacks_panel(ax, rec, name, part, plain)
        panel = rec.panels[-1]
        _finish(ax, panel["title"], panel["x_label"], "attack AUC")
    notes = [
        "NA = norm, SA = spectral, SDA = white-box shortest distance; dashed: "
        "no protection; black: the ε-DP ceiling on any attack's AUC (dashed "
        "black, where the top model trained on the posterior: the prior-aware "
        "ceiling the tables' verdicts use).",
    ]
    out[FIGURES[2]] = _done(fig, rec, rows, "Attack AUCs vs ε", notes)
    return out


def _finish(ax: Any, title: str, x_label: str, y_label: str) -> None:
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.grid(alpha=0.3)


def _done(
    fig: Any, rec: Recorder, rows: Sequence[Row], title: str, notes: list[str]
) -> tuple[Any, dict[str, Any]]:
    """Title, one legend beside the panels and the caption under them."""
    caption = _caption(rec, rows, notes)
    kind = "last" if epoch_note(rows) == "last epoch" else "best"
    fig.suptitle(f"{title} ({kind} epoch)", x=0.02, ha="left")
    handles: dict[str, Any] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(
            handles.values(), handles.keys(), loc="outside right upper", fontsize=7
        )
    width = int(fig.get_size_inches()[0] * 17)
    fig.supxlabel(textwrap.fill(caption, width), fontsize=7, x=0.0, ha="left")
    data = {"title": title, "caption": caption, "epoch": epoch_note(rows)}
    return fig, {**data, "panels": rec.panels}


def write_plots(rows: Sequence[Row], out_dir: Path) -> list[Path]:
    """Write every figure as PNG, PDF and JSON (and utility vs rows, if swept).

    Returns the paths written: per figure of :data:`FIGURES`, its ``.png``,
    ``.pdf`` and ``.json``; then ``utility_vs_rows.png`` and ``.pdf`` when a
    dataset was run at several sizes. Every file is mode ``0600``, in
    ``out_dir`` made ``0700``.
    """
    import matplotlib.pyplot as plt

    private_folder(out_dir)
    paths = []
    for name, (fig, data) in build_figures(rows).items():
        for suffix in ("png", "pdf"):
            image = io.BytesIO()
            fig.savefig(image, dpi=150, format=suffix)
            paths.append(write_private(out_dir / f"{name}.{suffix}", image.getvalue()))
        plt.close(fig)
        text = json.dumps(data, indent=1, default=_plain, allow_nan=False)
        paths.append(write_private(out_dir / f"{name}.json", text.encode()))
    scale = plot_utility_vs_rows(rows, out_dir / "utility_vs_rows.png")
    if scale is not None:
        paths += [keep_private(scale), keep_private(scale.with_suffix(".pdf"))]
    return paths


def _plain(value: Any) -> Any:
    """JSON for numpy numbers."""
    return float(value) if isinstance(value, np.floating | np.integer) else str(value)
