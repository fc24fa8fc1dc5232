"""Shared pieces of a sweep's report: cells, groups and panels.

Every cell is ``mean ± std`` over seeds (std with ``ddof = 0``). A lone run
shows its value and, for an attack, its own standard error over the samples
it was computed on (``0.733 (SE 0.023)``, from the row's ``<name>_se``).
Protected configurations also show how their runs' SDA compares with the
epsilon-DP ceiling (:func:`ceiling_summary`, the verdicts of
:func:`~tpsl_flwr.attacks.ceiling.ceiling_verdict`). Multi-class datasets use
test accuracy and SDA top-1.
Rows group per dataset, or per dataset and size (``"synthetic-ctr, 200,000
rows"``) when a dataset was run at several sizes. When the runs differ in
``denoise`` (a sweep's ``denoises`` axis), each group is split further per
denoise value (:func:`denoise_parts`) so plain and posterior runs sit side by
side; otherwise the report looks as it did without the axis.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tpsl_flwr.attacks.ceiling import ABOVE, BELOW, WITHIN
from tpsl_flwr.attacks.report import AS_SCORED
from tpsl_flwr.privacy.epsilon_text import total_text
from tpsl_flwr.release.ledger import DELTA

Row = dict[str, Any]

UTILITY_LABEL = {"test_auc": "test AUC", "test_accuracy": "test accuracy"}
COLORS = {
    "laplace": "C0",
    "discrete": "C1",
    "gaussian": "C2",
    "rr-prior": "C5",
    "marvell": "C4",
}
"""Each mechanism's colour (others: :func:`.guarantee.color_of`)."""
SEEDS, OWN_SE = "std over seeds", "run's own SE"
"""What an error bar is (:func:`estimate`)."""
PANELS_PER_ROW = 3
UNCERTAIN_ATTACKS = ("norm", "cosine", "spectral", "sda", "sda_top1")
"""Attacks whose standard error a row carries as ``<name>_se``."""
UNCERTAINTY_COLUMNS = (*(f"{a}_se" for a in UNCERTAIN_ATTACKS), "sda_verdict")
"""The per-run uncertainty columns of a sweep row (:func:`attack_uncertainty`)."""
DIRECTION_COLUMNS = tuple(f"{a}_direction" for a in UNCERTAIN_ATTACKS)
"""Each attack's direction where the run's results report one
(:func:`attack_directions`): an AUC below 0.5 reported as ``1 - AUC``."""
PROTECTED = (
    ("laplace", "epsilon", "Table 2: Laplace GradPerturb"),
    ("discrete", "epsilon", "Table 3: Discrete GradPerturb (randomized response)"),
    ("gaussian", "sigma", "Gaussian baseline (no pure DP)"),
)
"""The paper's mechanisms: name, parameter and table title. Any other
(``rr-prior``, ``marvell``, ``max-norm``) gets its table from the registry
(:func:`.guarantee.protected`), titled by what it guarantees."""


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


def values_of(rows: Iterable[Row], key: str) -> np.ndarray:
    """The finite values of ``key`` over ``rows`` (missing cells skipped)."""
    out = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
    return np.asarray([v for v in out if math.isfinite(v)], dtype=float)


def mean_std(rows: Sequence[Row], key: str) -> tuple[float, float]:
    """Mean and std of ``key`` over ``rows`` (``nan`` when no row has it)."""
    values = values_of(rows, key)
    if values.size == 0:
        return math.nan, math.nan
    return float(values.mean()), float(values.std())


