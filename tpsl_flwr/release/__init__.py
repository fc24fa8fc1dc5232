"""The label party's private state: label sets, the privacy ledger, its store.

* :mod:`~tpsl_flwr.release.label_set`: what a label set *is*, fingerprinted
  with a key that never leaves the label party;
* :mod:`~tpsl_flwr.release.ledger`: every release over a label set, append-only,
  and the composed totals;
* :mod:`~tpsl_flwr.release.binding`: what fixes a release's noise (settings, id
  space, labels);
* :mod:`~tpsl_flwr.release.record`: a release in the ledger: admit it, record
  it, report it;
* :mod:`~tpsl_flwr.release.store`: the label party's own folder: its noise key,
  bound to one release, and its checkpoints (:class:`LabelStore`).

No Flower; what is here never leaves the label party. The names below are
imported on first use: a node's process imports the label party's class (for
its types) but never opens a store or a ledger.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpsl_flwr.release.binding import LabelRecords, NoiseBinding
    from tpsl_flwr.release.store import LabelStore, Release

_LAZY = {
    "LabelRecords": "tpsl_flwr.release.binding",
    "LabelStore": "tpsl_flwr.release.store",
    "NoiseBinding": "tpsl_flwr.release.binding",
    "Release": "tpsl_flwr.release.store",
}

__all__ = ["LabelRecords", "LabelStore", "NoiseBinding", "Release"]


def __getattr__(name: str) -> Any:
    """The names of ``__all__``, imported on first access."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
