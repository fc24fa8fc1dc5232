"""scikit-learn's bundled tables, read column by column from its CSV files.

``sklearn.datasets.load_breast_cancer``/``load_digits`` always parse the target,
so a non-label party may not call them. Here the feature columns and the target
column are read separately (``np.loadtxt(usecols=...)``) straight from the files
scikit-learn ships, located without importing ``sklearn.datasets``:

* ``breast_cancer.csv``: a first line ``569,30,malignant,benign``, then 30
  feature columns and the target (0 = malignant, 1 = benign);
* ``digits.csv.gz``: 64 pixel columns and the target digit.

The values are bitwise those of the sklearn loaders (a test checks it). The
optional ``rows`` subsample is a seeded permutation of the row numbers, so it is
label-independent; record ids stay the row numbers of the full table.
"""

from __future__ import annotations

import importlib.util
import re
from functools import lru_cache
from pathlib import Path

import numpy as np

from tpsl_flwr.errors import ConfigError

__all__ = [
    "BUNDLED",
    "bundled_columns",
    "bundled_features",
    "bundled_labels",
    "bundled_rows",
]

_MEASURES = (
    "radius",
    "texture",
    "perimeter",
    "area",
    "smoothness",
    "compactness",
    "concavity",
    "concave points",
    "symmetry",
    "fractal dimension",
)
_BREAST_CANCER_NAMES = (
    *(f"mean {m}" for m in _MEASURES),
    *(f"{m} error" for m in _MEASURES),
    *(f"worst {m}" for m in _MEASURES),
)
"""sklearn's ``feature_names`` of the breast cancer table, in column order."""

BUNDLED: dict[str, tuple[str, int, int, int]] = {
    "breast-cancer": ("breast_cancer.csv", 1, 30, 2),
    "digits": ("digits.csv.gz", 0, 64, 10),
}
"""Name -> (file, header lines, feature columns, classes)."""


def _snake(name: str) -> str:
    """``"mean radius"`` -> ``"mean_radius"``."""
    return re.sub(r"\W+", "_", name.strip()).lower()


def bundled_columns(name: str) -> tuple[str, ...]:
    """The feature column names of a bundled table (all numeric).

    Parameters
    ----------
    name : {"breast-cancer", "digits"}
        The table.

    Returns
    -------
    tuple of str
        sklearn's ``feature_names`` in snake case (``mean_radius``, ...,
        ``worst_fractal_dimension``; ``pixel_0_0``, ..., ``pixel_7_7``).

    Examples
    --------
    >>> bundled_columns("breast-cancer")[:2], bundled_columns("digits")[-1]
    (('mean_radius', 'mean_texture'), 'pixel_7_7')
    """
    if name == "breast-cancer":
        return tuple(_snake(n) for n in _BREAST_CANCER_NAMES)
    if name == "digits":
        return tuple(f"pixel_{r}_{c}" for r in range(8) for c in range(8))
    raise ConfigError(f"unknown bundled table {name!r}; valid: {list(BUNDLED)}")


def _data_file(name: str) -> Path:
    """The table's file inside the installed scikit-learn (not imported)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"dataset {name!r} needs scikit-learn installed")
    root = Path(next(iter(spec.submodule_search_locations)))
    return root / "datasets" / "data" / BUNDLED[name][0]


@lru_cache(maxsize=4)
def _read(name: str, target: bool) -> np.ndarray:
    """Parse the feature columns, or only the target column, of the whole table."""
    _, header, width, _ = BUNDLED[name]
    cols = (width,) if target else tuple(range(width))
    out = np.loadtxt(
        _data_file(name), delimiter=",", skiprows=header, usecols=cols, ndmin=2
    )
    out.setflags(write=False)
    return out


def bundled_rows(name: str, rows: int | None, seed: int) -> np.ndarray:
    """Record ids kept by the ``rows`` subsample: sorted full-table row numbers.

    Parameters
    ----------
    name : {"breast-cancer", "digits"}
        The table.
    rows : int or None
        Rows to keep (None: all).
    seed : int
        Seed of the permutation (the second stream spawned from ``seed``, as
        :func:`~tpsl_flwr.data.load_dataset` always drew it).

    Returns
    -------
    np.ndarray
        Increasing int64 record ids.

    Raises
    ------
    ConfigError
        If ``rows`` exceeds the table.
    """
    total = 569 if name == "breast-cancer" else 1797
    if rows is None:
        return np.arange(total, dtype=np.int64)
    if rows > total:
        raise ConfigError(
            f"rows={rows} exceeds the {total} rows of {name!r}; rows=0 takes the "
            "whole table (the app's run config sets rows=100000 for synthetic-ctr)"
        )
    data_seed = np.random.SeedSequence(int(seed)).spawn(2)[1]
    perm = np.random.default_rng(data_seed).permutation(total)
    return np.sort(perm[:rows]).astype(np.int64)


def bundled_features(name: str, record_ids: np.ndarray) -> np.ndarray:
    """The raw float64 feature rows of ``record_ids``; the target is never parsed.

    Parameters
    ----------
    name : {"breast-cancer", "digits"}
        The table.
    record_ids : np.ndarray
        Rows to return (from :func:`bundled_rows`).

    Returns
    -------
    np.ndarray
        ``(len(record_ids), d)`` float64.
    """
    return np.asarray(_read(name, False)[record_ids], dtype=np.float64)


def bundled_labels(name: str, record_ids: np.ndarray) -> tuple[np.ndarray, int]:
    """The int64 labels of ``record_ids`` (only the target column is parsed).

    Parameters
    ----------
    name : {"breast-cancer", "digits"}
        The table.
    record_ids : np.ndarray
        Rows to return.

    Returns
    -------
    labels : np.ndarray
        ``(len(record_ids),)`` int64.
    num_classes : int
        2 (breast cancer) or 10 (digits).
    """
    labels = _read(name, True)[record_ids, 0].astype(np.int64)
    return labels, BUNDLED[name][3]