def estimate(rows: Sequence[Row], key: str) -> tuple[float, float, str]:
    """``key``'s value over ``rows``, its error bar and what the bar is.

    Several runs: mean and std over seeds; one run: its value and its own
    standard error (``<key>_se``, NaN if it has none).

    Examples
    --------
    >>> estimate([{"sda": 0.7}, {"sda": 0.8}], "sda")
    (0.75, 0.05..., 'std over seeds')
    >>> estimate([{"sda": 0.7, "sda_se": 0.02}], "sda")
    (0.7, 0.02, "run's own SE")
    """
    values = values_of(rows, key)
    if values.size >= 2:
        return float(values.mean()), float(values.std()), SEEDS
    if values.size == 1:
        errors = values_of(rows, f"{key}_se")
        if errors.size == 1:
            return float(values[0]), float(errors[0]), OWN_SE
        return float(values[0]), math.nan, ""
    return math.nan, math.nan, ""


def attack_uncertainty(attacks: Mapping[str, Any]) -> dict[str, Any]:
    """A run's per-attack standard errors and SDA ceiling verdict, as row cells.

    ``attacks`` is an epoch's ``attack_auc`` (its ``standard_error`` and
    ``ceiling_verdict``); the keys are :data:`UNCERTAINTY_COLUMNS`.

    Examples
    --------
    >>> attack_uncertainty({"standard_error": {"sda": 0.023},
    ...                     "ceiling_verdict": {"sda": "within sampling error"}})
    ... # doctest: +NORMALIZE_WHITESPACE
    {'norm_se': None, 'cosine_se': None, 'spectral_se': None, 'sda_se': 0.023,
     'sda_top1_se': None, 'sda_verdict': 'within sampling error'}
    """
    errors = attacks.get("standard_error") or {}
    out: dict[str, Any] = {f"{a}_se": errors.get(a) for a in UNCERTAIN_ATTACKS}
    out["sda_verdict"] = (attacks.get("ceiling_verdict") or {}).get("sda")
    return out


def attack_directions(attacks: Mapping[str, Any]) -> dict[str, Any]:
    """Each attack's direction, where the epoch's ``attack_auc`` reports one.

    Read from ``attack_auc["direction"][name]`` or ``attack_auc["<name>_direction"]``
    (an attack whose AUC was below 0.5 and is reported as ``1 - AUC`` says so
    there); ``None`` where the results say nothing.

    Examples
    --------
    >>> attack_directions({"direction": {"spectral": "inverted"}})["spectral_direction"]
    'inverted'
    >>> attack_directions({"norm_direction": "as scored"})["norm_direction"]
    'as scored'
    >>> attack_directions({})["sda_direction"] is None
    True
    """
    given = attacks.get("direction")
    given = given if isinstance(given, Mapping) else {}
    return {
        f"{a}_direction": given.get(a, attacks.get(f"{a}_direction"))
        for a in UNCERTAIN_ATTACKS
    }


NO_LEVEL = math.nan
"""The level of a mechanism that takes no parameter (one object: a dict key)."""


def level_of(row: Row, param: str) -> float:
    """A row's value of ``param`` (its ``level`` cell when it has no such column).

    :data:`NO_LEVEL` where the row has neither (a mechanism without a
    parameter, such as a heuristic defense).
    """
    value = row.get(param)
    if value in (None, ""):
        value = row.get("level")
    return NO_LEVEL if value in (None, "") else float(value)


def level_text(level: float) -> str:
    """A level for a table cell: ``-`` for :data:`NO_LEVEL`.

    Examples
    --------
    >>> level_text(0.5), level_text(NO_LEVEL)
    ('0.5', '-')
    """
    return "-" if math.isnan(level) else f"{level:g}"


