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
executor asks the kernel who listens on the port (``sock_diag`` over
netlink, as ``ss -ltn`` does: well under a millisecond; else the socket
tables ``/proc/net/tcp``, ``tcp6``, which can take milliseconds to read) and
refuses a port that a listener of another user holds. A user cannot bind a
port that the SuperNode holds (``SO_REUSEPORT`` is refused across users), so
a port the check found held by its own user stays so until the SuperNode
exits.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterable
from pathlib import Path

from tpsl_flwr.errors import PrivacyError

__all__ = [
    "PROC_TABLES",
    "check_listener",
    "diag_listener_uids",
    "listener_uids",
    "parse_table",
]

PROC_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
"""The kernel's TCP socket tables (IPv4, IPv6) of this network namespace."""
_LISTEN = "0A"
"""``TCP_LISTEN`` in the tables' ``st`` column (``include/net/tcp_states.h``)."""
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_HEADER = struct.Struct("=IHHII")
"""``struct nlmsghdr``: length, type, flags, sequence, port id."""
_UID_AT = 4 + 48 + 12
"""``idiag_uid`` in ``struct inet_diag_msg`` (``include/uapi/linux/inet_diag.h``)."""


def diag_listener_uids(port: int) -> set[int]:
    """The uids of the TCP sockets listening on ``port``, from ``sock_diag``.

    One dump of the listening sockets per address family
    (``SOCK_DIAG_BY_FAMILY`` with ``inet_diag_req_v2``, states
    ``1 << TCP_LISTEN``), as ``ss -ltn`` asks for them.

    Raises
    ------
    OSError
        If the kernel does not answer (no netlink ``sock_diag`` here).
    """
    uids = set()
    for family in (socket.AF_INET, socket.AF_INET6):
        request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 1 << 10)
        request += bytes(48)  # inet_diag_sockid: any
        header = _HEADER.pack(
            _HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, 1, 0
        )
        with socket.socket(
            socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG
        ) as link:
            link.settimeout(2.0)
            link.send(header + request)
            done = False
            while not done:
                data = link.recv(65536)
                if not data:
                    raise OSError("sock_diag: the kernel closed the netlink socket")
                offset = 0
                while offset + _HEADER.size <= len(data):
                    length, kind = _HEADER.unpack_from(data, offset)[:2]
                    if kind == _NLMSG_ERROR:
                        raise OSError("sock_diag: the kernel refused the dump")
                    if kind == _NLMSG_DONE or length < _HEADER.size:
                        done = True
                        break
                    body = data[offset + _HEADER.size : offset + length]
                    (sport,) = struct.unpack_from("!H", body, 4)
                    if sport == port:
                        uids.add(struct.unpack_from("=I", body, _UID_AT)[0])
                    offset += (length + 3) & ~3
    return uids


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


def listener_uids(port: int, tables: Iterable[Path] | None = None) -> set[int]:
    """The uids of every socket listening on TCP ``port`` (any address).

    From :func:`diag_listener_uids`; where netlink is refused (or ``tables``
    are given), from the socket tables.

    Raises
    ------
    PrivacyError
        If neither answers (not Linux): the owner cannot be checked.
    """
    if tables is None:
        try:
            return diag_listener_uids(port)
        except OSError:
            tables = PROC_TABLES
    tables = list(tables)
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
    port: int, uid: int | None = None, tables: Iterable[Path] | None = None
) -> bool:
    """Whether the Runtime API on ``port`` is up; raise if another user holds it.

    Parameters
    ----------
    port
        The SuperNode's Runtime API port.
    uid
        The user the SuperNode must run as; ``None``: this process's.
    tables
        The socket tables to read; ``None``: ask the kernel (netlink).

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
