"""``tpsl-flwr sweep``: a grid of experiments from a TOML file, and its report.

* ``sweep run CONFIG`` (or ``sweep CONFIG``, the same): every unfinished run
  of the grid, then ``runs.csv``, the tables (Markdown, LaTeX, CSV) and the
  figures (PNG, PDF, JSON) (:mod:`tpsl_flwr.experiments.sweep`).
* ``sweep report DIR [DIR ...] --out-dir OUT``: one set of tables and figures
  over the runs of several sweep folders of the same data and settings
  (:mod:`tpsl_flwr.experiments.sweep.merge`); nothing is run.

``--epoch best|last`` picks the epoch whose values are shown.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tpsl_flwr.cli.flags import ENGINE_HELP, add_release_flags
from tpsl_flwr.experiments.run import ENGINES

__all__ = ["ACTIONS", "add_parser", "cmd_report", "cmd_sweep", "with_run_default"]

ACTIONS = ("run", "report")
"""``sweep``'s actions; ``sweep CONFIG`` is ``sweep run CONFIG``."""
EPOCH_HELP = (
    "the epoch whose values the CSV, tables and figures show: best (the one the "
    "label party kept by its validation score; the last where a run held out no "
    "validation set) or last (default: best)"
)


def with_run_default(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``run`` after ``sweep`` where no action follows it.

    Keeps ``tpsl-flwr sweep CONFIG`` working as ``tpsl-flwr sweep run CONFIG``.

    Examples
    --------
    >>> with_run_default(["sweep", "grid.toml", "--no-progress"])
    ['sweep', 'run', 'grid.toml', '--no-progress']
    >>> with_run_default(["sweep", "report", "a", "--out-dir", "b"])[:2]
    ['sweep', 'report']
    >>> with_run_default(["sweep", "--help"]), with_run_default(["audit"])
    (['sweep', '--help'], ['audit'])
    """
    argv = list(argv)
    if argv[:1] != ["sweep"] or len(argv) < 2:
        return argv
    if argv[1] in (*ACTIONS, "-h", "--help"):
        return argv
    return ["sweep", "run", *argv[1:]]


def add_parser(subparsers: Any) -> None:
    """Add ``sweep run`` and ``sweep report`` to the CLI's ``subparsers``."""
    sweep = subparsers.add_parser(
        "sweep",
        help="run a grid of experiments from a TOML file (resumable); report sweeps",
        description=__doc__.splitlines()[0],
        epilog="`tpsl-flwr sweep CONFIG` is short for `tpsl-flwr sweep run CONFIG`.",
    )
    actions = sweep.add_subparsers(dest="sweep_command", required=True)
    run = actions.add_parser(
        "run",
        help="run every unfinished experiment of a grid, then its report",
        description=(
            "Run every experiment of a [grid] x [experiment] TOML file, skipping "
            "finished runs, and write runs.csv, tables.md/.tex, summary.csv and "
            "the figures (fig5_utility_vs_epsilon, fig5_utility_vs_sda, "
            "attacks_vs_epsilon; PNG, PDF and JSON; utility_vs_rows when "
            "grid.rows varies the data size)."
        ),
    )
    run.add_argument("config", help="the sweep TOML file")
    run.add_argument("--out-dir", default=None, help="default: sweep-<config name>")
    run.add_argument("--engine", choices=ENGINES, default="local", help=ENGINE_HELP)
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument(
        "--data-path",
        default=None,
        help="the Criteo/Avazu file, in place of the config's [experiment] data-path",
    )
    run.add_argument(
        "--cache-dir",
        default=None,
        help="folder of the encoded-file cache, in place of the config's "
        "[experiment] cache-dir (default: .tpsl-cache beside the data file)",
    )
    run.add_argument(
        "--epoch", choices=("best", "last"), default="best", help=EPOCH_HELP
    )
    add_release_flags(run)
    run.set_defaults(handler=cmd_sweep)
    report = actions.add_parser(
        "report",
        help="one set of tables and figures over several sweep folders",
        description=(
            "Merge the finished runs of sweep folders of the same data and "
            "settings into one runs.csv, one set of tables and one set of "
            "figures (refused, naming the setting, where they differ)."
        ),
    )
    report.add_argument("dirs", nargs="+", metavar="DIR", help="sweep folders")
    report.add_argument("--out-dir", required=True, help="where the report goes")
    report.add_argument(
        "--epoch", choices=("best", "last"), default="best", help=EPOCH_HELP
    )
    report.set_defaults(handler=cmd_report)


def cmd_sweep(args: argparse.Namespace) -> int:
    """``sweep run``: every unfinished run of a grid, then its tables and plots."""
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
        epoch=args.epoch,
    )
    print(
        f"tpsl-flwr sweep: ran {len(done['ran'])}, skipped {len(done['skipped'])} "
        f"finished; wrote {', '.join(str(p) for p in done['files'])}"
    )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """``sweep report``: one report over the runs of several sweep folders."""
    from tpsl_flwr.experiments.sweep.merge import report_sweeps

    done = report_sweeps(args.dirs, args.out_dir, epoch=args.epoch)
    print(
        f"tpsl-flwr sweep report: {done['runs']} runs from "
        f"{len(done['folders'])} folder(s); wrote "
        f"{', '.join(str(p) for p in done['files'])}"
    )
    return 0