def cell(rows: Sequence[Row], key: str) -> str:
    """``mean ± std`` of ``key`` over seeds (``-`` when no row has it).

    A lone run shows its own standard error where the row has ``<key>_se``;
    a direction the results report follows in brackets (:func:`direction_note`).

    Examples
    --------
    >>> cell([{"sda": 0.7}, {"sda": 0.8}], "sda")
    '0.750 ± 0.050'
    >>> cell([{"sda": 0.7332, "sda_se": 0.0231}], "sda")
    '0.733 (SE 0.023)'
    >>> cell([{"sda": None}], "sda")
    '-'
    >>> cell([{"cosine": 0.6, "cosine_direction": "inverted"},
    ...       {"cosine": 0.7, "cosine_direction": "as scored"}], "cosine")
    '0.650 ± 0.050 [inverted 1/2]'
    """
    values = values_of(rows, key)
    if values.size == 0:
        return "-"
    if values.size == 1:
        errors = values_of(rows, f"{key}_se")
        if errors.size == 1:
            text = f"{values[0]:.3f} (SE {errors[0]:.3f})"
        else:
            text = f"{values[0]:.3f}"
    else:
        text = f"{values.mean():.3f} ± {values.std():.3f}"
    return text + direction_note(rows, key)


def direction_note(rows: Sequence[Row], key: str) -> str:
    """`` (inverted)`` where the runs report ``key`` as ``1 - AUC``.

    Read from each row's ``<key>_direction`` (:func:`attack_directions`); with
    the count where only some runs were turned round.

    Examples
    --------
    >>> direction_note([{"spectral_direction": "inverted"}] * 2, "spectral")
    ' [inverted]'
    >>> direction_note([{}], "spectral")
    ''
    >>> direction_note([{"sda_direction": "as scored"}], "sda")
    ''
    >>> direction_note([{"cosine_direction": "inverted"}, {"cosine_direction":
    ...                 "as scored"}], "cosine")
    ' [inverted 1/2]'
    """
    said = [r.get(f"{key}_direction") for r in rows]
    # "as scored" is the norm and goes unsaid; an inverted attack is named.
    given = [str(d) for d in said if d not in (None, "", AS_SCORED)]
    if not given:
        return ""
    kinds = list(dict.fromkeys(given))
    if len(kinds) == 1 and len(given) == len(said):
        return f" [{kinds[0]}]"
    return " [" + "; ".join(f"{k} {given.count(k)}/{len(said)}" for k in kinds) + "]"


def total_cell(rows: Sequence[Row]) -> str:
    """The runs' label-set total now (``epsilon_total_now``), each distinct once.

    Pure, with the PLD ``(eps, delta)`` beside it where tighter or where no
    pure total exists (:func:`~tpsl_flwr.privacy.epsilon_text.total_text`);
    ``-`` when no row has one.

    Examples
    --------
    >>> total_cell([{"epsilon_total_now": 4.0, "epsilon_total_now_at_delta": 4.0}])
    '4'
    >>> total_cell([{"epsilon_total_now": "inf",
    ...              "epsilon_total_now_at_delta": "12.25"}] * 2)
    'inf (no pure guarantee; 12.2 at delta 1e-05)'
    >>> total_cell([{"epsilon_total_now": None}])
    '-'
    """
    texts: list[str] = []
    for row in rows:
        if row.get("epsilon_total_now") in (None, ""):
            continue
        text = total_text(
            row["epsilon_total_now"], row.get("epsilon_total_now_at_delta"), DELTA
        )
        if text not in texts:
            texts.append(text)
    return "; ".join(texts) or "-"


def ceiling_cell(rows: Sequence[Row]) -> str:
    """The runs' ceiling: the plain eps one, then the prior-aware one if used.

    Examples
    --------
    >>> ceiling_cell([{"auc_bound": 0.7311}])
    '0.731'
    >>> ceiling_cell([{"auc_bound": 0.828, "auc_bound_without_prior": 0.7311}])
    '0.731; 0.828 with the label prior'
    """
    if values_of(rows, "auc_bound_without_prior").size == 0:
        return cell(rows, "auc_bound")
    plain, aware = cell(rows, "auc_bound_without_prior"), cell(rows, "auc_bound")
    return f"{plain}; {aware} with the label prior"


