"""Criteo loader throughput and peak memory, beside a plain ``pandas.read_csv``.

Writes a Criteo-format ``train.txt`` (1M rows by default) into a temporary folder
with the calibrated generator, then measures, each in its own subprocess so that
peak resident memory (``getrusage`` ``ru_maxrss``) never mixes:

* ``import only``: the interpreter plus the loader's imports (the floor of every
  row below);
* ``ours, cold``: ``load_criteo`` with an empty cache (read, parse, hash, write the
  cache, split, standardize);
* ``ours, cold ingest``: the encoding alone with an empty cache (read, parse, hash,
  write the cache; no split), ``tpsl_flwr.data.ctr.files.encode_file``;
* ``ours, warm``: the same call again (memory-mapped cache, split, standardize);
* ``ours, no cache``: ``cache=False``;
* ``pandas.read_csv``: the whole file into a DataFrame, default dtypes (parsing
  only: no hashing, no split), when pandas is installed.

With ``--readers``, also the raw streaming readers the loader could be built on,
every column as text, parsing only: pyarrow's ``open_csv`` (the one used, with
exactly the options the loader passes it:
``tpsl_flwr.data.ctr.reader.csv_options``, every column as bytes, nothing done
with the batches), polars' ``scan_csv(...).collect_batches()`` and pandas
``read_csv(chunksize=)`` (each when installed); then the ratios of ours, cold
(and of the ingest alone) to pyarrow's parse-only rows/s, from this one run.

Usage: ``python bench/loader.py [--rows N] [--gz] [--readers] [--keep DIR]``.
Targets: peak RSS of ours under 2 GB for 1M rows; ours, cold at >= 0.7x the rows/s
of pyarrow's parse-only (both printed side by side, from the same run).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NAMES = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]
KINDS = ("import", "cold", "ingest", "warm", "nocache", "pandas")
READERS = ("pyarrow-stream", "polars-stream", "pandas-chunks")
LABELS = {
    "import": "import only",
    "cold": "ours, cold (cache written)",
    "ingest": "ours, cold ingest (no split)",
    "warm": "ours, warm (from cache)",
    "nocache": "ours, cache=False",
    "pandas": "pandas.read_csv (parse only)",
    "pyarrow-stream": "reader: pyarrow open_csv, text",
    "polars-stream": "reader: polars scan_csv, text",
    "pandas-chunks": "reader: pandas chunks, text",
}
CHUNK_ROWS = 100_000


def _read_raw(kind: str, path: str) -> int:
    """Stream the file with a raw reader, every column as text; return rows."""
    rows = 0
    if kind == "pyarrow-stream":
        import pyarrow.csv as pacsv

        from tpsl_flwr.data.ctr.formats import CRITEO_TSV
        from tpsl_flwr.data.ctr.reader import csv_options

        # The loader's own options (all columns, as bytes): its parse, nothing more.
        read, parse, convert = csv_options(CRITEO_TSV, NAMES)
        reader = pacsv.open_csv(path, read, parse, convert)
        rows = sum(batch.num_rows for batch in reader)
    elif kind == "polars-stream":
        import polars as pl

        lf = pl.scan_csv(
            path, has_header=False, separator="\t", new_columns=NAMES,
            infer_schema=False, quote_char=None,
        )  # fmt: skip
        rows = sum(df.height for df in lf.collect_batches(chunk_size=CHUNK_ROWS))
    elif kind == "pandas-chunks":
        import pandas as pd

        chunks = pd.read_csv(
            path, sep="\t", header=None, names=NAMES, dtype=str, na_filter=False,
            chunksize=CHUNK_ROWS,
        )  # fmt: skip
        rows = sum(len(df) for df in chunks)
    return rows


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(kind: str, path: str, cache_dir: str) -> dict[str, float]:
    """Run one measurement in this process; return its numbers."""
    wall, cpu = time.perf_counter(), _cpu()
    rows = 0
    if kind in READERS:
        module = {"pyarrow-stream": "pyarrow.csv", "polars-stream": "polars"}
        importlib.import_module(module.get(kind, "pandas"))
        if kind == "pyarrow-stream":
            importlib.import_module("tpsl_flwr.data.ctr.reader")
        wall, cpu = time.perf_counter(), _cpu()
        rows = _read_raw(kind, path)
    elif kind == "pandas":
        import pandas as pd

        wall, cpu = time.perf_counter(), _cpu()
        sep = "," if path.endswith(".csv") else "\t"
        rows = len(pd.read_csv(path, sep=sep, header=None, names=NAMES))
    elif kind == "ingest":
        from tpsl_flwr.data.ctr.files import EncodeOptions, encode_file
        from tpsl_flwr.data.ctr.formats import CRITEO_TSV
        from tpsl_flwr.data.ctr.load import resolve_buckets

        opts = EncodeOptions(buckets=resolve_buckets(2**15, CRITEO_TSV.categorical))
        wall, cpu = time.perf_counter(), _cpu()
        enc = encode_file(
            Path(path), CRITEO_TSV, opts, cache=True, cache_dir=Path(cache_dir) / "i"
        )
        rows = int(enc.meta["rows"])
    else:
        from tpsl_flwr.data.ctr.criteo import load_criteo

        if kind != "import":
            wall, cpu = time.perf_counter(), _cpu()
            split = load_criteo(path, cache=kind != "nocache", cache_dir=cache_dir)
            rows = int(split.info["rows"])
            if (kind == "warm") != bool(split.info["cache_hit"]):
                raise SystemExit(
                    f"{kind}: unexpected cache_hit={split.info['cache_hit']}"
                )
    return {
        "rows": rows,
        "wall_s": time.perf_counter() - wall,
        "cpu_s": _cpu() - cpu,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _run_child(kind: str, path: Path, cache_dir: Path) -> dict[str, float] | None:
    cmd = [sys.executable, __file__, "--measure", kind, str(path), str(cache_dir)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        print(f"{kind}: failed: {out.stderr.strip().splitlines()[-1:]}")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--gz", action="store_true", help="write train.txt.gz")
    parser.add_argument("--readers", action="store_true", help="also raw readers")
    parser.add_argument("--keep", help="write the file here and keep it")
    parser.add_argument("--measure", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return

    from tpsl_flwr.testing.ctr_generator import write_criteo

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep) if args.keep else Path(tmp)
        path = folder / ("train.txt.gz" if args.gz else "train.txt")
        start = time.perf_counter()
        gen = write_criteo(path, args.rows, seed=0)
        took = time.perf_counter() - start
        size = os.path.getsize(path) / 2**20
        print(
            f"generated {gen.rows} rows ({size:.0f} MiB, positive rate "
            f"{gen.positive_rate:.3f}) in {took:.1f} s ({gen.rows / took:,.0f} rows/s)"
        )
        cache_dir = Path(tmp) / "cache"
        results = {}
        for kind in KINDS + (READERS if args.readers else ()):
            if args.gz and kind not in ("import", "cold", "warm", "nocache"):
                continue
            results[kind] = _run_child(kind, path, cache_dir)
        print(f"{os.cpu_count()} CPUs; each row is its own subprocess")
        head = ("method", "rows/s", "wall s", "CPU s", "peak RSS MB")
        print(
            f"{head[0]:32s} {head[1]:>12s} {head[2]:>8s} {head[3]:>8s} {head[4]:>12s}"
        )
        for kind, r in results.items():
            if r is None:
                continue
            rate = f"{r['rows'] / r['wall_s']:,.0f}" if r["rows"] else "-"
            print(
                f"{LABELS[kind]:32s} {rate:>12s} {r['wall_s']:8.2f} {r['cpu_s']:8.2f} "
                f"{r['peak_rss_mb']:12.0f}"
            )
        base = results.get("pyarrow-stream")
        if base:
            for kind in ("cold", "ingest"):
                r = results.get(kind)
                if r:
                    ratio = (r["rows"] / r["wall_s"]) / (base["rows"] / base["wall_s"])
                    print(f"{LABELS[kind]} / pyarrow parse-only rows/s: {ratio:.2f}x")


if __name__ == "__main__":
    main()
