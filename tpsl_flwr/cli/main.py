"""The ``tpsl-flwr`` command line.

One module per sub-command, parser and handler together:

* ``audit`` — measure a mechanism with the white-box shortest-distance attack
  and check it against the ``epsilon``-DP ceiling (exit 1 on a violation).
* ``simulate`` — one experiment on the in-process or the Ray engine; one flag
  per run-config key, of the same name (:mod:`~tpsl_flwr.cli.flags`).
* ``sweep`` — ``sweep run CONFIG`` (or ``sweep CONFIG``): a grid of
  experiments from a TOML file, resumable, with the paper's tables and
  figures; ``sweep report DIR ...``: one report over several sweep folders
  (:mod:`tpsl_flwr.experiments.sweep`).
* ``flower-run`` — ``flwr run`` of the app on Flower's Ray simulation, offline,
  with every process it started ended afterwards.
* ``keygen`` — a noise key in the label party's private folder.
* ``ledger`` — the privacy ledger: every release of each label set, totals;
  ``ledger acknowledge`` for a further release (:mod:`~tpsl_flwr.release.ledger`).
* ``attack`` — the black-box attacks on a recorded transcript, offline.
* ``executor`` — serve a SuperNode's ClientApp tasks from one warm process
  (:mod:`tpsl_flwr.engines.executor.warm`).

Each is ``tpsl_flwr.cli.<command>`` (``flower_run`` for ``flower-run``), whose
``add_parser`` adds it here. Bad input gives a one-line message naming the
value and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tpsl_flwr.cli import (
    attack,
    audit,
    executor,
    flower_run,
    keygen,
    ledger,
    simulate,
    sweep,
)
from tpsl_flwr.cli.output import EXIT_USAGE, EXIT_VIOLATION
from tpsl_flwr.errors import TPSLError
from tpsl_flwr.experiments.run_folder import one_line_error

__all__ = ["COMMANDS", "EXIT_USAGE", "EXIT_VIOLATION", "build_parser", "main"]

COMMANDS = (
    audit,
    simulate,
    sweep,
    flower_run,
    keygen,
    ledger,
    attack,
    executor,
)
"""The sub-command modules, in the order ``--help`` lists them."""


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
    for command in COMMANDS:
        command.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tpsl-flwr`` command."""
    argv = sweep.with_run_default(sys.argv[1:] if argv is None else argv)
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