def ceiling_summary(rows: Sequence[Row], key: str = "sda_verdict") -> str:
    """How the runs' SDA AUCs compare with the ceiling, the worst verdict first.

    ``-`` when no run has a verdict; else ``below`` when every run is below,
    or the count of runs within sampling error and above the ceiling.

    Examples
    --------
    >>> ceiling_summary([{"sda_verdict": "below the ceiling"}] * 3)
    'below (3/3)'
    >>> ceiling_summary([{"sda_verdict": "within sampling error"},
    ...                  {"sda_verdict": "below the ceiling"}])
    'within sampling error (1/2)'
    >>> ceiling_summary([{"sda_verdict": "above the ceiling"}, {"sda_verdict": None}])
    'ABOVE THE CEILING (1/1)'
    """
    verdicts = [r.get(key) for r in rows if r.get(key) not in (None, "")]
    if not verdicts:
        return "-"
    parts = []
    if verdicts.count(ABOVE):
        parts.append(f"{ABOVE.upper()} ({verdicts.count(ABOVE)}/{len(verdicts)})")
    if verdicts.count(WITHIN):
        parts.append(f"{WITHIN} ({verdicts.count(WITHIN)}/{len(verdicts)})")
    if not parts:
        return f"below ({verdicts.count(BELOW)}/{len(verdicts)})"
    return "; ".join(parts)


def key_cell(rows: Sequence[Row]) -> str:
    """Where the runs' noise keys came from: ``os``, ``seed (not secure)`` or both.

    Examples
    --------
    >>> key_cell([{"key_origin": "seed"}] * 2)
    'seed (not secure)'
    >>> key_cell([{"key_origin": "os"}, {"key_origin": "seed"}])
    'os (1/2); seed (not secure) (1/2)'
    >>> key_cell([{}])
    '-'
    """
    origins = [str(r["key_origin"]) for r in rows if r.get("key_origin")]
    if not origins:
        return "-"
    names = {o: f"{o} (not secure)" if o == "seed" else o for o in origins}
    if len(names) == 1:
        return names[origins[0]]
    return "; ".join(
        f"{names[o]} ({origins.count(o)}/{len(origins)})" for o in sorted(names)
    )


def key_line(rows: Sequence[Row]) -> str:
    """The sentences of a sweep's report on its noise keys and run kinds.

    Examples
    --------
    >>> key_line([{"key_origin": "seed"}, {"key_origin": "os"}])[:41]
    'Noise keys: 1 of 2 runs used a seeded key'
    """
    origins = [r.get("key_origin") for r in rows]
    seeded = origins.count("seed")
    unknown = sum(1 for o in origins if not o)
    counts = f"{seeded} of {len(origins)} runs used a seeded key"
    if unknown:
        counts += f" ({unknown} of unknown origin)"
    kinds = [r.get("run_kind") for r in rows]
    rehearsals, releases = kinds.count("rehearsal"), kinds.count("release")
    return (
        f"Noise keys: {counts} (`key` column; `key_origin` and `seeded_key` in "
        "runs.csv). A seeded key is reproducible by anyone who knows the seed, "
        "who can recompute and subtract the noise: seeded runs show utility, "
        "not protection. Only runs whose key came from the OS (`os`) show "
        f"protection. Privacy ledger: {rehearsals} rehearsal(s) (every node "
        "started by the label party: recorded, not counted in `total`) and "
        f"{releases} release(s) (`run_kind` in runs.csv)."
    )


def by_dataset(rows: Iterable[Row]) -> dict[str, list[Row]]:
    """Rows per dataset, in first-seen order."""
    groups: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        groups[str(row["dataset"])].append(row)
    return dict(groups)


def rows_of(row: Row) -> int:
    """A run's configured dataset size (0, the default, when not recorded)."""
    value = row.get("rows")
    return 0 if value in (None, "") else int(value)


def by_size(rows: Iterable[Row]) -> dict[int, list[Row]]:
    """Rows per configured dataset size, smallest first."""
    groups: dict[int, list[Row]] = defaultdict(list)
    for row in rows:
        groups[rows_of(row)].append(row)
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


