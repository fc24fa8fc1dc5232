"""Plain and posterior runs side by side: a sweep with a ``denoises`` axis.

When the runs differ in ``denoise``, the report adds one table: per dataset,
mechanism and level (no protection included), each denoise value's utility
in adjacent columns, its utility gap to the first value (posterior minus
plain: what post-processing the same noisy labels gains, at the same epsilon)
and each value's SDA AUC. The runs of a pair share their data, seed and noise
key (:mod:`~tpsl_flwr.experiments.sweep.axes`), so the gap is the denoiser's
and its training settings', not the noise draw's.
"""

from __future__ import annotations

from collections.abc import Sequence

from tpsl_flwr.experiments.sweep.guarantee import (
    protected,
)
from tpsl_flwr.experiments.sweep.scale import gap_cell
from tpsl_flwr.experiments.sweep.stats import (
    Row,
    cell,
    denoise_values,
    levels,
    markdown_table,
    report_groups,
    sda_key,
    utility_key,
)

__all__ = ["pairs_markdown"]


def _levels(runs: Sequence[Row], param: str | None) -> dict[str, list[Row]]:
    """Runs per level label (``-`` for the one level of no protection)."""
    if param is None:
        return {"-": list(runs)} if runs else {}
    return {f"{level:g}": part for level, part in levels(runs, param).items()}


def pairs_markdown(rows: Sequence[Row]) -> list[str]:
    """``## Denoise side by side`` lines (none unless the runs differ in denoise).

    Examples
    --------
    >>> rows = [
    ...     {"dataset": "d", "mechanism": "laplace", "epsilon": 1.0, "seed": 0,
    ...      "denoise": d, "test_auc": auc, "sda": 0.7}
    ...     for d, auc in (("none", 0.70), ("posterior", 0.72))
    ... ]
    >>> pairs_markdown(rows)[5]
    '| d | laplace | 1 | 0.700 | 0.720 | +0.020 | 0.700 | 0.700 |'
    """
    values = denoise_values(rows)
    if len(values) < 2:
        return []
    first = values[0]
    header = ["dataset", "mechanism", "eps or sigma"]
    header += [f"utility {v}" for v in values]
    header += [f"{v} - {first}" for v in values[1:]]
    header += [f"SDA {v}" for v in values]
    body = []
    for name, group in report_groups(rows).items():
        utility, sda = utility_key(group), sda_key(group)
        mechanisms = (("none", None), *((m, p) for m, p, _ in protected(group)))
        for mechanism, param in mechanisms:
            runs = [r for r in group if r["mechanism"] == mechanism]
            for level, part in _levels(runs, param).items():
                by = {v: [r for r in part if r.get("denoise") == v] for v in values}
                line = [name, mechanism, level]
                line += [cell(by[v], utility) for v in values]
                line += [gap_cell(by[v], by[first], utility) for v in values[1:]]
                line += [cell(by[v], sda) for v in values]
                body.append(line)
    return [
        "",
        "## Denoise side by side",
        "",
        *markdown_table(header, body),
        "",
        f"Utility (and SDA) of each denoise value at the same grid point, on the "
        f"same noise; `<value> - {first}` = the difference of the mean "
        "utilities over seeds. A `-` cell: that value was not run there (the "
        "Gaussian baseline has no posterior).",
    ]
