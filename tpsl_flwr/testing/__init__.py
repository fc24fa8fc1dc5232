"""Testing support: a strategy harness, and synthetic Criteo and Avazu files.

* :func:`run_strategy` runs a label-party strategy against your ClientApp in
  this process and returns what each node received, what the label party
  computed, the result and its privacy (:mod:`tpsl_flwr.testing.harness`).
  It is imported on first use, so the file writers below stay free of Flower.
* No real rows are shipped: :func:`write_criteo` and :func:`write_avazu` write
  files in the real formats (heavy-tailed counts, Zipf-like categoricals,
  missing values) from a seed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpsl_flwr.testing.ctr_generator import GeneratedFile, write_avazu, write_criteo

if TYPE_CHECKING:
    from tpsl_flwr.testing.harness import (
        ComputedStep,
        DispatchedStep,
        StrategyReport,
        run_strategy,
    )

__all__ = [
    "ComputedStep",
    "DispatchedStep",
    "GeneratedFile",
    "StrategyReport",
    "run_strategy",
    "write_avazu",
    "write_criteo",
]

_HARNESS = frozenset(
    {"ComputedStep", "DispatchedStep", "StrategyReport", "run_strategy"}
)


def __getattr__(name: str) -> Any:
    """Import the harness (Flower, torch) only when one of its names is used."""
    if name in _HARNESS:
        from tpsl_flwr.testing import harness

        return getattr(harness, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
