"""What each sweep figure drew: its points, ceilings and levels, per panel.

:class:`Recorder` draws on matplotlib axes and keeps the numbers it drew, which
:mod:`.figures` writes beside each figure as a JSON sidecar (and tests read back:
labels, ceilings, error bars).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["OFFSETS", "Point", "Recorder"]

OFFSETS = ((5, 5), (5, -11), (-30, 5), (-30, -11))
"""Where a panel's series put their point labels, in points (one each, in turn)."""


@dataclass(frozen=True)
class Point:
    """One drawn point: where, its error bars, its label and what the bars are."""

    label: str
    x: float
    xerr: float
    y: float
    yerr: float
    runs: int
    spread: str  # SEEDS, OWN_SE, or "" (one run that reports no SE)


class Recorder:
    """Draws on matplotlib axes and keeps, per panel, the numbers it drew."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []

    def panel(self, title: str, x_label: str, y_label: str) -> dict[str, Any]:
        """A new panel's record (its series are appended as they are drawn)."""
        found: dict[str, Any] = {
            "title": title,
            "x_label": x_label,
            "y_label": y_label,
            "series": [],
        }
        self.panels.append(found)
        return found

    @staticmethod
    def points(
        ax: Any,
        panel: dict[str, Any],
        name: str,
        points: Sequence[Point],
        labelled: bool = True,
        offset: tuple[int, int] | None = None,
        **style: Any,
    ) -> None:
        """A series with x and y error bars, each point annotated with its label.

        ``offset``: where the labels go, in points (default: by the series'
        place in the panel, so that series put theirs apart).
        """
        points = [p for p in points if math.isfinite(p.x) and math.isfinite(p.y)]
        if not points:
            return
        x, y = [p.x for p in points], [p.y for p in points]
        xerr = [0.0 if math.isnan(p.xerr) else p.xerr for p in points]
        yerr = [0.0 if math.isnan(p.yerr) else p.yerr for p in points]
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, capsize=3, label=name, **style)
        # Series of one panel put their labels at different offsets.
        if offset is None:
            offset = OFFSETS[len(panel["series"]) % len(OFFSETS)]
        if labelled:
            for p in points:
                ax.annotate(
                    p.label,
                    (p.x, p.y),
                    textcoords="offset points",
                    xytext=offset,
                    fontsize=7,
                    color=style.get("color", "k"),
                )
        panel["series"].append(
            {"name": name, "kind": "points", "points": [_recorded(p) for p in points]}
        )

    @staticmethod
    def line(
        ax: Any,
        panel: dict[str, Any],
        name: str,
        xy: tuple[Sequence[float], Sequence[float]],
        **style: Any,
    ) -> None:
        """A ceiling: a line without error bars."""
        x, y = (list(map(float, v)) for v in xy)
        ax.plot(x, y, label=name, gid="ceiling", **style)
        panel["series"].append({"name": name, "kind": "ceiling", "x": x, "y": y})

    @staticmethod
    def level(
        ax: Any, panel: dict[str, Any], name: str, y: float, err: float, **style: Any
    ) -> None:
        """A reference level (no protection): a horizontal line, its band."""
        err = 0.0 if math.isnan(err) else err
        ax.axhline(y, label=name, gid="baseline", **style)
        if err > 0:
            ax.axhspan(y - err, y + err, color=style.get("color", "k"), alpha=0.08)
        panel["series"].append({"name": name, "kind": "baseline", "y": y, "err": err})


def _recorded(point: Point) -> dict[str, Any]:
    """A point for the JSON sidecar (a missing error bar as None)."""
    return {
        k: None if isinstance(v, float) and math.isnan(v) else v
        for k, v in asdict(point).items()
    }
