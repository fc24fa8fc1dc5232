"""Who listens on the SuperNode's Runtime API port: the executor's own user only.

Flower's SuperExec authentication is one way: the executor signs its
``AcquireTask`` with the shared secret, but nothing tells the executor that
the server answering on ``127.0.0.1:Q`` is the SuperNode
(``flwr/supercore/dependencies/superexec.py``). Any local user may bind a
free loopback port. While the SuperNode is down (starting, restarting) such
a user could answer the executor's polls with tasks of their own: a FAB that
``flwr-clientapp`` installs and runs as the executor's user, or messages
that the warm ClientApp runs on a live run's party (its embeddings are the
node's features, its gradients change its model). So before each poll the
executor reads the kernel's socket table (``/proc/net/tcp``, ``tcp6``) and
refuses a port that a listener of another user holds. A user cannot bind a
port that the SuperNode holds (``SO_REUSEPORT`` is refused across users), so
a port the check found held by its own user stays so until the SuperNode
exits.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from tpsl_flwr.errors import PrivacyError

__all__ = ["PROC_TABLES", "check_listener", "listener_uids", "parse_table"]

PROC_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
"""The kernel's TCP socket tables (IPv4, IPv6) of this network namespace."""
_LISTEN = "0A"
"""``TCP_LISTEN`` in the tables' ``st`` column (``include/net/tcp_states.h``)."""


def parse_table(text: str, port: int) -> set[int]:
    r"""The uids of the listening sockets on ``port`` in one ``/proc/net/tcp*`` text.

    Each row is ``sl local_address rem_address st ... uid ...``; the local
    address ends in ``:PPPP`` (the port in hex), ``st`` is ``0A`` when the
    socket listens and the uid is the eighth column.

    Examples
    --------
    >>> row = "0: 0100007F:2382 00000000:0000 0A 0:0 00:0 0 1001 0 4242"
    >>> parse_table("\n".join(["header", row]), 0x2382)
    {1001}
    >>> parse_table("\n".join(["header", row]), 9094)
    set()
    """
    uids = set()
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 8 or cols[3] != _LISTEN:
            continue
        _, _, hex_port = cols[1].rpartition(":")
        if int(hex_port, 16) == port:
            uids.add(int(cols[7]))
    return uids


def listener_uids(port: int, tables: Iterable[Path] = PROC_TABLES) -> set[int]:
    """The uids of every socket listening on TCP ``port`` (any address).

    Raises
    ------
    PrivacyError
        If no table can be read (not Linux): the owner cannot be checked.
    """
    uids: set[int] = set()
    read = 0
    for table in tables:
        try:
            text = table.read_text(encoding="ascii")
        except OSError:
            continue
        read += 1
        uids |= parse_table(text, port)
    if not read:
        raise PrivacyError(
            "the warm executor cannot tell who listens on port "
            f"{port}: no socket table ({', '.join(map(str, tables))}) can be read; "
            "it runs on Linux only"
        )
    return uids


def check_listener(
    port: int, uid: int | None = None, tables: Iterable[Path] = PROC_TABLES
) -> bool:
    """Whether the Runtime API on ``port`` is up; raise if another user holds it.

    Parameters
    ----------
    port
        The SuperNode's Runtime API port.
    uid
        The user the SuperNode must run as; ``None``: this process's.
    tables
        The socket tables to read.

    Returns
    -------
    bool
        ``True``: only ``uid`` listens on ``port``; ``False``: nobody does
        (the SuperNode is not up yet).

    Raises
    ------
    PrivacyError
        If a socket of another user listens on ``port``, naming the uids.
    """
    want = os.getuid() if uid is None else uid
    uids = listener_uids(port, tables)
    others = sorted(uids - {want})
    if others:
        raise PrivacyError(
            f"port {port}, the SuperNode's Runtime API, is held by uid "
            f"{', '.join(map(str, others))}, not by uid {want}: another user may be "
            "impersonating the SuperNode; the executor sends it nothing (stop that "
            "process, or start the SuperNode on a port it holds)"
        )
    return bool(uids)
