"""``tpsl-flwr attack``: the black-box attacks on a recorded transcript, offline.

Scored against true labels the user supplies: no number comes from the label
party.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tpsl_flwr.cli.flags import integer
from tpsl_flwr.cli.output import write_json

__all__ = ["add_parser", "cmd_attack"]


def add_parser(subparsers: Any) -> None:
    """Add ``attack`` to the CLI's ``subparsers``."""
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
    attack.set_defaults(handler=cmd_attack)


def cmd_attack(args: argparse.Namespace) -> int:
    """``attack``: the black-box attacks on a recorded transcript, offline."""
    import numpy as np

    from tpsl_flwr.attacks.report import INVERTED
    from tpsl_flwr.wire.recorder import score_recorded_transcript

    labels = np.load(args.labels)
    reports = score_recorded_transcript(args.transcript, labels, args.partition)
    if args.json == "-":
        print(json.dumps(reports, indent=2, default=float))
        return 0
    print(
        f"party {args.partition}: attack AUC per epoch, pooled ± standard error "
        "(per-batch mean)"
    )
    for epoch, report in reports.items():
        errors = report.get("standard_error") or {}
        directions = report.get("direction") or {}
        cells = [
            f"{name} {report[name]:.4f}"
            + (f" ± {errors[name]:.4f}" if errors.get(name) is not None else "")
            + f" ({report['per_batch'][name]['mean']:.4f})"
            + (f" {INVERTED}" if directions.get(name) == INVERTED else "")
            for name in ("norm", "cosine", "spectral")
            if report.get(name) is not None
        ]
        print(f"epoch {epoch + 1}: " + ", ".join(cells))
    write_json({str(k): v for k, v in reports.items()}, args.json)
    return 0
