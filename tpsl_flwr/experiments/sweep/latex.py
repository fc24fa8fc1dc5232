r"""A sweep's tables for a paper: LaTeX beside the Markdown, and a summary CSV.

``tables.tex`` is ``tables.md`` in LaTeX, table for table (each a ``table``
float captioned with its title, in ``booktabs`` rules; the notes as
paragraphs): written from the one Markdown text, so the two never disagree.
``\input{tables.tex}`` needs ``\usepackage{booktabs}``.

``summary.csv`` has one row per configuration of the tables (dataset or
dataset and size, denoise value, mechanism and level): its guarantee, how
many runs it has, and for the utility and every attack the value, its error
bar and what that bar is (std over seeds, or a lone run's own standard
error; :func:`~tpsl_flwr.experiments.sweep.stats.estimate`), with the SDA
ceiling: the numbers behind the figures, for a plotting tool of one's own.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Sequence

from tpsl_flwr.experiments.sweep.guarantee import (
    epsilon_cell,
    protected,
)
from tpsl_flwr.experiments.sweep.stats import (
    UNCERTAIN_ATTACKS,
    Row,
    denoise_parts,
    denoise_values,
    estimate,
    levels,
    report_groups,
    utility_key,
    values_of,
)

__all__ = ["SUMMARY_COLUMNS", "latex_tables", "summary_csv", "tex_escape"]

_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\^{}",
    "±": r"$\pm$",
    "ε": r"$\varepsilon$",
    "δ": r"$\delta$",
    "\u03c3": r"$\sigma$",
    "≥": r"$\geq$",
    "≤": r"$\leq$",
    "—": "---",
    "\u2013": "--",
}


def tex_escape(text: str) -> str:
    r"""``text`` as LaTeX: specials escaped, ```code``` as ``\texttt``.

    Examples
    --------
    >>> print(tex_escape("0.750 ± 0.050 at e^eps, `os` & 5%"))
    0.750 $\pm$ 0.050 at e\^{}eps, \texttt{os} \& 5\%
    """
    parts = re.split(r"`([^`]*)`", text)
    out = []
    for index, part in enumerate(parts):
        escaped = "".join(_SPECIAL.get(ch, ch) for ch in part)
        out.append(rf"\texttt{{{escaped}}}" if index % 2 else escaped)
    return "".join(out)


def _cells(line: str) -> list[str]:
    """The cells of a Markdown table line."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _tabular(title: str, table: list[str]) -> list[str]:
    """A Markdown table (header, rule, body lines) as a captioned float."""
    header, body = _cells(table[0]), [_cells(line) for line in table[2:]]
    return [
        r"\begin{table}[htbp]",
        r"\centering\scriptsize",
        rf"\caption{{{tex_escape(title)}}}",
        r"\begin{tabular}{" + "l" * len(header) + "}",
        r"\toprule",
        " & ".join(tex_escape(c) for c in header) + r" \\",
        r"\midrule",
        *(" & ".join(tex_escape(c) for c in row) + r" \\" for row in body),
        r"\bottomrule",
        r"\end{tabular}",
        r"\end{table}",
    ]


def latex_tables(markdown: str) -> str:
    r"""The tables and notes of a sweep's ``tables.md`` as LaTeX.

    ``# title`` becomes a comment, ``## title`` the caption of the table
    under it, a Markdown table a ``tabular`` with ``booktabs`` rules, any
    other line a paragraph.

    Examples
    --------
    >>> tex = latex_tables("## Table 1: x\n\n| a | b_c |\n|---|---|\n| 1 | 2 |\n")
    >>> print(tex.splitlines()[3])
    \caption{Table 1: x}
    >>> r"a & b\_c \\" in tex and r"1 & 2 \\" in tex
    True
    """
    out = ["% A TPSL sweep's tables (tpsl-flwr sweep); needs \\usepackage{booktabs}"]
    title = ""
    table: list[str] = []
    for line in [*markdown.splitlines(), ""]:
        if line.startswith("|"):
            table.append(line)
            continue
        if table:
            out += _tabular(title, table)
            table, title = [], ""
        if line.startswith("## "):
            title = line[3:].strip()
        elif line.startswith("# "):
            out.append("% " + line[2:].strip())
        elif line.strip():
            out += ["", tex_escape(line.strip()), ""]
    return "\n".join(out) + "\n"


