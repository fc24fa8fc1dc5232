"""What a sweep's runs guarantee, and which epoch and errors a row holds.

A run's mechanism takes one parameter (``epsilon``, ``sigma``, or its own,
such as a power constraint) and gives one of four guarantees: ``(eps, 0)``
label DP, ``(eps, delta)`` (the Gaussian baseline, from dp-accounting's PLD
accountant), no DP guarantee (a heuristic defense whose epsilon is None:
empty epsilon cells, no ceiling, never placed on an epsilon axis), or no
protection. Every mechanism a sweep ran gets its table and its series
(:func:`protected`), whatever it guarantees. A row also says which epoch its
values are from (:data:`EPOCHS`, :func:`epoch_note`) and carries its run's
own standard errors of the test metrics (:func:`utility_errors`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.sweep.stats import COLORS, PROTECTED, Row, values_of
from tpsl_flwr.metrics.auc import auc_standard_error
from tpsl_flwr.privacy.mechanisms import MECHANISMS, parameter_of

__all__ = [
    "APPROX_DP",
    "EPOCHS",
    "NO_DP",
    "NO_PROTECTION",
    "PURE_DP",
    "color_of",
    "epoch_note",
    "epsilon_cell",
    "guarantee_cells",
    "protected",
    "utility_errors",
]

EPOCHS = ("best", "last")
"""Which epoch a report shows: ``best`` (the one the label party kept by its
validation score; the last where a run held out no validation set) or ``last``."""
NO_PROTECTION = "no protection"
NO_DP = "no DP guarantee"
PURE_DP = "(eps, 0)-DP"
APPROX_DP = "(eps, delta)-DP"


def guarantee_cells(results: Mapping[str, Any]) -> dict[str, Any]:
    """What a run's mechanism guarantees, as row cells.

    ``parameter`` and ``level``: the mechanism's own parameter and its value
    (``epsilon``, ``sigma``, or whatever a mechanism without a DP guarantee
    takes, read from the results or their run config); ``epsilon_at_delta``
    and ``delta``: the accountant's ``(eps, delta)``; ``guarantee``:
    :data:`PURE_DP`, :data:`APPROX_DP`, :data:`NO_DP` (a protected run whose
    epsilon is None and which has no finite ``(eps, delta)`` either) or
    :data:`NO_PROTECTION`.

    Examples
    --------
    >>> guarantee_cells({"mechanism": "laplace", "epsilon": 2.0})["guarantee"]
    '(eps, 0)-DP'
    >>> cells = guarantee_cells({"mechanism": "gaussian", "sigma": 2.0,
    ...     "privacy": {"epsilon_at_delta": 1.99, "delta": 1e-5}})
    >>> cells["parameter"], cells["level"], cells["guarantee"]
    ('sigma', 2.0, '(eps, delta)-DP')
    >>> cells = guarantee_cells({"mechanism": "max-norm", "epsilon": None})
    >>> cells["guarantee"], cells["epsilon_at_delta"]
    ('no DP guarantee', None)
    """
    mechanism = str(results.get("mechanism"))
    privacy = results.get("privacy") or {}
    config = results.get("config") or {}
    param = _parameter(mechanism)
    level = None
    if param is not None:
        for source in (results, config):
            for key in (param, param.replace("_", "-")):
                if level is None and source.get(key) not in (None, ""):
                    level = source[key]
    at_delta = _finite(privacy.get("epsilon_at_delta"))
    if mechanism == "none":
        guarantee, at_delta = NO_PROTECTION, None
    elif _finite(results.get("epsilon")) is not None:
        guarantee = PURE_DP
    elif at_delta is not None:
        guarantee = APPROX_DP
    else:
        guarantee = NO_DP
    return {
        "parameter": param,
        "level": level,
        "epsilon_at_delta": at_delta,
        "delta": privacy.get("delta") if at_delta is not None else None,
        "guarantee": guarantee,
    }


def _parameter(mechanism: str) -> str | None:
    """The parameter of ``mechanism`` (None for ``none`` or an unknown name)."""
    try:
        return parameter_of(mechanism)
    except ConfigError:
        return None


def _finite(value: Any) -> float | None:
    """``value`` as a finite float, else None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def utility_errors(row: Mapping[str, Any], results: Mapping[str, Any]) -> dict:
    """A run's own standard errors of its test AUC and accuracy.

    Hanley-McNeil (1982) for the AUC over the test set's positives and
    negatives, binomial for the accuracy; ``None`` where the results do not
    say the test set's size (and, for the AUC, its positive rate).

    Examples
    --------
    >>> errors = utility_errors({"test_auc": 0.75, "test_accuracy": 0.8},
    ...     {"test_rows": 1000, "test_positive_rate": 0.1})
    >>> round(errors["test_auc_se"], 4), round(errors["test_accuracy_se"], 4)
    (0.0291, 0.0126)
    """
    info = {**results, **(results.get("data_info") or {})}
    test_rows = _finite(info.get("test_rows"))
    rate = _finite(info.get("test_positive_rate"))
    auc, accuracy = _finite(row.get("test_auc")), _finite(row.get("test_accuracy"))
    out: dict[str, float | None] = {"test_auc_se": None, "test_accuracy_se": None}
    if test_rows is None or test_rows < 1:
        return out
    if accuracy is not None:
        out["test_accuracy_se"] = math.sqrt(accuracy * (1 - accuracy) / test_rows)
    if auc is not None and rate is not None:
        n_pos = round(test_rows * rate)
        if 0 < n_pos < test_rows:
            out["test_auc_se"] = auc_standard_error(auc, n_pos, int(test_rows) - n_pos)
    return out