def report_groups(rows: Iterable[Row]) -> dict[str, list[Row]]:
    """Rows per dataset, split per size where a dataset has several sizes.

    Examples
    --------
    >>> list(report_groups([{"dataset": "a", "rows": 10}, {"dataset": "b", "rows": 0},
    ...               {"dataset": "b", "rows": 2000}]))
    ['a', 'b, default rows', 'b, 2,000 rows']
    """
    groups: dict[str, list[Row]] = {}
    for dataset, group in by_dataset(rows).items():
        sizes = by_size(group)
        if len(sizes) == 1:
            groups[dataset] = group
            continue
        for size, part in sizes.items():
            groups[f"{dataset}, {size_label(size)}"] = part
    return groups


def sized_datasets(rows: Iterable[Row]) -> dict[str, dict[int, list[Row]]]:
    """Per dataset run at two sizes or more: its rows per size.

    When the runs differ in ``denoise``, per dataset and denoise value
    (``"synthetic-ctr, denoise posterior"``).
    """
    rows = list(rows)
    values = denoise_values(rows)
    out = {}
    for name, group in by_dataset(rows).items():
        for denoise, part in denoise_parts(group, values):
            label = name if denoise is None else f"{name}, denoise {denoise}"
            out[label] = by_size(part)
    return {name: sizes for name, sizes in out.items() if len(sizes) >= 2}


def denoise_values(rows: Iterable[Row]) -> list[str]:
    """The ``denoise`` values of ``rows``, first seen first (missing skipped).

    Examples
    --------
    >>> denoise_values([{"denoise": "none"}, {}, {"denoise": "posterior"},
    ...                 {"denoise": "none"}])
    ['none', 'posterior']
    """
    values = (r.get("denoise") for r in rows)
    return list(dict.fromkeys(str(v) for v in values if v not in (None, "")))


def denoise_parts(
    rows: Iterable[Row], values: Sequence[str]
) -> list[tuple[str | None, list[Row]]]:
    """``rows`` per denoise value (non-empty parts), or all of them under ``None``.

    With fewer than two ``values``, nothing is split. ``values`` are those of
    the whole sweep (:func:`denoise_values`), so every table and panel splits
    alike.

    Examples
    --------
    >>> rows = [{"denoise": "none", "x": 1}, {"denoise": "posterior", "x": 2}]
    >>> [(d, [r["x"] for r in part]) for d, part in denoise_parts(rows, ["none"])]
    [(None, [1, 2])]
    >>> [d for d, _ in denoise_parts(rows[:1], ["none", "posterior"])]
    ['none']
    """
    rows = list(rows)
    if len(values) < 2:
        return [(None, rows)]
    parts = [(v, [r for r in rows if r.get("denoise") == v]) for v in values]
    return [(v, part) for v, part in parts if part]


def levels(rows: Iterable[Row], param: str) -> dict[float, list[Row]]:
    """Rows per value of ``param`` (``epsilon`` or ``sigma``), smallest first."""
    groups: dict[float, list[Row]] = defaultdict(list)
    for row in rows:
        groups[level_of(row, param)].append(row)
    return dict(sorted(groups.items()))


def markdown_table(header: list[str], body: list[list[str]]) -> list[str]:
    """A Markdown table's lines."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return lines


def panels(
    plt: Any, count: int, size: tuple[float, float], **options: Any
) -> tuple[Any, list]:
    """A figure of ``count`` panels, at most :data:`PANELS_PER_ROW` a row.

    ``options`` go to ``plt.subplots`` (``layout="constrained"``, say).
    """
    count = max(1, count)
    cols = min(count, PANELS_PER_ROW)
    lines = math.ceil(count / cols)
    fig, axes = plt.subplots(
        lines,
        cols,
        figsize=(size[0] * cols, size[1] * lines),
        squeeze=False,
        **options,
    )
    flat = list(axes.flat)
    for ax in flat[count:]:
        fig.delaxes(ax)
    return fig, flat[:count]
