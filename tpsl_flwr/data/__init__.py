"""Data layer: labelled tables, vertical partitions, built-in datasets.

Core module: numpy only (no torch, no flwr). The label party holds a
:class:`TabularData` (features and labels); each non-label party holds only a
:class:`PartyFeatures` slice of the columns :func:`partition_columns` gives it.

In a deployment each process loads only what it may hold: a non-label node calls
:func:`load_party_view` (its columns, record ids, never a label), the label party
:func:`load_label_view` (labels and record ids). Train/test membership is a
function of the record id alone, so both sides agree on the ids without any
label leaving the label party.

Criteo and Avazu files are read by :func:`load_criteo` and :func:`load_avazu`
(pyarrow, imported on first use); :mod:`tpsl_flwr.testing` writes synthetic
files in those formats.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tpsl_flwr.data.builtin import (
    ALL_DATASETS,
    DATASETS,
    DEFAULT_DATASET,
    FILE_DATASETS,
    load_dataset,
)
from tpsl_flwr.data.ctr.hashing import DEFAULT_HASH_BUCKETS, hash_tokens
from tpsl_flwr.data.membership import hash_is_test, hash_uniform
from tpsl_flwr.data.partition import PartyColumns, partition_columns, party_features
from tpsl_flwr.data.preprocess import binary_auc, make_split, standardize
from tpsl_flwr.data.spec import DataSpec, dataset_columns
from tpsl_flwr.data.synthetic import (
    SyntheticCTR,
    SyntheticFeatures,
    make_synthetic_ctr,
    make_synthetic_features,
)
from tpsl_flwr.data.tabular import DatasetSplit, PartyFeatures, TabularData
from tpsl_flwr.data.view_records import LabelView, PartyView, id_space_fingerprint
from tpsl_flwr.data.views import load_label_view, load_party_view

if TYPE_CHECKING:
    from tpsl_flwr.data.ctr.avazu import load_avazu
    from tpsl_flwr.data.ctr.criteo import load_criteo

__all__ = [
    "ALL_DATASETS",
    "DATASETS",
    "DEFAULT_DATASET",
    "DEFAULT_HASH_BUCKETS",
    "FILE_DATASETS",
    "DataSpec",
    "DatasetSplit",
    "LabelView",
    "PartyColumns",
    "PartyFeatures",
    "PartyView",
    "SyntheticCTR",
    "SyntheticFeatures",
    "TabularData",
    "binary_auc",
    "dataset_columns",
    "hash_is_test",
    "hash_tokens",
    "hash_uniform",
    "id_space_fingerprint",
    "load_avazu",
    "load_criteo",
    "load_dataset",
    "load_label_view",
    "load_party_view",
    "make_split",
    "make_synthetic_ctr",
    "make_synthetic_features",
    "partition_columns",
    "party_features",
    "standardize",
]

_LAZY = {
    "load_avazu": "tpsl_flwr.data.ctr.avazu",
    "load_criteo": "tpsl_flwr.data.ctr.criteo",
}
"""Exports whose module imports pyarrow (a quarter of a second): loaded on use."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