def protected(rows: Iterable[Row]) -> list[tuple[str, str, str]]:
    """Each protected mechanism of ``rows``: ``(mechanism, parameter, title)``.

    The paper's three first (:data:`PROTECTED`), then any other in the
    registry's order (unknown names last): every mechanism a sweep ran gets
    its table and its series, whatever it guarantees. A mechanism without a DP
    guarantee is titled so.

    Examples
    --------
    >>> protected([{"mechanism": "none"}, {"mechanism": "gaussian"},
    ...            {"mechanism": "laplace"}])[0][:2]
    ('laplace', 'epsilon')
    >>> protected([{"mechanism": "marvell", "parameter": "power",
    ...             "guarantee": "no DP guarantee"}])
    [('marvell', 'power', 'marvell (no DP guarantee)')]
    """
    rows = list(rows)
    names = list(dict.fromkeys(str(r["mechanism"]) for r in rows))
    known = {m: (p, t) for m, p, t in PROTECTED}
    order = [m for m, _, _ in PROTECTED] + [m for m in MECHANISMS if m not in known]
    names = sorted(
        (m for m in names if m != "none"),
        key=lambda m: (order.index(m) if m in order else len(order), m),
    )
    out = []
    for name in names:
        if name in known:
            out.append((name, *known[name]))
            continue
        runs = [r for r in rows if r["mechanism"] == name]
        param = next(
            (str(r["parameter"]) for r in runs if r.get("parameter")),
            _parameter(name) or "level",
        )
        guarantees = {str(r.get("guarantee") or "") for r in runs} - {""}
        said = NO_DP if NO_DP in guarantees else ", ".join(sorted(guarantees))
        out.append((name, param, f"{name} ({said})" if said else name))
    return out


def epoch_note(rows: Sequence[Row]) -> str:
    """Which epoch the values of ``rows`` come from, for a caption.

    Examples
    --------
    >>> epoch_note([{"epoch_rule": "last"}] * 2)
    'last epoch'
    >>> epoch_note([{"epoch_rule": "best (validation)"},
    ...             {"epoch_rule": "last (no validation set)"}])
    'best epoch (validation-chosen in 1 of 2 runs; else the last)'
    >>> epoch_note([{"epoch_rule": "best (validation)"}])
    'best epoch (chosen on the validation split)'
    """
    rules = [str(r.get("epoch_rule") or "") for r in rows]
    if not any(rules):
        return "final epoch"
    chosen = sum(rule.startswith("best") for rule in rules)
    if all(rule == "last" for rule in rules):
        return "last epoch"
    if chosen == len(rules):
        return "best epoch (chosen on the validation split)"
    return (
        f"best epoch (validation-chosen in {chosen} of {len(rules)} runs; "
        "else the last)"
    )


def epsilon_cell(rows: Sequence[Row]) -> str:
    """The runs' epsilon where their parameter is another: ``eps (delta d)``.

    Empty for runs with no DP guarantee (their epsilon is None).

    Examples
    --------
    >>> epsilon_cell([{"epsilon_at_delta": 1.993, "delta": 1e-05}])
    '1.99 (delta 1e-05)'
    >>> epsilon_cell([{"epsilon": 2.0}])
    '2'
    >>> epsilon_cell([{"epsilon": None, "guarantee": "no DP guarantee"}])
    ''
    """
    pure = values_of(rows, "epsilon")
    if pure.size:
        return "; ".join(dict.fromkeys(f"{e:g}" for e in pure))
    texts = [
        f"{float(r['epsilon_at_delta']):.3g} (delta {float(r['delta']):g})"
        for r in rows
        if r.get("epsilon_at_delta") not in (None, "")
        and r.get("delta") not in (None, "")
    ]
    return "; ".join(dict.fromkeys(texts))


def color_of(mechanism: str) -> str:
    """A mechanism's colour: :data:`COLORS`, else one of its own (stable by name)."""
    if mechanism in COLORS:
        return COLORS[mechanism]
    others = [m for m in MECHANISMS if m not in COLORS and m != "none"]
    at = others.index(mechanism) if mechanism in others else sum(map(ord, mechanism))
    return f"C{3 + at % 7}"
