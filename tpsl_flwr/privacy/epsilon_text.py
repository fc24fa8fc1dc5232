"""Epsilons as people read them: ``inf`` said as such, never ``None``.

A run's pure epsilon is a number, ``inf`` without protection, or absent for
the Gaussian baseline, which has no pure guarantee but an ``(eps, delta)``
one, or empty for a heuristic with no DP guarantee at all (Marvell,
max-norm), said as ``n/a (no DP guarantee)``. A label set's total
(:class:`~tpsl_flwr.release.ledger.LedgerTotal`) is the pure sum beside
dp-accounting's ``(eps, delta)``. Every summary, log line, report and
table states them through these functions, so that ``None`` never stands
for "unbounded" and a Gaussian total never reads as empty.
Values may come from JSON, where ``inf`` is the string ``"inf"``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tpsl_flwr.privacy.mechanisms import REGISTRY

__all__ = [
    "NO_DP_GUARANTEE",
    "as_epsilon",
    "epsilon_text",
    "has_dp_guarantee",
    "results_total_text",
    "total_text",
]

NO_PURE = "no pure guarantee"
NO_GUARANTEE = "no guarantee at any delta"
NO_DP_GUARANTEE = "no DP guarantee"
"""What a heuristic defense's empty epsilon is said as."""


def has_dp_guarantee(mechanism: object) -> bool:
    """Whether the mechanism named states a DP guarantee (unknown names: yes).

    Examples
    --------
    >>> has_dp_guarantee("laplace"), has_dp_guarantee("marvell")
    (True, False)
    """
    cls = REGISTRY.get(str(mechanism)) if mechanism is not None else None
    return cls is None or cls.dp_guarantee


def as_epsilon(value: Any) -> float | None:
    """A float from a number or JSON's ``"inf"``; None stays None.

    Examples
    --------
    >>> as_epsilon("inf"), as_epsilon(2), as_epsilon(None)
    (inf, 2.0, None)
    """
    if value is None or value == "":
        return None
    return float(value)


def epsilon_text(value: Any, mechanism: object = None) -> str:
    """One release's pure epsilon: ``1``, ``inf``, or ``inf (no pure guarantee)``.

    ``None`` is the Gaussian baseline's: no pure epsilon exists. For a
    ``mechanism`` with no DP guarantee at all, ``n/a (no DP guarantee)``.

    Examples
    --------
    >>> epsilon_text(1.0), epsilon_text("inf"), epsilon_text(None)
    ('1', 'inf', 'inf (no pure guarantee)')
    >>> epsilon_text(None, "max-norm")
    'n/a (no DP guarantee)'
    """
    if not has_dp_guarantee(mechanism):
        return f"n/a ({NO_DP_GUARANTEE})"
    epsilon = as_epsilon(value)
    if epsilon is None:
        return f"inf ({NO_PURE})"
    return f"{epsilon:g}"


def total_text(epsilon: Any, epsilon_at_delta: Any = None, delta: Any = None) -> str:
    """A total as a sentence part: the pure sum, then the ``(eps, delta)`` one.

    Parameters
    ----------
    epsilon
        The pure total (``inf``, or None, where there is none).
    epsilon_at_delta, delta
        The PLD total and its delta, stated where it is tighter or where no
        pure total exists.

    Examples
    --------
    >>> total_text(2.0, 1.83, 1e-5)
    '2 (1.83 at delta 1e-05)'
    >>> total_text(1.0, 1.0, 1e-5), total_text(2.0, 1.99996, 1e-5), total_text(3.0)
    ('1', '2', '3')
    >>> total_text("inf", 4.377, 1e-5)
    'inf (no pure guarantee; 4.38 at delta 1e-05)'
    >>> total_text("inf", "inf", 1e-5)
    'inf (no guarantee at any delta)'
    """
    pure = as_epsilon(epsilon)
    pure = math.inf if pure is None else pure
    at_delta = as_epsilon(epsilon_at_delta)
    known = at_delta is not None and delta is not None
    if math.isfinite(pure):
        # Stated where tighter at the precision printed.
        if known and at_delta is not None and float(f"{at_delta:.3g}") < pure:
            return f"{pure:g} ({at_delta:.3g} at delta {float(delta):g})"
        return f"{pure:g}"
    if known and at_delta is not None and math.isfinite(at_delta):
        return f"inf ({NO_PURE}; {at_delta:.3g} at delta {float(delta):g})"
    if known:
        return f"inf ({NO_GUARANTEE})"
    return f"inf ({NO_PURE})" if epsilon is None else "inf"


def results_total_text(results: Mapping[str, Any]) -> str:
    """The label set's total of a run's ``results``: its ledger total, else its own.

    A run no ledger recorded states its own spend (``privacy``) as the total;
    one of a mechanism with no DP guarantee, ``n/a (no DP guarantee)``.

    Examples
    --------
    >>> results_total_text({"epsilon_total": "inf", "ledger": {"total": {
    ...     "epsilon": "inf", "epsilon_at_delta": 4.377, "delta": 1e-5}}})
    'inf (no pure guarantee; 4.38 at delta 1e-05)'
    >>> results_total_text({"epsilon_spent": 1.0})
    '1'
    """
    ledger_total = (results.get("ledger") or {}).get("total")
    if not ledger_total and not has_dp_guarantee(results.get("mechanism")):
        return f"n/a ({NO_DP_GUARANTEE})"
    total = ledger_total or results.get("privacy") or {}
    pure = results.get("epsilon_total", results.get("epsilon_spent"))
    return total_text(
        total.get("epsilon", pure), total.get("epsilon_at_delta"), total.get("delta")
    )
