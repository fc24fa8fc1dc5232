"""``tpsl-flwr party``: serve one non-label node's messages from a long-lived worker.

The worker itself is :mod:`tpsl_flwr.simulations.party_worker`.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

from tpsl_flwr._util.private_files import make_private_dir
from tpsl_flwr.simulations import party_worker
from tpsl_flwr.simulations.party_worker import PartyWorker, worker_run_config
from tpsl_flwr.wire.worker_link import WorkerServer, socket_path

__all__ = ["add_parser", "cmd_party"]

_LOG = logging.getLogger("tpsl_flwr.party_worker")


def add_parser(subparsers: Any) -> None:
    """Add the ``party`` subcommand to the CLI's subparsers."""
    party = subparsers.add_parser(
        "party",
        help="serve one non-label node's messages from a long-lived worker",
        description=party_worker.__doc__.split("\n\n")[1],
    )
    party.add_argument("--partition-id", type=int, required=True)
    party.add_argument("--num-partitions", type=int, required=True)
    party.add_argument(
        "--socket-dir",
        type=Path,
        required=True,
        help="folder of the socket (mode 0700; created so if missing)",
    )
    party.add_argument(
        "--app-dir",
        type=Path,
        default=None,
        help="the Flower app folder whose [tool.flwr.app.config] the run uses",
    )
    party.add_argument(
        "--run-config",
        nargs="*",
        default=None,
        help='overrides as for `flwr run`: a TOML file or "key=value" pairs',
    )
    party.set_defaults(handler=cmd_party)


def cmd_party(args: argparse.Namespace) -> int:
    """``party``: build the node's party, then serve until SIGTERM/SIGINT."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout
    )
    folder = Path(args.socket_dir)
    if not folder.exists():
        make_private_dir(folder, check=False)
    run_config = None
    if args.app_dir is not None or args.run_config:
        run_config = worker_run_config(args.app_dir, args.run_config)
    started = time.perf_counter()
    worker = PartyWorker(args.partition_id, args.num_partitions, run_config)
    path = socket_path(folder, args.partition_id)
    server = WorkerServer(path, worker.handle)

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    _LOG.info(
        "party worker %d of %d ready at %s (built in %.2f s)",
        args.partition_id,
        args.num_partitions,
        path,
        time.perf_counter() - started,
    )
    try:
        while True:
            server.serve_one()  # a refused or malformed request: one log line
    except (SystemExit, KeyboardInterrupt):
        return 0
    finally:
        server.close()
