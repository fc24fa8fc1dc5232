"""Write the example's data: one label file and one feature file per party.

``make_classification`` (4000 rows, 12 columns, 4 balanced classes,
``class_sep=1.5``, seed 0),
split vertically over three non-label parties, with categorical columns made by
cutting numeric ones into 8 equal-frequency bins (codes ``0..7``):

* party 0: numeric columns ``x0..x3`` (numeric only);
* party 1: categorical columns ``c4..c7`` (binned columns 4-7; categorical only);
* party 2: numeric ``x8, x9`` and categorical ``c10, c11`` (mixed).

The label party gets the 4-class label. Every file has a ``record_id`` column
(the row of the generated table) and its rows in its own order: parties align
on record ids, not on rows. Column names say the kind: ``x*`` numeric, ``c*``
categorical.

Usage::

    python prepare_data.py [--out-dir data] [--rows 4000]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from sklearn.datasets import make_classification

HERE = Path(__file__).resolve().parent
BINS = 8
"""Categories of every categorical column (codes ``0..BINS-1``)."""
PARTIES = (
    {"numeric": (0, 1, 2, 3), "categorical": ()},
    {"numeric": (), "categorical": (4, 5, 6, 7)},
    {"numeric": (8, 9), "categorical": (10, 11)},
)
"""Each party's generated columns, kept numeric or cut into categories."""


def write_csv(path: Path, record_ids: np.ndarray, columns: dict, seed: int) -> None:
    """Write ``record_id`` and ``columns`` as CSV, rows in a shuffled order."""
    order = np.random.default_rng(seed).permutation(record_ids.size)
    header = ",".join(["record_id", *columns])
    formats = ["%d"] + [
        "%d" if np.issubdtype(v.dtype, np.integer) else "%.6f" for v in columns.values()
    ]
    table = np.column_stack([record_ids, *columns.values()])[order]
    np.savetxt(path, table, delimiter=",", header=header, comments="", fmt=formats)


def categories(column: np.ndarray) -> np.ndarray:
    """``column`` cut into :data:`BINS` equal-frequency bins (codes ``0..7``)."""
    edges = np.quantile(column, np.linspace(0, 1, BINS + 1)[1:-1])
    return np.searchsorted(edges, column).astype(np.int64)


def prepare(out_dir: Path, rows: int = 4000) -> list[Path]:
    """Generate the data and write ``labels.csv`` and ``party-<i>.csv`` files.

    Returns
    -------
    list of Path
        The files written (the label file first).
    """
    x, y = make_classification(
        n_samples=rows,
        n_features=12,
        n_informative=9,
        n_redundant=1,
        n_classes=4,
        n_clusters_per_class=1,
        class_sep=1.5,
        random_state=0,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    ids = np.arange(rows, dtype=np.int64)
    written = [out_dir / "labels.csv"]
    write_csv(written[0], ids, {"label": y.astype(np.int64)}, seed=0)
    for i, party in enumerate(PARTIES):
        columns = {f"x{c}": x[:, c] for c in party["numeric"]}
        columns.update({f"c{c}": categories(x[:, c]) for c in party["categorical"]})
        path = out_dir / f"party-{i}.csv"
        write_csv(path, ids, columns, seed=i + 1)
        written.append(path)
    return written


def main() -> None:
    """Command line: write the files and say where they are."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", type=Path, default=HERE / "data")
    parser.add_argument("--rows", type=int, default=4000)
    args = parser.parse_args()
    for path in prepare(args.out_dir.resolve(), args.rows):
        print(path)


if __name__ == "__main__":
    main()
