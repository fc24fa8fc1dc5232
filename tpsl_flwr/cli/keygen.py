"""``tpsl-flwr keygen``: a noise key in the label party's private folder.

The next run that starts afresh with that ``label-dir`` uses it.
"""

from __future__ import annotations

import argparse
from typing import Any

from tpsl_flwr.cli.flags import integer

__all__ = ["add_parser", "cmd_keygen"]


def add_parser(subparsers: Any) -> None:
    """Add ``keygen`` to the CLI's ``subparsers``."""
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
    keygen.set_defaults(handler=cmd_keygen)


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
