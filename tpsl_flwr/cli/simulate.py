"""``tpsl-flwr simulate``: one experiment on the in-process, Ray or deployment engine.

One flag per run-config key, of the same name (:mod:`~tpsl_flwr.cli.flags`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tpsl_flwr.cli.flags import ENGINE_HELP, OVERWRITE_HELP, add_config_flags
from tpsl_flwr.cli.output import summary_line, write_json
from tpsl_flwr.experiments.run import ENGINES

__all__ = ["SIMULATE_DEFAULTS", "add_parser", "cmd_simulate"]

SIMULATE_DEFAULTS = {"audit": True}
"""``simulate``'s defaults that differ from the dataclass's (and the run config's)."""
SIMULATE_USAGE = "%(prog)s [--KEY VALUE ...] [--engine ENGINE] [--json PATH]"


def add_parser(subparsers: Any) -> None:
    """Add ``simulate`` to the CLI's ``subparsers``."""
    sim = subparsers.add_parser(
        "simulate",
        help="run one TPSL experiment (in-process, Ray or local deployment)",
        usage=SIMULATE_USAGE,
        description=(
            "Train a split model with GradPerturb and write the results JSON. "
            "Every run-config key is a flag of the same name; unset flags take "
            "the defaults of tpsl_flwr.experiments.config, except --audit (on "
            "here, off in the run config)."
        ),
    )
    sim.add_argument(
        "--engine",
        choices=ENGINES,
        default="local",
        help=f"{ENGINE_HELP} (default: %(default)s)",
    )
    sim.add_argument(
        "--json",
        metavar="PATH",
        default=None,
        help="also write the results JSON here ('-' = stdout, quiet)",
    )
    sim.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    add_config_flags(
        sim,
        defaults=SIMULATE_DEFAULTS,
        notes={"audit": "on by default in simulate, off in the run config"},
    )
    sim.set_defaults(handler=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    """``simulate``: one experiment on ``--engine``, results to ``--json``.

    ``--engine deployment`` runs it on a local SuperLink and SuperNodes
    (``--secure``: over TLS with authenticated SuperNodes).
    """
    from tpsl_flwr.cli.flags import config_from_args
    from tpsl_flwr.experiments.run import run_experiment

    cfg = config_from_args(args)
    quiet = args.json == "-"
    results = run_experiment(
        cfg,
        args.engine,
        echo=None if quiet else sys.stdout,
        overwrite=args.overwrite,
        secure=getattr(args, "secure", False),
        executor=getattr(args, "executor", True),
    )
    write_json(results, args.json)
    print(summary_line("simulate", results), file=sys.stderr if quiet else sys.stdout)
    return 0
