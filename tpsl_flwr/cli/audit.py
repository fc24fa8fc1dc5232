"""``tpsl-flwr audit``: measure a mechanism with the white-box shortest-distance attack.

The attack runs on labels pushed through GradPerturb and is checked against
the ``epsilon``-DP ceiling (exit 1 on a violation).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tpsl_flwr.cli.flags import integer, number
from tpsl_flwr.cli.output import EXIT_VIOLATION
from tpsl_flwr.experiments.run_report import format_cell
from tpsl_flwr.privacy.mechanisms import MECHANISMS

__all__ = ["add_parser", "cmd_audit", "format_audit_table"]


def _prior(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"prior must be a number or comma-separated numbers, got {text!r}"
        ) from None


def add_parser(subparsers: Any) -> None:
    """Add ``audit`` to the CLI's ``subparsers``."""
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
        help="privacy budget (laplace, discrete, rr-prior; default 1)",
    )
    audit.add_argument(
        "--sigma",
        type=number("sigma"),
        default=None,
        help="noise std of the gaussian baseline",
    )
    audit.add_argument(
        "--marvell-power",
        type=number("marvell-power"),
        default=None,
        help="marvell's power constraint scale s (P = s ||g1 - g0||^2; default 1)",
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
    audit.set_defaults(handler=cmd_audit)


def cmd_audit(args: argparse.Namespace) -> int:
    """``audit``: the white-box attack on a mechanism against its ceiling."""
    from tpsl_flwr.attacks.mechanism_audit import run_audit
    from tpsl_flwr.privacy.mechanisms import make_mechanism, parameter_of

    epsilon, power = args.epsilon, args.marvell_power
    if epsilon is None and parameter_of(args.mechanism) == "epsilon":
        epsilon = 1.0
    if power is None and parameter_of(args.mechanism) == "marvell_power":
        power = 1.0
    mechanism = make_mechanism(
        args.mechanism,
        epsilon=epsilon,
        sigma=args.sigma,
        marvell_power=power,
        num_classes=args.classes,
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


def _epsilon_cell(record: dict[str, Any]) -> Any:
    """The audit's epsilon, or ``n/a (no DP guarantee)`` for a heuristic."""
    from tpsl_flwr.privacy.epsilon_text import epsilon_text, has_dp_guarantee

    if has_dp_guarantee(record["mechanism"]):
        return record["epsilon"]
    return epsilon_text(record["epsilon"], record["mechanism"])


def format_audit_table(record: dict[str, Any]) -> str:
    """Render an audit result as a two-column text table."""
    measured = "sda_auc" if record["sda_auc"] is not None else "sda_top1"
    rows = [
        ("mechanism", record["mechanism"]),
        ("epsilon", _epsilon_cell(record)),
        ("sigma", record["sigma"]),
        ("marvell-power", record.get("marvell_power")),
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
    lines = [f"{name.ljust(width)}  {format_cell(value)}" for name, value in rows]
    lines += [f"note: {note}" for note in record["notes"]]
    return "\n".join(lines)
