"""The ``tpsl-flwr`` command line.

Sub-commands:

* ``audit`` — measure a mechanism with the white-box shortest-distance attack
  and check it against the ``epsilon``-DP ceiling (exit 1 on a violation).

Bad input gives a one-line message naming the value and exit status 2, never a
traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from tpsl_flwr.errors import TPSLError
from tpsl_flwr.mechanisms import MECHANISMS, make_mechanism

EXIT_VIOLATION = 1
EXIT_USAGE = 2


def _number(name: str):
    def parse(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be a number, got {text!r}"
            ) from None

    return parse


def _integer(name: str, minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be an integer, got {text!r}"
            ) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"{name} must be >= {minimum}, got {value}"
            )
        return value

    return parse


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
    commands = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser
    )
    audit = commands.add_parser(
        "audit",
        help="measure a mechanism with the white-box shortest-distance attack",
        description="Push labels through GradPerturb, attack them, check the ceiling.",
    )
    audit.add_argument("--mechanism", choices=MECHANISMS, default="laplace")
    audit.add_argument(
        "--epsilon",
        type=_number("epsilon"),
        default=None,
        help="privacy budget (laplace, discrete; default 1)",
    )
    audit.add_argument(
        "--sigma",
        type=_number("sigma"),
        default=None,
        help="noise std of the gaussian baseline",
    )
    audit.add_argument("--classes", type=_integer("classes", 2), default=2)
    audit.add_argument("--samples", type=_integer("samples", 1000), default=100_000)
    audit.add_argument("--seed", type=_integer("seed", 0), default=0)
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
    audit.set_defaults(handler=_run_audit)
    _add_simulate(commands)
    return parser


def _add_simulate(commands: Any) -> None:
    from tpsl_flwr.data import DATASETS

    sim = commands.add_parser(
        "simulate",
        help="run one TPSL experiment (in-process engine)",
        description="Train a split model with GradPerturb; write results JSON.",
    )
    sim.add_argument("--dataset", choices=DATASETS, default="synthetic-ctr")
    sim.add_argument(
        "--rows",
        type=_integer("rows", 0),
        default=0,
        help="rows to generate or subsample (0 = dataset default)",
    )
    sim.add_argument("--mechanism", choices=MECHANISMS, default="laplace")
    sim.add_argument("--epsilon", type=_number("epsilon"), default=1.0)
    sim.add_argument("--sigma", type=_number("sigma"), default=1.0)
    sim.add_argument("--placement", choices=("logits", "cut"), default="logits")
    sim.add_argument("--epochs", type=_integer("epochs", 1), default=3)
    sim.add_argument("--batch-size", type=_integer("batch-size", 1), default=64)
    sim.add_argument("--lr", type=_number("lr"), default=1e-2)
    sim.add_argument(
        "--steps-per-message", type=_integer("steps-per-message", 1), default=1
    )
    sim.add_argument("--parties", type=_integer("parties", 1), default=2)
    sim.add_argument(
        "--engine",
        choices=("local",),
        default="local",
        help="local: in-process Grid (the Ray engine is `flwr run .`)",
    )
    sim.add_argument("--seed", type=_integer("seed", 0), default=0)
    sim.add_argument(
        "--noise-seed",
        type=int,
        default=-1,
        help="seed the noise key (reproducible, NOT secure); -1 = OS",
    )
    sim.add_argument("--out-dir", default="outputs")
    sim.add_argument(
        "--resume",
        action="store_true",
        help="continue from the last epoch checkpoint in --out-dir",
    )
    sim.add_argument(
        "--json",
        metavar="PATH",
        default=None,
        help="also write the results JSON here ('-' = stdout)",
    )
    sim.set_defaults(handler=_run_simulate)


def _run_simulate(args: argparse.Namespace) -> int:
    import logging

    from flwr.common.logger import FLOWER_LOGGER

    from tpsl_flwr.simulations.client_app import app as client_app
    from tpsl_flwr.simulations.config import ExperimentConfig
    from tpsl_flwr.simulations.experiment import run_label_party
    from tpsl_flwr.simulations.inprocess import InProcessGrid

    cfg = ExperimentConfig(
        dataset=args.dataset,
        rows=args.rows,
        mechanism=args.mechanism,
        epsilon=args.epsilon,
        sigma=args.sigma,
        placement=args.placement,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        steps_per_message=args.steps_per_message,
        num_parties=args.parties,
        seed=args.seed,
        noise_seed=args.noise_seed,
        out_dir=args.out_dir,
        resume=args.resume,
    )
    if args.json == "-":
        FLOWER_LOGGER.setLevel(logging.WARNING)
    grid = InProcessGrid(client_app, cfg.num_parties, run_config=cfg.to_run_config())
    results = grid.run_server(lambda g, _ctx: run_label_party(g, cfg, engine="local"))
    text = json.dumps(results, indent=2, default=str)
    if args.json == "-":
        print(text)
    elif args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            handle.write(text)
    return 0


def _run_audit(args: argparse.Namespace) -> int:
    from tpsl_flwr.audit import run_audit

    epsilon = args.epsilon
    if epsilon is None and args.mechanism in ("laplace", "discrete"):
        epsilon = 1.0
    mechanism = make_mechanism(
        args.mechanism, epsilon=epsilon, sigma=args.sigma, num_classes=args.classes
    )
    result = run_audit(
        mechanism, samples=args.samples, seed=args.seed, prior=args.prior
    )
    record = result.to_dict()
    if args.json == "-":
        print(json.dumps(record, indent=2))
    else:
        print(format_audit_table(record))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as handle:
                json.dump(record, handle, indent=2)
    if result.violation:
        print(f"tpsl-flwr audit: {result.verdict}", file=sys.stderr)
        return EXIT_VIOLATION
    return 0


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.4f}"
    return str(value)


def format_audit_table(record: dict[str, Any]) -> str:
    """Render an audit result as a two-column text table."""
    measured = "sda_auc" if record["sda_auc"] is not None else "sda_top1"
    rows = [
        ("mechanism", record["mechanism"]),
        ("epsilon", record["epsilon"]),
        ("sigma", record["sigma"]),
        ("classes", record["classes"]),
        ("samples", record["samples"]),
        (measured, record[measured]),
        ("expected (closed form)", record["expected"]),
        ("standard error", record["standard_error"]),
        ("auc_bound (any attack)", record["auc_bound"]),
        ("top1_bound (any attack)", record["top1_bound"]),
        ("empirical epsilon >= (95%)", record["empirical_epsilon_lower_bound"]),
        ("realized flip rate", record["realized_noise"]["flip_rate"]),
        ("expected flip rate", record["expected_noise"]["flip_rate"]),
        ("realized mean |noise|", record["realized_noise"]["mean_abs_noise"]),
        ("expected mean |noise|", record["expected_noise"]["mean_abs_noise"]),
        ("verdict", record["verdict"]),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name.ljust(width)}  {_fmt(value)}" for name, value in rows]
    lines += [f"note: {note}" for note in record["notes"]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tpsl-flwr`` command."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except TPSLError as err:
        print(f"tpsl-flwr {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as err:
        print(f"tpsl-flwr {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
