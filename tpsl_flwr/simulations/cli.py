"""The ``tpsl-flwr`` command line.

Sub-commands:

* ``audit`` — measure a mechanism with the white-box shortest-distance attack
  and check it against the ``epsilon``-DP ceiling (exit 1 on a violation).
* ``simulate`` — one experiment on the in-process or the Ray engine.
* ``sweep`` — a grid of experiments from a TOML file, resumable, with the
  paper's tables and Figure 5 (:mod:`tpsl_flwr.experiments.sweep`).
* ``flower-run`` — ``flwr run`` of the app on Flower's Ray simulation, offline,
  with every process it started ended afterwards.

Bad input gives a one-line message naming the value and exit status 2, never a
traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from tpsl_flwr.errors import TPSLError
from tpsl_flwr.experiments.run_report import format_cell
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
    _add_sweep(commands)
    return parser


def _add_sweep(commands: Any) -> None:
    sweep = commands.add_parser(
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
    sweep.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: in-process Grid; ray: Flower's Ray simulation (flwr run)",
    )
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar")
    sweep.set_defaults(handler=_run_sweep)


def _run_sweep(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tpsl_flwr.experiments.sweep import describe, load_sweep, run_sweep

    grid = load_sweep(args.config)
    out = args.out_dir or f"sweep-{Path(args.config).stem}"
    print(f"tpsl-flwr sweep: {describe(grid)}; out-dir {out}", file=sys.stderr)
    done = run_sweep(grid, out, engine=args.engine, progress=not args.no_progress)
    print(
        f"tpsl-flwr sweep: ran {len(done['ran'])}, skipped {len(done['skipped'])} "
        f"finished; wrote {', '.join(str(p) for p in done['files'])}"
    )
    return 0


def _add_simulate(commands: Any) -> None:
    from tpsl_flwr.data import ALL_DATASETS

    sim = commands.add_parser(
        "simulate",
        help="run one TPSL experiment (in-process or Ray engine)",
        description=(
            "Train a split model with GradPerturb and write the results JSON. "
            "Unset flags take the defaults of tpsl_flwr.experiments.config."
        ),
    )
    add = sim.add_argument
    add("--dataset", choices=ALL_DATASETS)
    add("--data-path", help="the Criteo/Avazu file (plain or .gz)")
    add("--split", choices=("random", "time"))
    add("--hash-buckets", type=_integer("hash-buckets", 2))
    add("--rows", type=_integer("rows", 0), help="rows (0 = dataset default)")
    add("--mechanism", choices=MECHANISMS)
    add("--epsilon", type=_number("epsilon"))
    add("--sigma", type=_number("sigma"))
    add("--placement", choices=("logits", "cut"))
    add("--epochs", type=_integer("epochs", 1))
    add("--batch-size", type=_integer("batch-size", 1))
    add("--lr", type=_number("lr"))
    add("--steps-per-message", type=_integer("steps-per-message", 1))
    add("--parties", dest="num_parties", type=_integer("parties", 1))
    add("--seed", type=_integer("seed", 0))
    add(
        "--noise-seed",
        type=int,
        help="seed the noise key (reproducible, NOT secure; -1 = OS); label-party "
        "only: never in the run config",
    )
    add(
        "--label-dir", help="the label party's private folder (default OUT/label-party)"
    )
    add("--out-dir")
    add(
        "--no-audit",
        dest="audit",
        action="store_false",
        default=True,
        help="skip the per-epoch attack audit of the transcript (on by default)",
    )
    add(
        "--record-transcript",
        dest="transcript_dir",
        metavar="DIR",
        help="every non-label node records what it receives into DIR",
    )
    add(
        "--resume",
        action="store_true",
        default=None,
        help="continue from the last epoch checkpoint in --out-dir",
    )
    add(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: in-process Grid; ray: Flower's Ray simulation (flwr run)",
    )
    add(
        "--json",
        metavar="PATH",
        default=None,
        help="also write the results JSON here ('-' = stdout)",
    )
    sim.set_defaults(handler=_run_simulate)

    flower = commands.add_parser(
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
        default=[],
        metavar="KEY=VALUE",
        help="overrides of [tool.flwr.app.config]",
    )
    flower.add_argument(
        "--noise-seed",
        type=_integer("noise-seed", 0),
        default=None,
        help="derive the noise key from this seed (reproducible, NOT secure); it is "
        "written to the label party's folder and never enters the run config",
    )
    flower.add_argument("--timeout", type=_number("timeout"), default=3600.0)
    flower.set_defaults(handler=_run_flower)

    keygen = commands.add_parser(
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
    keygen.add_argument("--seed", type=_integer("seed", 0), default=None)
    keygen.set_defaults(handler=_run_keygen)

    attack = commands.add_parser(
        "attack",
        help="score a recorded transcript with the black-box attacks, offline",
        description=(
            "Run the norm, cosine and spectral attacks on what one non-label "
            "party recorded (simulate --record-transcript DIR), scored against "
            "true labels you supply: no number comes from the label party."
        ),
    )
    attack.add_argument("transcript", help="the folder given to --record-transcript")
    attack.add_argument(
        "--labels",
        required=True,
        help=".npy of the true training labels, indexed by sample id",
    )
    attack.add_argument("--partition", type=_integer("partition", 0), default=0)
    attack.add_argument(
        "--json",
        metavar="PATH",
        default=None,
        help="write the reports as JSON ('-' = stdout)",
    )
    attack.set_defaults(handler=_run_attack)


def _run_attack(args: argparse.Namespace) -> int:
    import numpy as np

    from tpsl_flwr.wire.recorder import attack_transcript

    labels = np.load(args.labels)
    reports = attack_transcript(args.transcript, labels, args.partition)
    if args.json == "-":
        print(json.dumps(reports, indent=2, default=float))
        return 0
    print(f"party {args.partition}: attack AUC per epoch (pooled; per-batch mean)")
    for epoch, report in reports.items():
        cells = [
            f"{name} {report[name]:.4f} ({report['per_batch'][name]['mean']:.4f})"
            for name in ("norm", "cosine", "spectral")
            if report.get(name) is not None
        ]
        print(f"epoch {epoch + 1}: " + ", ".join(cells))
    _write_json({str(k): v for k, v in reports.items()}, args.json)
    return 0


_NOT_CONFIG = {"command", "handler", "engine", "json"}


def _run_simulate(args: argparse.Namespace) -> int:
    from tpsl_flwr.experiments.config import ExperimentConfig

    given = {
        name: value
        for name, value in vars(args).items()
        if name not in _NOT_CONFIG and value is not None
    }
    cfg = ExperimentConfig(**given)
    quiet = args.json == "-"
    if args.engine == "ray":
        from tpsl_flwr.engines.flower_run import run_on_ray
        from tpsl_flwr.experiments.experiment import provide_seeded_key

        provide_seeded_key(cfg)  # the label party's file; the seed stays here
        results = run_on_ray(cfg.to_run_config(), echo=None if quiet else sys.stdout)
    else:
        results = _run_local(cfg, quiet)
    _write_json(results, args.json)
    return 0


def _run_local(cfg: Any, quiet: bool) -> dict[str, Any]:
    import logging
    import os

    import torch
    from flwr.common.logger import FLOWER_LOGGER

    from tpsl_flwr.engines.inprocess import InProcessGrid
    from tpsl_flwr.experiments.experiment import run_label_party
    from tpsl_flwr.simulations.client_app import app as client_app

    if quiet:
        FLOWER_LOGGER.setLevel(logging.WARNING)
    if "OMP_NUM_THREADS" not in os.environ:
        # The parties share this process: one torch thread each step beats
        # several fighting over the cores (measured ~10x on 2 loaded cores).
        torch.set_num_threads(1)
    grid = InProcessGrid(client_app, cfg.num_parties, run_config=cfg.to_run_config())
    results: dict[str, Any] = grid.run_server(
        lambda g, _ctx: run_label_party(g, cfg, engine="local")
    )
    return results


def _write_json(results: dict[str, Any], path: str | None) -> None:
    text = json.dumps(results, indent=2, default=str)
    if path == "-":
        print(text)
    elif path:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)


def _parse_overrides(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise TPSLError(f"--run-config expects KEY=VALUE, got {pair!r}")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key] = value
    return out


def _run_keygen(args: argparse.Namespace) -> int:
    from tpsl_flwr.keyed_noise import NoiseKey
    from tpsl_flwr.label_store import LabelStore

    store = LabelStore(args.label_dir)
    if args.seed is None:
        key, origin = NoiseKey.from_os(), "os"
    else:
        key, origin = NoiseKey.from_seed(args.seed), "seed"
    store.provide_key(key, origin)
    print(
        f"tpsl-flwr keygen: {'seeded (NOT secure)' if origin == 'seed' else 'secure'} "
        f"key {key.fingerprint} in {store.key_path}; the next fresh run with "
        f"label-dir {args.label_dir!r} uses it"
    )
    return 0


def _run_flower(args: argparse.Namespace) -> int:
    import dataclasses
    from pathlib import Path

    from tpsl_flwr.engines.flower_run import app_config, run_on_ray, source_app_dir
    from tpsl_flwr.experiments.config import ExperimentConfig
    from tpsl_flwr.experiments.experiment import provide_seeded_key

    app_dir = source_app_dir() if args.app_dir is None else Path(args.app_dir)
    # A simulation audits its transcript unless told otherwise.
    overrides = {"audit": True, **_parse_overrides(args.run_config)}
    # Validate the whole config here: a bad value fails now, not inside Flower.
    cfg = ExperimentConfig.from_run_config({**app_config(app_dir), **overrides})
    if args.noise_seed is not None:
        provide_seeded_key(dataclasses.replace(cfg, noise_seed=args.noise_seed))
    results = run_on_ray(overrides, app_dir=app_dir, timeout=args.timeout)
    metric = "test_auc" if "test_auc" in results else "test_accuracy"
    print(
        f"tpsl-flwr flower-run: {metric} {results.get(metric, float('nan')):.4f}, "
        f"epsilon spent {results['epsilon_spent']}, "
        f"{results['samples_per_second']:.0f} samples/s, "
        f"{results['flower_wall_seconds']:.1f} s; results in "
        f"{Path(results['config']['out-dir']) / 'results.json'}"
    )
    return 0


def _run_audit(args: argparse.Namespace) -> int:
    from tpsl_flwr.attacks.audit import run_audit

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
    lines = [f"{name.ljust(width)}  {format_cell(value)}" for name, value in rows]
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
    except RuntimeError as err:  # FlowerLaunchError: the run did not complete
        print(f"tpsl-flwr {args.command}: {err}", file=sys.stderr)
        return EXIT_VIOLATION


if __name__ == "__main__":
    sys.exit(main())
