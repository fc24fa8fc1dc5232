"""The public description of a dataset: settings and column names, no data.

A :class:`DataSpec` holds the settings that fix the records and the id space;
every process of a run (label party and non-label nodes) builds the same one from
the public run config. :func:`dataset_columns` gives the schema without reading
any data or label.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tpsl_flwr.data.builtin import ALL_DATASETS, FILE_DATASETS
from tpsl_flwr.data.bundled import bundled_columns
from tpsl_flwr.data.ctr.formats import AVAZU, CRITEO_CATEGORICAL, CRITEO_NUMERIC
from tpsl_flwr.data.membership import check_fraction
from tpsl_flwr.errors import ConfigError

__all__ = ["DataSpec", "dataset_columns"]

_SPLITS = ("random", "time")
_MAX_BUCKETS = 2**31 - 1
_SYNTHETIC_COLUMNS = 8
"""Numeric and categorical columns of ``synthetic-ctr``."""


@dataclass(frozen=True)
class DataSpec:
    """Public settings that fix the data and the id space (no secret in it).

    Parameters
    ----------
    dataset : str
        One of :data:`~tpsl_flwr.data.ALL_DATASETS`.
    data_path : str
        The file of ``"criteo"``/``"avazu"`` (required there, empty otherwise).
    rows : int, optional
        As for :func:`~tpsl_flwr.data.load_dataset`.
    seed : int
        Seed of the generation, the subsample and the random split.
    test_fraction : float
        Probability of a record being a test record, in ``(0, 1)``.
    split : {"random", "time"}
        ``"time"`` only for ``"criteo"``/``"avazu"``.
    hash_buckets : int, optional
        Codes per hashed column of ``"criteo"``/``"avazu"`` (default
        :data:`~tpsl_flwr.data.DEFAULT_HASH_BUCKETS`).
    positive_rate : float, optional
        Target positive rate of ``"synthetic-ctr"`` (default 0.1); it shapes the
        labels only, so party views ignore it.

    Raises
    ------
    ConfigError
        Naming the bad field and value.

    Examples
    --------
    >>> DataSpec("breast-cancer", rows=100).load_dataset_kwargs()["rows"]
    100
    """

    dataset: str
    data_path: str = ""
    rows: int | None = None
    seed: int = 0
    test_fraction: float = 0.2
    split: str = "random"
    hash_buckets: int | None = None
    positive_rate: float | None = None

    def __post_init__(self) -> None:
        name = self.dataset
        if name not in ALL_DATASETS:
            raise ConfigError(
                f"unknown dataset {name!r}; valid names: {list(ALL_DATASETS)}"
            )
        if not isinstance(self.data_path, str):
            raise ConfigError(f"data_path must be a str, got {self.data_path!r}")
        is_file = name in FILE_DATASETS
        if is_file and not self.data_path:
            raise ConfigError(f"dataset {name!r} reads a file: give data_path")
        if not is_file and self.data_path:
            raise ConfigError(
                f"data_path applies only to {list(FILE_DATASETS)}, got "
                f"data_path={self.data_path!r} for {name!r}"
            )
        rows = self.rows
        if rows is not None and (
            isinstance(rows, bool) or not isinstance(rows, int | np.integer) or rows < 1
        ):
            raise ConfigError(f"rows must be a positive int or None, got {rows!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int | np.integer):
            raise ConfigError(f"seed must be an int, got {self.seed!r}")
        check_fraction(self.test_fraction)
        if self.split not in _SPLITS:
            raise ConfigError(
                f"split must be one of {list(_SPLITS)}, got {self.split!r}"
            )
        if self.split == "time" and not is_file:
            raise ConfigError(
                f"split={self.split!r} applies only to {list(FILE_DATASETS)}; "
                f"{name!r} takes split='random'"
            )
        b = self.hash_buckets
        if b is not None:
            if not is_file:
                raise ConfigError(
                    f"hash_buckets applies only to {list(FILE_DATASETS)}, got "
                    f"hash_buckets={b!r} for {name!r}"
                )
            if isinstance(b, bool) or not isinstance(b, int | np.integer):
                raise ConfigError(f"hash_buckets must be an int or None, got {b!r}")
            if not 2 <= b <= _MAX_BUCKETS:
                raise ConfigError(
                    f"hash_buckets must lie in [2, {_MAX_BUCKETS}], got {b}"
                )
        p = self.positive_rate
        if p is not None:
            if name != "synthetic-ctr":
                raise ConfigError(
                    f"positive_rate applies only to 'synthetic-ctr', got "
                    f"positive_rate={p!r} for {name!r}"
                )
            if isinstance(p, bool) or not isinstance(p, int | float) or not 0 < p < 1:
                raise ConfigError(f"positive_rate must be in (0, 1), got {p!r}")

    def load_dataset_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the equivalent :func:`load_dataset` call."""
        kwargs: dict[str, Any] = {
            "name": self.dataset,
            "rows": self.rows,
            "seed": self.seed,
            "test_fraction": self.test_fraction,
        }
        if self.dataset in FILE_DATASETS:
            kwargs.update(data_path=self.data_path, split=self.split)
            kwargs["hash_buckets"] = self.hash_buckets
        elif self.positive_rate is not None:
            kwargs["positive_rate"] = self.positive_rate
        return kwargs


def dataset_columns(spec: DataSpec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The public schema: numeric and categorical column names, in table order.

    Reads no data and no label (the names are fixed by the dataset).

    Parameters
    ----------
    spec : DataSpec
        The data.

    Returns
    -------
    numeric_names, categorical_names : tuple of str
        As :func:`~tpsl_flwr.data.load_dataset`'s tables name them; feed them to
        :func:`~tpsl_flwr.data.partition_columns`.

    Examples
    --------
    >>> num, cat = dataset_columns(DataSpec("synthetic-ctr"))
    >>> num[:2], cat[-1]
    (('num_0', 'num_1'), 'cat_7')
    """
    name = spec.dataset
    if name == "synthetic-ctr":
        return (
            tuple(f"num_{j}" for j in range(_SYNTHETIC_COLUMNS)),
            tuple(f"cat_{j}" for j in range(_SYNTHETIC_COLUMNS)),
        )
    if name == "criteo":
        return CRITEO_NUMERIC, CRITEO_CATEGORICAL
    if name == "avazu":
        assert AVAZU.time is not None
        return (), (AVAZU.time, *AVAZU.categorical)
    return bundled_columns(name), ()
