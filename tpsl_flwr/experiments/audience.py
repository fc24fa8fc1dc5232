"""Which output may go to whom: the label party's files and a shareable summary.

Epsilon covers the perturbed gradients the nodes receive, nothing else. What
the label party computes on its clean labels (train and test positive rates
and class counts, test metrics, validation scores, attack AUCs against the
true labels, the per-epoch history holding them) is not covered: one positive
rate times the row count is the exact number of positive labels. Such files
are the label party's alone: mode ``0600`` in a folder of mode ``0700`` (the
run's out-dir, :func:`private_folder`).

What may be shared (mechanism, epsilon, placement, the public run config, the
key's origin and fingerprint, facts about the data that need no label, speed)
goes to :data:`PUBLIC_SUMMARY`, mode ``0644``, built by :func:`public_summary`
from one allow-list, :data:`PUBLIC_FIELDS`. A field it does not name is left
out, so a field added to the results later stays with the label party until a
person decides to publish it (and adds it here, with a test).

Examples
--------
>>> summary = public_summary({
...     "mechanism": "laplace", "epsilon_spent": 1.0, "test_auc": 0.93,
...     "data_info": {"rows": 569, "train_positive_rate": 0.63},
...     "noise_key": {"origin": "seed", "secure": False, "fingerprint": "ab12"},
... })
>>> summary["mechanism"], summary["data_info"], summary["seeded_key"]
('laplace', {'rows': 569}, True)
>>> "test_auc" in summary
False
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeAlias

from tpsl_flwr._util.private_files import (
    PUBLIC_MODE,
    keep_private,
    private_folder,
    write_atomic,
)

__all__ = [
    "CONFIG_PATH_KEYS",
    "LABEL_PARTY_ONLY_FILES",
    "PUBLIC_FIELDS",
    "PUBLIC_MODE",
    "PUBLIC_RUN_COLUMNS",
    "PUBLIC_SUMMARY",
    "SEEDED_KEY_NOTE",
    "is_seeded_key",
    "keep_private",
    "key_origin",
    "private_folder",
    "public_summary",
    "write_public",
    "write_shareable",
]

Fields: TypeAlias = Mapping[str, "Fields | None"]
"""An allow-list: each allowed key, with ``None`` (the value as it is) or the
allow-list of its own keys (applied to a dict, or to each dict of a list)."""

CONFIG_PATH_KEYS = (
    "out-dir",
    "label-dir",
    "data-path",
    "cache-dir",
    "transcript-dir",
)
"""Run-config keys holding paths: the summary keeps their last part, and
``flower-run`` passes them on absolute (empty: unset)."""
PUBLIC_SUMMARY = "summary-public.json"
"""The shareable summary of a run, next to its (private) ``results.json``."""
LABEL_PARTY_ONLY_FILES = ("results.json", "report.md", "report.png")
"""A run's files that hold clean-label statistics (mode ``0600``)."""
SEEDED_KEY_NOTE = (
    "a seeded key is reproducible by anyone who knows the seed, who can then "
    "recompute and subtract the noise: a seeded run shows utility, not "
    "protection"
)

_PRIVACY: Fields = dict.fromkeys(
    (
        "mechanism",
        "placement",
        "epochs",
        "reuse_noise",
        "epsilon",
        "delta",
        "epsilon_at_delta",
        "releases",
        "auc_bound",  # the eps-DP ceiling on any attack: a function of eps alone
        "notes",
    )
)
_NOISE_KEY: Fields = dict.fromkeys(("secure", "origin", "fingerprint", "note"))
_DATA_INFO: Fields = dict.fromkeys(
    (
        "rows",
        "rows_read",
        "rows_skipped",
        "train_rows",
        "test_rows",
        "num_classes",
        "num_numeric",
        "num_categorical",
        "format",
        "split",
        "seed",
    )
)
_LEDGER: Fields = {
    # What the privacy ledger says of this release; its ``label_set`` (a keyed
    # fingerprint of the labels) never leaves the label party, and its
    # ``folder`` is a machine path.
    "epsilon_spent": None,
    "releases": None,
    "total": dict.fromkeys(("releases", "epsilon", "epsilon_at_delta", "delta")),
    "as_of": None,
    "earlier_releases": None,
    "public_labels": None,
    "acknowledged": None,
    "kind": None,
}
PUBLIC_FIELDS: Fields = {
    # What was released, and what it cost.
    "engine": None,
    "mechanism": None,
    "epsilon": None,
    "sigma": None,
    "placement": None,
    "epochs": None,
    "epsilon_spent": None,
    "epsilon_total": None,
    "run_kind": None,
    "privacy": _PRIVACY,
    "ledger": _LEDGER,
    "noise_key": _NOISE_KEY,
    # The run config is public by construction: Flower hands it to every node,
    # and nothing label-derived (nor the noise seed) may enter it.
    "config": None,
    # Facts about the data that need no label: membership is a function of
    # the record id alone.
    "dataset": None,
    "num_classes": None,
    "num_parties": None,
    "train_rows": None,
    "test_rows": None,
    "validation_rows": None,
    # batch size and lr as resolved from the row count (no label enters).
    "training": None,
    "data_info": _DATA_INFO,
    # Speed.
    "samples_per_second": None,
    "seconds": None,
    "flower_wall_seconds": None,
    "round_trip_seconds": None,
    "executor": None,
}
"""The one allow-list of :func:`public_summary`.

Left out on purpose (never add them): ``test_auc``, ``test_accuracy``,
``test_logloss``, ``history`` (per-epoch test metrics, validation scores and
attack AUCs on the true labels), ``best_epoch`` (chosen by a validation score
on labels), ``data_info``'s positive rates, ``bayes_test_auc`` and the
synthetic generator's ``target_positive_rate``/``intercept``, its ``source``
and ``cache_path`` (machine paths), ``evaluation_labels`` (the path of the
label party's copy of the training labels), and the ledger's ``label_set`` (a
fingerprint of the labels) and ``folder``.
"""


