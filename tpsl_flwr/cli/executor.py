"""``tpsl-flwr executor``: serve a SuperNode's ClientApp tasks from one warm process.

Beside ``flower-supernode --isolation process --port Q`` (its Runtime API on
``127.0.0.1:Q``), in place of ``flower-superexec``::

    tpsl-flwr executor --appio-api-address 127.0.0.1:Q

The executor itself is :mod:`tpsl_flwr.engines.executor.warm`.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from tpsl_flwr._util.private_files import read_private
from tpsl_flwr.engines.executor.fab_match import DEFAULT_WARM_APP, preload
from tpsl_flwr.engines.executor.warm import ExecutorSettings, WarmExecutor
from tpsl_flwr.errors import ConfigError

__all__ = ["add_parser", "check_loopback", "cmd_executor"]

_LOG = logging.getLogger("tpsl_flwr.executor")


def check_loopback(address: str) -> str:
    """``address`` if its host is loopback (``127.x``, ``::1``, ``localhost``).

    The Runtime API hands out every task of the node to whoever asks; the
    executor never reaches for one across a network.

    Examples
    --------
    >>> check_loopback("127.0.0.1:9094")
    '127.0.0.1:9094'
    >>> check_loopback("10.0.0.2:9094")
    Traceback (most recent call last):
    ...
    tpsl_flwr.errors.ConfigError: --appio-api-address must be on loopback (127.0.0.1, ::1 or localhost), got '10.0.0.2:9094'
    """  # noqa: E501
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    loopback = host == "localhost"
    if not loopback:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
    if not (sep and port.isdigit() and loopback):
        raise ConfigError(
            "--appio-api-address must be on loopback (127.0.0.1, ::1 or "
            f"localhost), got {address!r}"
        )
    return address


def add_parser(subparsers: Any) -> None:
    """Add the ``executor`` subcommand to the CLI's subparsers."""
    parser = subparsers.add_parser(
        "executor",
        help="serve a SuperNode's ClientApp tasks from one warm process",
        description=(
            "In place of flower-superexec beside flower-supernode --isolation "
            "process: acquire the SuperNode's tasks and run the allow-listed "
            "ClientApp in this one process, loaded once."
        ),
    )
    parser.add_argument(
        "--appio-api-address",
        "--runtime-api-address",
        dest="address",
        required=True,
        help="the SuperNode's Runtime (AppIo) API, host:port on loopback",
    )
    parser.add_argument(
        "--warm-app",
        action="append",
        default=None,
        help=f"a ClientApp allowed to run warm (default: {DEFAULT_WARM_APP}); "
        "repeat for more; any other app runs in flwr-clientapp processes",
    )
    parser.add_argument(
        "--superexec-auth-secret-file",
        type=Path,
        default=None,
        help="the secret file the SuperNode was given (mode 0600)",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=0.05,
        help="longest wait between two task polls when idle, s (default 0.05)",
    )
    parser.add_argument(
        "--task-timeout",
        type=float,
        default=None,
        help="the task bound, s (default: the run config's reply-timeout, else "
        "600); a ClientApp past it gets an error reply and the executor restarts",
    )
    parser.add_argument(
        "--supernode-uid",
        type=int,
        default=None,
        help="the user the SuperNode runs as (default: this user); the executor "
        "refuses a Runtime API port that any other user listens on",
    )
    parser.add_argument(
        "--no-preload",
        dest="preload",
        action="store_false",
        help="import the warm apps on their first task, not at start",
    )
    parser.set_defaults(handler=cmd_executor)


def cmd_executor(args: argparse.Namespace) -> int:
    """``executor``: serve tasks until SIGTERM/SIGINT."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per poll
    address = check_loopback(args.address)
    secret = None
    if args.superexec_auth_secret_file is not None:
        secret = read_private(args.superexec_auth_secret_file)
    apps = tuple(args.warm_app or (DEFAULT_WARM_APP,))
    settings = ExecutorSettings(
        runtime_api_address=address,
        warm_apps=apps,
        poll_interval=args.poll_interval,
        task_timeout=args.task_timeout,
        auth_secret=secret,
        supernode_uid=args.supernode_uid,
        restart_argv=[sys.executable, "-m", "tpsl_flwr.cli", *sys.argv[1:]]
        if sys.argv[1:2] == ["executor"]
        else None,
    )
    if args.preload:
        preload(apps)
    executor = WarmExecutor(settings)
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    _LOG.info("executor ready for %s (warm: %s)", address, ", ".join(apps))
    try:
        executor.run_forever(stop)
    finally:
        executor.close()
    return 0
