"""``tpsl-flwr sweep``: a grid of experiments from a TOML file, resumable.

Every unfinished run, then the paper's tables and Figure 5
(:mod:`tpsl_flwr.experiments.sweep`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tpsl_flwr.cli.flags import ENGINE_HELP, add_release_flags
from tpsl_flwr.experiments.run import ENGINES

__all__ = ["add_parser", "cmd_sweep"]


def add_parser(subparsers: Any) -> None:
    """Add ``sweep`` to the CLI's ``subparsers``."""
    sweep = subparsers.add_parser(
        "sweep",
        help="run a grid of experiments from a TOML file (resumable)",
        description=(
            "Run every experiment of a [grid] x [experiment] TOML file, skipping "
            "finished runs, and write runs.csv, tables.md and the Figure 5 plots "
            "(and utility_vs_rows.png when grid.rows varies the data size)."
        ),
    )
    sweep.add_argument("config", help="the sweep TOML file")
    sweep.add_argument("--out-dir", default=None, help="default: sweep-<config name>")
    sweep.add_argument("--engine", choices=ENGINES, default="local", help=ENGINE_HELP)
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar")
    sweep.add_argument(
        "--data-path",
        default=None,
        help="the Criteo/Avazu file, in place of the config's [experiment] data-path",
    )
    sweep.add_argument(
        "--cache-dir",
        default=None,
        help="folder of the encoded-file cache, in place of the config's "
        "[experiment] cache-dir (default: .tpsl-cache beside the data file)",
    )
    add_release_flags(sweep)
    sweep.set_defaults(handler=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    """``sweep``: every unfinished run of a grid, then its tables and plots."""
    from tpsl_flwr.experiments.sweep.run import describe, load_sweep, run_sweep

    given = {"data-path": args.data_path, "cache-dir": args.cache_dir}
    grid = load_sweep(args.config, {k: v for k, v in given.items() if v is not None})
    out = args.out_dir or f"sweep-{Path(args.config).stem}"
    print(f"tpsl-flwr sweep: {describe(grid)}; out-dir {out}", file=sys.stderr)
    done = run_sweep(
        grid,
        out,
        engine=args.engine,
        progress=not args.no_progress,
        new_release=args.new_release,
        privacy_budget=args.privacy_budget,
        release=args.release,
        unprotected_release=args.unprotected_release,
    )
    print(
        f"tpsl-flwr sweep: ran {len(done['ran'])}, skipped {len(done['skipped'])} "
        f"finished; wrote {', '.join(str(p) for p in done['files'])}"
    )
    return 0
