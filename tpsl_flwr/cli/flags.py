"""Command-line flags generated from :class:`ExperimentConfig`, one per field.

Every run-config key is a ``tpsl-flwr simulate`` flag of the same kebab-case
name (``num-parties`` -> ``--num-parties``), typed by the dataclass field, with
its help from :data:`~tpsl_flwr.experiments.config_fields.FIELD_HELP` and its valid
values from :data:`~tpsl_flwr.experiments.config_fields.FIELD_CHOICES`; booleans get
``--x/--no-x``, and a choice that also takes a boolean (``wide``) ``--x
[CHOICE]`` (bare ``--x``: ``on``). Adding a field to the dataclass (and its
line of help) adds the flag. ``noise-seed``, a field that never enters the run
config, is a flag of its own group, and so is ``--secure`` (how ``--engine
deployment`` runs, not a setting of the experiment).

Bad values give one line naming the value (the parser's ``error`` decides the
exit status).
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable, Mapping
from typing import Any

from tpsl_flwr.experiments.config import LABEL_PARTY_ONLY, ExperimentConfig
from tpsl_flwr.experiments.config_fields import FIELD_CHOICES, FIELD_HELP

__all__ = [
    "ENGINE_HELP",
    "OVERWRITE_HELP",
    "SECURE_HELP",
    "add_config_flags",
    "add_engine_flags",
    "add_release_flags",
    "config_from_args",
    "flag_name",
    "integer",
    "number",
]


def number(name: str) -> Callable[[str], float]:
    """An argparse ``type`` reading a float, its error naming ``name``.

    Examples
    --------
    >>> number("lr")("0.5")
    0.5
    >>> number("lr")("fast")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: lr must be a number, got 'fast'
    """

    def parse(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be a number, got {text!r}"
            ) from None

    return parse


def integer(name: str, minimum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type`` reading an int (``>= minimum`` if given).

    Examples
    --------
    >>> integer("epochs")("3")
    3
    >>> integer("epochs", 1)("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: epochs must be >= 1, got 0
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be an integer, got {text!r}"
            ) from None
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(
                f"{name} must be >= {minimum}, got {value}"
            )
        return value

    return parse


def flag_name(field: str) -> str:
    """The flag of a dataclass field: its run-config key with ``--``.

    Examples
    --------
    >>> flag_name("num_parties")
    '--num-parties'
    """
    return "--" + field.replace("_", "-")


SECURE_HELP = (
    "with --engine deployment: TLS and authenticated SuperNodes (a local CA, "
    "loopback only), SuperNodes through an nginx proxy that forwards only the "
    "Fleet API (needs nginx: apt-get install nginx); ignored by the other "
    "engines"
)


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """Add the flags of how an engine runs (``--secure``) to ``parser``.

    Examples
    --------
    >>> parser = argparse.ArgumentParser()
    >>> add_engine_flags(parser)
    >>> parser.parse_args([]).secure, parser.parse_args(["--secure"]).secure
    (False, True)
    """
    group = parser.add_argument_group(
        "engine", "how the engine runs; never in the run config"
    )
    group.add_argument("--secure", action="store_true", help=SECURE_HELP)
    group.add_argument(
        "--no-executor",
        dest="executor",
        action="store_false",
        help="--engine deployment: no warm executor beside each SuperNode; Flower "
        "runs every message in a fresh flwr-clientapp process, the node's state "
        "carried in its context (slower)",
    )


def add_config_flags(
    parser: argparse.ArgumentParser,
    defaults: Mapping[str, Any] | None = None,
    notes: Mapping[str, str] | None = None,
    *,
    engine_flags: bool = True,
) -> None:
    """Add one flag per :class:`ExperimentConfig` field to ``parser``.

    With ``engine_flags`` (default) also :func:`add_engine_flags`.

    Parameters
    ----------
    parser
        The parser (a sub-command's).
    defaults
        Defaults that differ from the dataclass's, by field name.
    notes
        Extra help, by field name (say why a default differs).
    engine_flags
        Also add ``--secure`` (:func:`add_engine_flags`).

    Examples
    --------
    >>> parser = argparse.ArgumentParser()
    >>> add_config_flags(parser, defaults={"audit": True})
    >>> args = parser.parse_args(["--num-parties", "3", "--no-audit"])
    >>> args.num_parties, args.audit, args.epochs
    (3, False, 2)
    """
    defaults = dict(defaults or {})
    notes = dict(notes or {})
    run_config = parser.add_argument_group(
        "run config",
        "the keys of [tool.flwr.app.config] (flwr run --run-config), same names",
    )
    label_only = parser.add_argument_group(
        "label party only", "never in the run config the nodes receive"
    )
    hints = typing.get_type_hints(ExperimentConfig)
    for field in dataclasses.fields(ExperimentConfig):
        key = field.name.replace("_", "-")
        default = defaults.get(field.name, field.default)
        help_text = FIELD_HELP[key].replace("%", "%%")
        if field.name in notes:
            help_text += f"; {notes[field.name]}"
        group = label_only if field.name in LABEL_PARTY_ONLY else run_config
        action = group.add_argument(
            flag_name(field.name),
            dest=field.name,
            default=default,
            help=help_text,
            **_kind(key, hints[field.name]),
        )
        if "(default:" not in (action.help or ""):
            shown = "''" if default == "" else "%(default)s"
            action.help = f"{action.help} (default: {shown})"
    if engine_flags:
        add_engine_flags(parser)


def _kind(key: str, kind: type) -> dict[str, Any]:
    """The ``add_argument`` options of a field of type ``kind``."""
    if kind is bool:
        return {"action": argparse.BooleanOptionalAction}
    if bool in typing.get_args(kind) and key in FIELD_CHOICES:
        # A choice that was a boolean (wide): bare --KEY is "on", and
        # true/false are read as on/off.
        return {
            "nargs": "?",
            "const": "on",
            "type": _on_off,
            "choices": FIELD_CHOICES[key],
        }
    if float in typing.get_args(kind):  # a number or auto (validation-fraction)
        return {"metavar": "X|auto"}
    if kind is int:
        return {"type": integer(key), "metavar": "N"}
    if kind is float:
        return {"type": number(key), "metavar": "X"}
    if key in FIELD_CHOICES:
        return {"choices": FIELD_CHOICES[key]}
    return {"metavar": "PATH" if key.endswith(("-path", "-dir")) else "TEXT"}


def _on_off(text: str) -> str:
    """A choice flag's value, ``true``/``false`` read as ``on``/``off``.

    Examples
    --------
    >>> _on_off("TRUE"), _on_off("false"), _on_off("auto")
    ('on', 'off', 'auto')
    """
    value = text.lower()
    return {"true": "on", "false": "off"}.get(value, value)


def config_from_args(args: argparse.Namespace) -> ExperimentConfig:
    """The :class:`ExperimentConfig` of parsed flags (from :func:`add_config_flags`).

    Raises
    ------
    ConfigError
        If a value is refused by the dataclass (the message names it).
    """
    return ExperimentConfig(
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(ExperimentConfig)}
    )


ENGINE_HELP = (
    "local: in-process Grid; ray: Flower's Ray simulation (flwr run); deployment: "
    "a local flower-superlink and one flower-supernode per party (--secure: TLS "
    "and registered SuperNodes)"
)
OVERWRITE_HELP = (
    "replace the earlier run in out-dir (its results, logs, checkpoints and the "
    "label party's folder there); without it a non-empty out-dir is refused"
)


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
