"""Write the example's data: one label file and one feature file per party.

``make_classification`` (4000 rows, 16 columns, 4 balanced classes) split
vertically: party 0 gets columns 0-7, party 1 columns 8-15; the label party gets
the labels. Every file has a ``record_id`` column (the row of the generated table)
and its rows in its own order: parties align on record ids, not on rows.

Usage::

    python prepare_data.py [--out-dir data] [--num-parties 2] [--rows 4000]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from sklearn.datasets import make_classification

HERE = Path(__file__).resolve().parent


def write_csv(path: Path, record_ids: np.ndarray, columns: dict, seed: int) -> None:
    """Write ``record_id`` and ``columns`` as CSV, rows in a shuffled order."""
    order = np.random.default_rng(seed).permutation(record_ids.size)
    header = ",".join(["record_id", *columns])
    formats = ["%d"] + [
        "%d" if np.issubdtype(v.dtype, np.integer) else "%.6f" for v in columns.values()
    ]
    table = np.column_stack([record_ids, *columns.values()])[order]
    np.savetxt(path, table, delimiter=",", header=header, comments="", fmt=formats)


def prepare(out_dir: Path, num_parties: int = 2, rows: int = 4000) -> list[Path]:
    """Generate the data and write ``labels.csv`` and ``party-<i>.csv`` files.

    Returns
    -------
    list of Path
        The files written (the label file first).
    """
    x, y = make_classification(
        n_samples=rows,
        n_features=16,
        n_informative=8,
        n_redundant=2,
        n_classes=4,
        n_clusters_per_class=1,
        random_state=0,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    ids = np.arange(rows, dtype=np.int64)
    written = [out_dir / "labels.csv"]
    write_csv(written[0], ids, {"label": y.astype(np.int64)}, seed=0)
    for i, cols in enumerate(np.array_split(np.arange(x.shape[1]), num_parties)):
        path = out_dir / f"party-{i}.csv"
        write_csv(path, ids, {f"x{c}": x[:, c] for c in cols}, seed=i + 1)
        written.append(path)
    return written


def main() -> None:
    """Command line: write the files and say where they are."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", type=Path, default=HERE / "data")
    parser.add_argument("--num-parties", type=int, default=2)
    parser.add_argument("--rows", type=int, default=4000)
    args = parser.parse_args()
    for path in prepare(args.out_dir.resolve(), args.num_parties, args.rows):
        print(path)


if __name__ == "__main__":
    main()