SUMMARY_COLUMNS = (
    "group",
    "dataset",
    "rows",
    "denoise",
    "mechanism",
    "parameter",
    "level",
    "guarantee",
    "epsilon",
    "runs",
    "seeds",
    "epoch",
    "utility_metric",
    "utility",
    "utility_err",
    "utility_err_is",
    *(f"{a}{end}" for a in UNCERTAIN_ATTACKS for end in ("", "_err", "_err_is")),
    "ceiling",
    "ceiling_eps",
)
"""The columns of ``summary.csv`` (``ceiling``: the one the SDA verdict used,
prior-aware where the top model trained on the posterior; ``ceiling_eps``:
the plain ``e^eps / (1 + e^eps)``)."""


def _number(value: float) -> str:
    return "" if math.isnan(value) else f"{value:.6g}"


def _summary_row(name: str, denoise: str | None, part: Sequence[Row]) -> dict:
    """One configuration's cells: its guarantee, runs, values and error bars."""
    first = part[0]
    utility = utility_key(part)
    seeds = sorted({str(r.get("seed")) for r in part if r.get("seed") is not None})
    row = {
        "group": name,
        "dataset": first.get("dataset"),
        "rows": first.get("rows"),
        "denoise": denoise or "",
        "mechanism": first.get("mechanism"),
        "guarantee": first.get("guarantee"),
        "epsilon": epsilon_cell(part),
        "runs": len(part),
        "seeds": " ".join(seeds),
        "epoch": "; ".join(dict.fromkeys(str(r.get("epoch_rule") or "") for r in part)),
        "utility_metric": utility,
    }
    value, err, spread = estimate(part, utility)
    row.update(utility=_number(value), utility_err=_number(err), utility_err_is=spread)
    for attack in UNCERTAIN_ATTACKS:
        value, err, spread = estimate(part, attack)
        row[attack] = _number(value)
        row[f"{attack}_err"] = _number(err)
        row[f"{attack}_err_is"] = spread if not math.isnan(value) else ""
    bounds = values_of(part, "auc_bound")
    row["ceiling"] = _number(float(bounds.mean())) if bounds.size else ""
    plain = values_of(part, "auc_bound_without_prior")
    row["ceiling_eps"] = _number(float(plain.mean())) if plain.size else row["ceiling"]
    return row


def summary_csv(rows: Sequence[Row]) -> str:
    """``summary.csv``: one row per configuration (:data:`SUMMARY_COLUMNS`).

    Examples
    --------
    >>> text = summary_csv([
    ...     {"dataset": "d", "mechanism": "laplace", "epsilon": 1.0, "seed": s,
    ...      "test_auc": auc, "sda": 0.7, "guarantee": "(eps, 0)-DP"}
    ...     for s, auc in ((0, 0.70), (1, 0.72))])
    >>> line = next(csv.DictReader(io.StringIO(text)))
    >>> line["utility"], line["utility_err"], line["utility_err_is"], line["runs"]
    ('0.71', '0.01', 'std over seeds', '2')
    """
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=SUMMARY_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    values = denoise_values(rows)
    for name, group in report_groups(rows).items():
        plain = [r for r in group if r["mechanism"] == "none"]
        configs: list[tuple[str, str | None, list[Row]]] = (
            [("none", None, plain)] if plain else []
        )
        for mechanism, param, _ in protected(group):
            runs = [r for r in group if r["mechanism"] == mechanism]
            configs += [(mechanism, param, runs)]
        for _, name_of_level, runs in configs:
            by_level: dict[float | None, list[Row]] = (
                {None: runs}
                if name_of_level is None
                else dict(levels(runs, name_of_level).items())
            )
            for level, level_rows in by_level.items():
                for denoise, part in denoise_parts(level_rows, values):
                    row = _summary_row(name, denoise, part)
                    row["parameter"] = name_of_level or ""
                    row["level"] = "" if level is None else f"{level:g}"
                    writer.writerow(row)
    return text.getvalue()
