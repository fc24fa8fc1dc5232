"""The handlers of the ``tpsl-flwr`` sub-commands (the parser is in ``cli``).

Each takes the parsed arguments and returns the exit status; a bad value
raises :class:`~tpsl_flwr.errors.TPSLError` and ``cli.main`` turns it into one
line and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from tpsl_flwr.errors import TPSLError
from tpsl_flwr.experiments.run_report import format_cell

EXIT_VIOLATION = 1
EXIT_USAGE = 2


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
        party_workers=getattr(args, "party_workers", True),
    )
    write_json(results, args.json)
    print(summary_line("simulate", results), file=sys.stderr if quiet else sys.stdout)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """``sweep``: every unfinished run of a grid, then its tables and plots."""
    from tpsl_flwr.experiments.sweep.run import describe, load_sweep, run_sweep

    grid = load_sweep(args.config)
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


def cmd_flower_run(args: argparse.Namespace) -> int:
    """``flower-run``: ``flwr run`` of an app on Ray, then a one-line summary."""
    import dataclasses

    from tpsl_flwr.experiments.config import ExperimentConfig
    from tpsl_flwr.experiments.experiment import (
        preflight_release,
        provide_seeded_key,
    )
    from tpsl_flwr.experiments.ray_run import app_config, run_on_ray, source_app_dir
    from tpsl_flwr.experiments.run_folder import prepare_run_folder

    app_dir = source_app_dir() if args.app_dir is None else Path(args.app_dir)
    # A simulation audits its transcript unless told otherwise.
    overrides = {"audit": True, **parse_overrides(args.run_config)}
    # Validate the whole config here: a bad value fails now, not inside Flower.
    cfg = dataclasses.replace(
        ExperimentConfig.from_run_config({**app_config(app_dir), **overrides}),
        noise_seed=-1 if args.noise_seed is None else args.noise_seed,
        new_release=args.new_release,
        privacy_budget=args.privacy_budget,
        release=args.release,
        unprotected_release=args.unprotected_release,
    )
    preflight_release(cfg)  # a refused release leaves the folder untouched
    prepare_run_folder(
        cfg.out_dir,
        resume=cfg.resume,
        overwrite=args.overwrite,
        label_dir=cfg.label_party_dir,
        extra=[cfg.transcript_dir] if cfg.transcript_dir else [],
        hint="pass --overwrite to replace it or --run-config resume=true to "
        "continue it",
    )
    provide_seeded_key(cfg)
    results = run_on_ray(
        overrides, app_dir=app_dir, timeout=args.timeout, echo=sys.stdout
    )
    print(summary_line("flower-run", results))
    return 0


def summary_line(command: str, results: dict[str, Any]) -> str:
    """The last line of a run: utility, privacy, speed, each duration named, path.

    Examples
    --------
    >>> print(summary_line("flower-run", {
    ...     "test_auc": 0.61234, "epsilon_spent": 1.0, "samples_per_second": 2410.2,
    ...     "seconds": 41.71, "flower_wall_seconds": 55.62,
    ...     "config": {"out-dir": "/tmp/run"}}))  # doctest: +NORMALIZE_WHITESPACE
    tpsl-flwr flower-run: test_auc 0.6123, epsilon spent 1 (total 1),
    2410 samples/s, training 41.7 s (label party), wall 55.6 s (flwr run, incl. Ray
    start-up); results in /tmp/run/results.json

    A run says whether it was a release or a rehearsal (not counted):

    >>> print(summary_line("simulate", {
    ...     "test_auc": 0.7, "epsilon_spent": 1.0, "epsilon_total": 0.0,
    ...     "run_kind": "rehearsal", "samples_per_second": 10, "seconds": 1,
    ...     "config": {"out-dir": "/tmp/run"}}))  # doctest: +NORMALIZE_WHITESPACE
    tpsl-flwr simulate: test_auc 0.7000, epsilon spent 1 (rehearsal: not counted;
    total of releases 0), 10 samples/s, training 1.0 s (label party); results in
    /tmp/run/results.json
    """
    from tpsl_flwr.experiments.experiment import RESULTS_FILE
    from tpsl_flwr.privacy.epsilon_text import epsilon_text, results_total_text

    metric = "test_auc" if "test_auc" in results else "test_accuracy"
    kind = results.get("run_kind")
    parts = [
        f"{metric} {results.get(metric, float('nan')):.4f}",
        f"epsilon spent {epsilon_text(results['epsilon_spent'])} "
        + (
            f"(total {results_total_text(results)})"
            if kind is None
            else f"({kind}{': not counted' if kind == 'rehearsal' else ''}; "
            f"total of releases {results_total_text(results)})"
        ),
        f"{results['samples_per_second']:.0f} samples/s",
        f"training {results['seconds']:.1f} s (label party)",
    ]
    if "round_trip_seconds" in results:
        parts.append(f"{results['round_trip_seconds']:.2f} s per round trip")
    if "flower_wall_seconds" in results:
        what = (
            "flwr run on the deployment"
            if results.get("engine") == "deployment"
            else "flwr run, incl. Ray start-up"
        )
        parts.append(f"wall {results['flower_wall_seconds']:.1f} s ({what})")
    path = Path(results["config"]["out-dir"]).resolve() / RESULTS_FILE
    return f"tpsl-flwr {command}: {', '.join(parts)}; results in {path}"


def cmd_keygen(args: argparse.Namespace) -> int:
    """``keygen``: an unbound noise key in the label party's folder."""
    from tpsl_flwr.privacy.keyed_noise import NoiseKey
    from tpsl_flwr.release.store import LabelStore

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