PUBLIC_RUN_COLUMNS = (
    "run",
    "dataset",
    "mechanism",
    "epsilon",
    "sigma",
    "marvell_power",
    "denoise",
    "seed",
    "rows",
    "train_samples",
    # What the mechanism guarantees, from its settings alone: an empty
    # epsilon reads "no DP guarantee" (Marvell, max-norm) or "(eps, delta)-DP"
    # (Gaussian), never the one for the other.
    "parameter",
    "level",
    "epsilon_at_delta",
    "delta",
    "guarantee",
    "epsilon_spent",
    "epsilon_total",
    "epsilon_total_now",
    "epsilon_total_now_at_delta",
    "key_origin",
    "seeded_key",
    "run_kind",
    "samples_per_second",
)
"""The columns of a sweep's ``runs-public.csv``: its ``runs.csv`` without the
test metrics and attack AUCs (computed on the clean labels). The guarantee
columns are functions of the settings alone (``summary-public.json`` states
the same in ``privacy``)."""


def key_origin(results: Mapping[str, Any]) -> str | None:
    """Where the run's noise key came from: ``"os"``, ``"seed"`` (or ``None``).

    Examples
    --------
    >>> key_origin({"noise_key": {"origin": "seed"}}), key_origin({})
    ('seed', None)
    """
    origin = (results.get("noise_key") or {}).get("origin")
    return None if origin is None else str(origin)


def is_seeded_key(results: Mapping[str, Any]) -> bool | None:
    """Whether the run's key was seeded (not secure); ``None`` when unknown.

    Examples
    --------
    >>> is_seeded_key({"noise_key": {"origin": "seed", "secure": False}})
    True
    >>> is_seeded_key({"noise_key": {"origin": "os", "secure": True}})
    False
    >>> is_seeded_key({}) is None
    True
    """
    key = results.get("noise_key") or {}
    if "secure" in key:
        return not key["secure"]
    origin = key_origin(results)
    return None if origin is None else origin != "os"


def allowed(value: Any, fields: Fields | None) -> Any:
    """``value`` cut down to ``fields`` (``None``: the value as it is).

    Under an allow-list of keys a dict keeps the allowed keys, a list keeps
    its dicts (each cut down) and anything else is dropped (``None``): a value
    whose shape is not the expected one is not published.

    Examples
    --------
    >>> allowed({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": None}})
    {'b': {'c': 2}}
    >>> allowed([{"c": 1, "d": 2}, 5], {"c": None})
    [{'c': 1}]
    >>> allowed(0.5, {"c": None}) is None
    True
    """
    if fields is None:
        return value
    if isinstance(value, Mapping):
        return {
            key: allowed(value[key], inner)
            for key, inner in fields.items()
            if key in value
        }
    if isinstance(value, list | tuple):
        return [allowed(item, fields) for item in value if isinstance(item, Mapping)]
    return None


def public_summary(results: Mapping[str, Any]) -> dict[str, Any]:
    """The shareable part of a run's results (:data:`PUBLIC_FIELDS`).

    Adds ``audience`` (what the summary is), ``seeded_key`` (the key was
    seeded: not secure) and, for a seeded key, ``seeded_key_note``
    (:data:`SEEDED_KEY_NOTE`), and ``label_party_only``: the files of the run
    that stay with the label party.

    Parameters
    ----------
    results
        A run's results dict (the schema of ``results.json``).

    Returns
    -------
    dict
        JSON-ready when ``results`` is.
    """
    summary: dict[str, Any] = {
        "audience": "shareable: no statistic computed on the clean labels",
        **allowed(results, PUBLIC_FIELDS),
        "seeded_key": is_seeded_key(results),
        "label_party_only": list(LABEL_PARTY_ONLY_FILES),
    }
    if summary["seeded_key"]:
        summary["seeded_key_note"] = SEEDED_KEY_NOTE
    config = summary.get("config")
    if isinstance(config, Mapping):  # machine paths: only their last part
        summary["config"] = {
            k: Path(str(v)).name if k in CONFIG_PATH_KEYS and v else v
            for k, v in config.items()
        }
    return summary


def write_public(path: str | Path, results: Mapping[str, Any]) -> Path:
    """Write :func:`public_summary` of ``results`` to ``path``, mode ``0644``."""
    text = json.dumps(public_summary(results), indent=2, default=_jsonable) + "\n"
    return write_shareable(path, text)


def write_shareable(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically, mode ``0644`` whatever the umask.

    Only for text built from an allow-list (:data:`PUBLIC_FIELDS`,
    :data:`PUBLIC_RUN_COLUMNS`).
    """
    return write_atomic(path, text, mode=PUBLIC_MODE)


def _jsonable(value: Any) -> Any:
    """Return a numpy scalar as a Python number, anything else as its text."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)
