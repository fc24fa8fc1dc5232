"""Data layer: labelled tables, vertical partitions, built-in datasets.

Core module: numpy and scikit-learn only (no torch, no flwr). The label party
holds a :class:`TabularData` (features and labels); each non-label party receives
only a :class:`PartyFeatures` slice chosen by :func:`partition_columns`.
"""

from tpsl_flwr.data.builtin import DATASETS, DEFAULT_DATASET, load_dataset
from tpsl_flwr.data.partition import PartyColumns, partition_columns, party_features
from tpsl_flwr.data.preprocess import (
    binary_auc,
    make_split,
    standardize,
    stratified_split,
)
from tpsl_flwr.data.synthetic import SyntheticCTR, make_synthetic_ctr
from tpsl_flwr.data.tabular import DatasetSplit, PartyFeatures, TabularData

__all__ = [
    "DATASETS",
    "DEFAULT_DATASET",
    "DatasetSplit",
    "PartyColumns",
    "PartyFeatures",
    "SyntheticCTR",
    "TabularData",
    "binary_auc",
    "load_dataset",
    "make_split",
    "make_synthetic_ctr",
    "partition_columns",
    "party_features",
    "standardize",
    "stratified_split",
]
