"""Built-in datasets by name: synthetic CTR and two scikit-learn bundled tables.

Every loader returns a :class:`~tpsl_flwr.data.tabular.DatasetSplit` made the same
way: optional seeded row subsample, seeded stratified train/test split, numeric
columns standardized with train statistics. Nothing is downloaded.
"""

from __future__ import annotations

import re

import numpy as np

from tpsl_flwr.data.preprocess import make_split
from tpsl_flwr.data.synthetic import make_synthetic_ctr
from tpsl_flwr.data.tabular import DatasetSplit
from tpsl_flwr.errors import ConfigError

__all__ = ["DATASETS", "DEFAULT_DATASET", "load_dataset"]

DATASETS: tuple[str, ...] = ("synthetic-ctr", "breast-cancer", "digits")
"""Names :func:`load_dataset` accepts."""
DEFAULT_DATASET = "synthetic-ctr"
"""The dataset used when none is named."""
SYNTHETIC_DEFAULT_ROWS = 20_000
"""Rows of ``synthetic-ctr`` when ``rows`` is None."""
SYNTHETIC_DEFAULT_POSITIVE_RATE = 0.1
"""Positive rate of ``synthetic-ctr`` when ``positive_rate`` is None."""


def load_dataset(
    name: str = DEFAULT_DATASET,
    rows: int | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
    positive_rate: float | None = None,
) -> DatasetSplit:
    """Load a built-in dataset, split and standardized.

    Parameters
    ----------
    name : str
        One of :data:`DATASETS`: ``"synthetic-ctr"`` (binary, 8 numeric and 8
        categorical columns; see :func:`~tpsl_flwr.data.make_synthetic_ctr`),
        ``"breast-cancer"`` (569 rows, 30 numeric columns, binary with sklearn's
        coding: 1 = benign) or ``"digits"`` (1797 rows, 64 pixel columns,
        10 classes).
    rows : int, optional
        Rows to generate (synthetic; default 20 000) or to subsample without
        replacement (sklearn datasets; default all, at most all).
    seed : int
        Seed of the generation, the subsample and the split.
    test_fraction : float
        Fraction of each class held out for test, in ``(0, 1)``.
    positive_rate : float, optional
        Target positive rate of ``synthetic-ctr`` (default 0.1); not accepted for
        the other datasets.

    Returns
    -------
    DatasetSplit
        ``info`` holds ``rows``, ``train_rows``, ``test_rows``, ``num_classes``,
        ``num_numeric``, ``num_categorical``, ``seed``, ``positive_rate`` (binary),
        and for ``synthetic-ctr`` also ``bayes_test_auc`` (test AUC of the true
        probability), ``target_positive_rate`` and ``intercept``.

    Raises
    ------
    ConfigError
        If ``name`` is unknown (the message lists the valid names), ``rows`` is
        not a positive int or exceeds a bundled dataset, ``test_fraction`` is not
        in ``(0, 1)``, or ``positive_rate`` is given for a non-synthetic dataset.

    Examples
    --------
    >>> split = load_dataset("breast-cancer", seed=0)
    >>> split.train.numeric.shape[1], split.num_classes, split.info["rows"]
    (30, 2, 569)
    """
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; valid names: {list(DATASETS)}")
    if rows is not None and (
        isinstance(rows, bool) or not isinstance(rows, int | np.integer) or rows <= 0
    ):
        raise ConfigError(f"rows must be a positive int or None, got {rows!r}")
    if not isinstance(seed, int | np.integer) or isinstance(seed, bool):
        raise ConfigError(f"seed must be an int, got {seed!r}")
    split_rng, data_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(int(seed)).spawn(2)
    )
    if name == "synthetic-ctr":
        split = _synthetic(rows, data_rng, split_rng, test_fraction, positive_rate)
    else:
        if positive_rate is not None:
            raise ConfigError(
                f"positive_rate applies only to 'synthetic-ctr', got "
                f"positive_rate={positive_rate!r} for {name!r}"
            )
        split = _bundled(name, rows, data_rng, split_rng, test_fraction)
    split.info["seed"] = int(seed)
    return split


def _synthetic(
    rows: int | None,
    data_rng: np.random.Generator,
    split_rng: np.random.Generator,
    test_fraction: float,
    positive_rate: float | None,
) -> DatasetSplit:
    """Generate, split and describe the synthetic CTR table."""
    target = SYNTHETIC_DEFAULT_POSITIVE_RATE if positive_rate is None else positive_rate
    raw = make_synthetic_ctr(
        rows=SYNTHETIC_DEFAULT_ROWS if rows is None else int(rows),
        positive_rate=target,
        seed=data_rng,
    )
    split = make_split(
        "synthetic-ctr",
        raw.numeric,
        raw.categorical,
        raw.cardinalities,
        raw.labels,
        2,
        raw.numeric_names,
        raw.categorical_names,
        test_fraction,
        split_rng,
        bayes_scores=raw.logits,
    )
    split.info["target_positive_rate"] = float(target)
    split.info["intercept"] = raw.intercept
    return split


def _bundled(
    name: str,
    rows: int | None,
    data_rng: np.random.Generator,
    split_rng: np.random.Generator,
    test_fraction: float,
) -> DatasetSplit:
    """Load a scikit-learn bundled table, subsample, split."""
    # Imported here: sklearn.datasets costs about a second to import, and parties
    # that only use synthetic data should not pay it.
    from sklearn.datasets import load_breast_cancer, load_digits

    bunch = load_breast_cancer() if name == "breast-cancer" else load_digits()
    x = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.int64)
    if rows is not None:
        if rows > y.shape[0]:
            raise ConfigError(f"rows={rows} exceeds the {y.shape[0]} rows of {name!r}")
        keep = np.sort(data_rng.permutation(y.shape[0])[:rows])
        x, y = x[keep], y[keep]
    names = tuple(_snake(str(f)) for f in bunch.feature_names)
    return make_split(
        name,
        x,
        np.empty((y.shape[0], 0), dtype=np.int64),
        (),
        y,
        len(bunch.target_names),
        names,
        (),
        test_fraction,
        split_rng,
    )


def _snake(name: str) -> str:
    """``"mean radius"`` -> ``"mean_radius"``."""
    return re.sub(r"\W+", "_", name.strip()).lower()
