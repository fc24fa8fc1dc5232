"""The ``tpsl-flwr`` command line.

Sub-commands:

* ``audit`` — measure a mechanism with the white-box shortest-distance attack
  and check it against the ``epsilon``-DP ceiling (exit 1 on a violation).
* ``simulate`` — one experiment on the in-process or the Ray engine; one flag
  per run-config key, of the same name (:mod:`~tpsl_flwr.cli.flags`).
* ``sweep`` — a grid of experiments from a TOML file, resumable, with the
  paper's tables and Figure 5 (:mod:`tpsl_flwr.experiments.sweep.run`).
* ``flower-run`` — ``flwr run`` of the app on Flower's Ray simulation, offline,
  with every process it started ended afterwards.
* ``keygen`` — a noise key in the label party's private folder.
* ``ledger`` — the privacy ledger: every release of each label set, totals;
  ``ledger acknowledge`` for a further release (:mod:`~tpsl_flwr.release.ledger`).
* ``attack`` — the black-box attacks on a recorded transcript, offline.

The handlers are in :mod:`~tpsl_flwr.cli.commands`. Bad input
gives a one-line message naming the value and exit status 2, never a
traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from tpsl_flwr.cli import commands
from tpsl_flwr.cli.commands import EXIT_USAGE, EXIT_VIOLATION
from tpsl_flwr.cli.flags import add_config_flags, integer, number
from tpsl_flwr.cli.ledger import add_ledger_parser
from tpsl_flwr.errors import TPSLError
from tpsl_flwr.experiments.run import ENGINES
from tpsl_flwr.experiments.run_folder import one_line_error
from tpsl_flwr.privacy.mechanisms import MECHANISMS
from tpsl_flwr.simulations.party_worker import add_party_parser

__all__ = ["EXIT_USAGE", "EXIT_VIOLATION", "build_parser", "main"]

SIMULATE_DEFAULTS = {"audit": True}
"""``simulate``'s defaults that differ from the dataclass's (and the run config's)."""
SIMULATE_USAGE = "%(prog)s [--KEY VALUE ...] [--engine ENGINE] [--json PATH]"
ENGINE_HELP = (
    "local: in-process Grid; ray: Flower's Ray simulation (flwr run); deployment: "
    "a local flower-superlink and one flower-supernode per party (--secure: TLS "
    "and registered SuperNodes)"
)
OVERWRITE_HELP = (
    "replace the earlier run in out-dir (its results, logs, checkpoints and the "
    "label party's folder there); without it a non-empty out-dir is refused"
)


def _prior(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"prior must be a number or comma-separated numbers, got {text!r}"
        ) from None


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit with status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``tpsl-flwr`` argument parser."""
    parser = _Parser(prog="tpsl-flwr", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser
    )
    _add_audit(subparsers)
    _add_simulate(subparsers)
    _add_sweep(subparsers)
    _add_flower_run(subparsers)
    _add_keygen(subparsers)
    add_ledger_parser(subparsers, number)
    _add_attack(subparsers)
    add_party_parser(subparsers)
    return parser


def _add_audit(subparsers: Any) -> None:
    audit = subparsers.add_parser(
        "audit",
        help="measure a mechanism with the white-box shortest-distance attack",
        description="Push labels through GradPerturb, attack them, check the ceiling.",
    )
    audit.add_argument("--mechanism", choices=MECHANISMS, default="laplace")
    audit.add_argument(
        "--epsilon",
        type=number("epsilon"),
        default=None,
        help="privacy budget (laplace, discrete; default 1)",
    )
    audit.add_argument(
        "--sigma",
        type=number("sigma"),
        default=None,
        help="noise std of the gaussian baseline",
    )
    audit.add_argument("--classes", type=integer("classes", 2), default=2)
    audit.add_argument("--samples", type=integer("samples", 1000), default=100_000)
    audit.add_argument("--seed", type=integer("seed", 0), default=0)
    audit.add_argument(
        "--prior",
        type=_prior,
        default=None,
        help="positive rate, or k comma-separated class probabilities",
    )
    audit.add_argument(
        "--json",
        metavar="PATH",
        default=None,
        help="write the result as one JSON object ('-' = stdout)",
    )
    audit.set_defaults(handler=commands.cmd_audit)


def _add_simulate(subparsers: Any) -> None:
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
    sim.set_defaults(handler=commands.cmd_simulate)


def _add_sweep(subparsers: Any) -> None:
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
    add_release_flags(sweep)
    sweep.set_defaults(handler=commands.cmd_sweep)


def _add_flower_run(subparsers: Any) -> None:
    flower = subparsers.add_parser(
        "flower-run",
        help="run the app with `flwr run` on Flower's Ray simulation, offline",
        description=(
            "Run `flwr run APP local --stream` offline with the app's run config "
            "(plus KEY=VALUE overrides), end every process it started, and "
            "summarize the results JSON."
        ),
    )
    flower.add_argument(
        "app_dir",
        nargs="?",
        default=None,
        help="the Flower app folder (default: this project's)",
    )
    flower.add_argument(
        "--run-config",
        nargs="*",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="overrides of [tool.flwr.app.config]: KEY=VALUE pairs (TOML values) "
        "or a .toml file; repeated flags merge in order, the last value wins",
    )
    flower.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    flower.add_argument(
        "--noise-seed",
        type=integer("noise-seed", 0),
        default=None,
        help="derive the noise key from this seed (reproducible, NOT secure); it is "
        "written to the label party's folder and never enters the run config",
    )
    add_release_flags(flower)
    flower.add_argument("--timeout", type=number("timeout"), default=3600.0)
    flower.set_defaults(handler=commands.cmd_flower_run)


def add_release_flags(parser: argparse.ArgumentParser) -> None:
    """The label party's decisions as flags.

    ``--new-release``, ``--privacy-budget``, ``--release`` and
    ``--unprotected-release``.
    """
    group = parser.add_argument_group(
        "label party only", "never in the run config the nodes receive"
    )
    group.add_argument(
        "--new-release",
        action="store_true",
        help="acknowledge that this is a further release of labels the privacy "
        "ledger already holds (tpsl-flwr ledger show); without it such a run is "
        "refused",
    )
    group.add_argument(
        "--privacy-budget",
        type=number("privacy-budget"),
        default=0.0,
        help="refuse a release taking the label set's total epsilon above this "
        "(0: no budget)",
    )
    group.add_argument(
        "--release",
        action="store_true",
        help="count the run as a release in the privacy ledger although the label "
        "party starts every node (a rehearsal otherwise: recorded, not counted)",
    )
    group.add_argument(
        "--unprotected-release",
        action="store_true",
        help="allow a release with mechanism none (refused without it)",
    )


def _add_keygen(subparsers: Any) -> None:
    keygen = subparsers.add_parser(
        "keygen",
        help="put a noise key in the label party's private folder for the next run",
        description=(
            "Write an unbound noise key (from the OS, or from --seed: reproducible "
            "but NOT secure) to LABEL_DIR/noise-key.json (mode 0600 in a 0700 "
            "folder). The next run that starts afresh with that label-dir uses it."
        ),
    )
    keygen.add_argument(
        "label_dir", help="the label party's folder (run config label-dir)"
    )
    keygen.add_argument("--seed", type=integer("seed", 0), default=None)
    keygen.set_defaults(handler=commands.cmd_keygen)


def _add_attack(subparsers: Any) -> None:
    attack = subparsers.add_parser(
        "attack",
        help="score a recorded transcript with the black-box attacks, offline",
        description=(
            "Run the norm, cosine and spectral attacks on what one non-label "
            "party recorded (simulate --transcript-dir DIR), scored against "
            "true labels you supply: no number comes from the label party."
        ),
    )
    attack.add_argument("transcript", help="the folder given to --transcript-dir")
    attack.add_argument(
        "--labels",
        required=True,
        help=".npy of the true training labels, indexed by sample id",
    )
    attack.add_argument("--partition", type=integer("partition", 0), default=0)
    attack.add_argument(
        "--json",
        metavar="PATH",
        default=None,
        help="write the reports as JSON ('-' = stdout)",
    )
    attack.set_defaults(handler=commands.cmd_attack)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tpsl-flwr`` command."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except (TPSLError, OSError) as err:
        _error(args.command, err)
        return EXIT_USAGE
    except RuntimeError as err:  # FlowerLaunchError: the run did not complete
        _error(args.command, err)
        return EXIT_VIOLATION


def _error(command: str, err: BaseException) -> None:
    """One line on stderr: the cause, never a traceback (the log keeps those)."""
    print(f"tpsl-flwr {command}: error: {one_line_error(str(err))}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