def cmd_attack(args: argparse.Namespace) -> int:
    """``attack``: the black-box attacks on a recorded transcript, offline."""
    import numpy as np

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
        cells = [
            f"{name} {report[name]:.4f}"
            + (f" ± {errors[name]:.4f}" if errors.get(name) is not None else "")
            + f" ({report['per_batch'][name]['mean']:.4f})"
            for name in ("norm", "cosine", "spectral")
            if report.get(name) is not None
        ]
        print(f"epoch {epoch + 1}: " + ", ".join(cells))
    write_json({str(k): v for k, v in reports.items()}, args.json)
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    """``audit``: the white-box attack on a mechanism against its ceiling."""
    from tpsl_flwr.attacks.mechanism_audit import run_audit
    from tpsl_flwr.privacy.mechanisms import make_mechanism, parameter_of

    epsilon = args.epsilon
    if epsilon is None and parameter_of(args.mechanism) == "epsilon":
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


def write_json(results: dict[str, Any], path: str | None) -> None:
    """Write ``results`` as JSON to ``path`` (``-``: stdout; ``None``: nowhere).

    The file is mode ``0600``: a run's results and attack reports hold
    statistics computed on the clean labels (the label party's alone).
    """
    from tpsl_flwr._util.private_files import FILE_MODE
    from tpsl_flwr.experiments.run_folder import write_atomic

    text = json.dumps(results, indent=2, default=str)
    if path == "-":
        print(text)
    elif path:
        write_atomic(path, text, mode=FILE_MODE)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``--run-config`` values, merged in order as ``flwr run`` merges them.

    Each item is a ``.toml`` file or one or more ``KEY=VALUE`` pairs (values in
    TOML: ``3``, ``false``, ``'"text"'``; a bare word is a string). A later
    item's value replaces an earlier one's, key by key.

    Examples
    --------
    >>> parse_overrides(["epochs=3", "dataset=digits", "audit=false"])
    {'epochs': 3, 'dataset': 'digits', 'audit': False}
    >>> parse_overrides(['epochs=3 mechanism="discrete"', "epochs=5"])
    {'epochs': 5, 'mechanism': 'discrete'}
    >>> parse_overrides(["epochs"])
    Traceback (most recent call last):
    ...
    tpsl_flwr.errors.TPSLError: --run-config expects KEY=VALUE, got 'epochs'
    """
    import re

    from tpsl_flwr.engines.flower_env import read_toml

    pair = re.compile(r"""(\S+?)=('[^']*'|"[^"]*"|\S+)""")
    out: dict[str, Any] = {}
    for item in items:
        if item.endswith(".toml"):
            try:
                out.update(_flat(read_toml(Path(item).expanduser())))
            except (OSError, ValueError) as err:
                raise TPSLError(f"--run-config {item}: {err}") from None
            continue
        pairs = pair.findall(item)
        if not pairs or pair.sub("", item).strip():
            raise TPSLError(f"--run-config expects KEY=VALUE, got {item!r}")
        out.update({key: _toml_value(raw) for key, raw in pairs})
    return out


def _toml_value(raw: str) -> Any:
    """A TOML value (``3``, ``true``, ``"x"``), else the text itself."""
    try:
        return tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        return raw


def _flat(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested TOML tables as ``a.b`` keys (as Flower flattens them)."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
