"""``tpsl-flwr flower-run``: ``flwr run`` of the app on Ray, offline.

On Flower's Ray simulation engine; every process it started is ended
afterwards, and the results JSON is summarised.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from tpsl_flwr.cli.flags import OVERWRITE_HELP, add_release_flags, integer, number
from tpsl_flwr.cli.output import summary_line
from tpsl_flwr.errors import TPSLError

__all__ = ["add_parser", "cmd_flower_run", "parse_overrides"]


def add_parser(subparsers: Any) -> None:
    """Add ``flower-run`` to the CLI's ``subparsers``."""
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
    flower.set_defaults(handler=cmd_flower_run)


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
