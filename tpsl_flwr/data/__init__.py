"""Data layer: labelled tables, vertical partitions, built-in datasets.

Core module: numpy and scikit-learn only (no torch, no flwr). The label party
holds a :class:`TabularData` (features and labels); each non-label party receives
only a :class:`PartyFeatures` slice chosen by :func:`partition_columns`.

Criteo and Avazu files are read by :func:`load_criteo` and :func:`load_avazu`
(pyarrow, imported on first use); :func:`write_criteo` and :func:`write_avazu`
write synthetic files in those formats.
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
from tpsl_flwr.data.ctr_generator import GeneratedFile, write_avazu, write_criteo
from tpsl_flwr.data.ctr_hashing import DEFAULT_HASH_BUCKETS, hash_tokens
from tpsl_flwr.data.partition import PartyColumns, partition_columns, party_features
from tpsl_flwr.data.preprocess import (
    binary_auc,
    make_split,
    standardize,
    stratified_split,
)
from tpsl_flwr.data.synthetic import SyntheticCTR, make_synthetic_ctr
from tpsl_flwr.data.tabular import DatasetSplit, PartyFeatures, TabularData

if TYPE_CHECKING:
    from tpsl_flwr.data.avazu import load_avazu
    from tpsl_flwr.data.criteo import load_criteo

__all__ = [
    "ALL_DATASETS",
    "DATASETS",
    "DEFAULT_DATASET",
    "DEFAULT_HASH_BUCKETS",
    "FILE_DATASETS",
    "DatasetSplit",
    "GeneratedFile",
    "PartyColumns",
    "PartyFeatures",
    "SyntheticCTR",
    "TabularData",
    "binary_auc",
    "hash_tokens",
    "load_avazu",
    "load_criteo",
    "load_dataset",
    "make_split",
    "make_synthetic_ctr",
    "partition_columns",
    "party_features",
    "standardize",
    "stratified_split",
    "write_avazu",
    "write_criteo",
]

_LAZY = {
    "load_avazu": "tpsl_flwr.data.avazu",
    "load_criteo": "tpsl_flwr.data.criteo",
}
"""Exports whose module imports pyarrow (a quarter of a second): loaded on use."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
