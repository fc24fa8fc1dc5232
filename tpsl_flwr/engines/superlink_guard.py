"""A SuperLink that answers only its own OS user's processes (a peer-uid guard).

Open-source Flower 1.42 does not authenticate the Control API, and the
SuperLink cannot be kept to a Unix socket: ``flower-superlink`` serves the
Fleet, Control and Runtime (ServerAppIo) APIs with ``uvicorn.run(host=...,
port=...)`` on one TCP ``--host``/``--port`` (``flwr/superlink/cli/
flower_superlink.py``, ``_run_superlink_http_api``), with no ``uds``
option, and ``--serverappio-api-address`` is rejected; the ``flwr`` CLI, the
``flower-superexec`` it starts and the ServerApp process connect with a plain
``httpx.Client`` to ``host:port`` (``flwr/supercore/protobuf/client.py``,
``ProtobufClient``), so they can only reach TCP. On ``127.0.0.1`` every
local user could therefore list runs with their config, stream the
ServerApp's log (per-epoch test metrics) and start a run, i.e. run code as
the label party.

:func:`main` (``python -m tpsl_flwr.engines.superlink_guard ARGS``, with the
arguments of ``flower-superlink``) runs Flower's own ``flower-superlink``
with its ASGI app wrapped in :class:`PeerUidGuard`: before any request
reaches Flower, the guard finds the connecting socket in the kernel's TCP
table (``/proc/net/tcp``, ``tcp6``: the entry whose local address is the
request's client and whose remote address is the server, ``ESTABLISHED``)
and answers ``403`` unless its owner is the SuperLink's own uid. A peer that
is not found (another host, a closed or half-closed socket) is refused too.
Only this user's processes pass: the ``flwr`` CLI, ``flower-superexec``, the
ServerApp, local SuperNodes, and the Fleet proxy (nginx runs as this user:
:mod:`~tpsl_flwr.engines.deployment.fleet_proxy`). The legacy gRPC Control and Fleet
servers are never started (:data:`~tpsl_flwr.engines.deployment.fleet_proxy.BYPASS_ENV`
is removed from the environment).

It fails closed: the guard alone answers :data:`GUARD_PATH`, and the
launchers use :func:`guard_ready` as their readiness probe, which raises
unless that answer comes, and unless the listening socket of the port is
this user's (no other user's server squats on it).
"""

from __future__ import annotations

import ipaddress
import json
import os
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from logging import WARNING
from pathlib import Path
from typing import Any

from tpsl_flwr.engines.deployment.fleet_proxy import BYPASS_ENV
from tpsl_flwr.engines.processes import FlowerLaunchError

__all__ = [
    "GUARD_PATH",
    "PeerUidGuard",
    "guard_ready",
    "listener_uids",
    "main",
    "peer_uid",
    "superlink_command",
]

GUARD_PATH = "/.tpsl/peer-uid-guard"
"""Path that only the guard answers (``200``, JSON with its ``uid``)."""

PROC_NET = Path("/proc/net")
_ESTABLISHED, _LISTEN = "01", "0A"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def _proc_address(host: str, port: int) -> tuple[str, str]:
    """The ``/proc/net`` table and ``ADDR:PORT`` text of an IP address.

    The kernel prints each 32-bit word of the address as a host-order integer
    (``127.0.0.1`` is ``0100007F`` on little-endian machines) and the port in
    hexadecimal.
    """
    packed = ipaddress.ip_address(host).packed
    words = (packed[i : i + 4] for i in range(0, len(packed), 4))
    text = "".join(f"{int.from_bytes(w, sys.byteorder):08X}" for w in words)
    return ("tcp" if len(packed) == 4 else "tcp6"), f"{text}:{port:04X}"


def peer_uid(
    client: Sequence[Any], server: Sequence[Any], proc_net: Path = PROC_NET
) -> int | None:
    """The uid owning the local TCP socket connected from ``client`` to ``server``.

    Parameters
    ----------
    client, server : Sequence[Any]
        ``(host, port)`` of the peer and of the listening side, as an ASGI
        scope's ``client`` and ``server``.
    proc_net : Path
        Folder of the kernel's ``tcp``/``tcp6`` tables.

    Returns
    -------
    int | None
        The owner's uid, or ``None`` if no such ``ESTABLISHED`` socket exists
        here (a remote peer, a closed or half-closed one, an address that is
        not an IP). The table is read up to 3 times: a concurrent change can
        hide an entry from one read.
    """
    try:
        table, local = _proc_address(str(client[0]), int(client[1]))
        other, remote = _proc_address(str(server[0]), int(server[1]))
    except (ValueError, IndexError, TypeError):
        return None
    if other != table:
        return None
    for _ in range(3):
        try:
            lines = (proc_net / table).read_text().splitlines()[1:]
        except OSError:
            return None
        for line in lines:
            f = line.split()
            if f[1:4] == [local, remote, _ESTABLISHED] and f[9] != "0":
                return int(f[7])
    return None


def listener_uids(port: int, proc_net: Path = PROC_NET) -> set[int]:
    """The uids owning a listening TCP socket on ``port`` (any address)."""
    suffix = f":{port:04X}"
    owners = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc_net / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[1].endswith(suffix) and f[3] == _LISTEN:
                owners.add(int(f[7]))
    return owners


class PeerUidGuard:
    """ASGI wrapper: only connections from processes of ``uid`` reach ``app``.

    Parameters
    ----------
    app : App
        The ASGI app (Flower's SuperLink).
    uid : int | None
        Allowed uid; ``None``: this process's effective uid.
    proc_net : Path
        Folder of the kernel's TCP tables (see :func:`peer_uid`).
    """

    def __init__(
        self, app: App, uid: int | None = None, proc_net: Path = PROC_NET
    ) -> None:
        self.app = app
        self.uid = os.geteuid() if uid is None else uid
        self.proc_net = proc_net

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse, answer :data:`GUARD_PATH`, or hand the request to the app."""
        kind = scope["type"]
        if kind == "lifespan":
            await self.app(scope, receive, send)
            return
        client, server = scope.get("client"), scope.get("server")
        uid = None
        if kind in ("http", "websocket") and client and server:
            uid = peer_uid(client, server, self.proc_net)
        if uid != self.uid:
            _log_refusal(scope, uid)
            if kind == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            elif kind == "http":
                await _respond(send, 403, b"Forbidden: not the SuperLink's OS user\n")
            return
        if kind == "http" and scope.get("path") == GUARD_PATH:
            body = json.dumps({"uid": self.uid, "pid": os.getpid()}).encode()
            await _respond(send, 200, body, b"application/json")
            return
        await self.app(scope, receive, send)


async def _respond(
    send: Send, status: int, body: bytes, content_type: bytes = b"text/plain"
) -> None:
    headers = [(b"content-type", content_type), (b"connection", b"close")]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _log_refusal(scope: Scope, uid: int | None) -> None:
    from flwr.common.logger import log  # the SuperLink's own log

    who = "unknown" if uid is None else f"uid {uid}"
    log(
        WARNING,
        "peer-uid guard: refused %s %s from %s (%s)",
        scope["type"],
        scope.get("path", ""),
        scope.get("client"),
        who,
    )


def superlink_command(args: Sequence[str] = ()) -> list[str]:
    """The command that runs ``flower-superlink *args`` behind the guard."""
    return [sys.executable, "-m", __name__, *args]


def guard_ready(address: str, context: ssl.SSLContext | None = None) -> bool:
    """Whether the guarded SuperLink at ``address`` answers; raise if unguarded.

    Parameters
    ----------
    address : str
        ``host:port`` of the SuperLink.
    context : ssl.SSLContext | None
        ``None`` for HTTP, else the HTTPS context (verifying its certificate).

    Returns
    -------
    bool
        ``True`` once the guard answers :data:`GUARD_PATH` for this uid;
        ``False`` while nothing answers (not started yet).

    Raises
    ------
    FlowerLaunchError
        If the server answers without the guard (any HTTP error status), or
        if the port's listening socket is not (only) this user's.
    """
    scheme = "http" if context is None else "https"
    url = f"{scheme}://{address}{GUARD_PATH}"
    try:
        with urllib.request.urlopen(url, timeout=0.5, context=context) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise FlowerLaunchError(
            f"the SuperLink at {address} answered {GUARD_PATH} with HTTP "
            f"{err.code}: it does not run behind the peer-uid guard ({__name__}), "
            "so other local users could reach its Control API; not using it"
        ) from None
    except (OSError, ValueError):
        return False
    uid = os.geteuid()
    owners = listener_uids(int(address.rsplit(":", 1)[1]))
    if owners != {uid} or answer.get("uid") != uid:
        raise FlowerLaunchError(
            f"{address} is listened on by uid(s) {sorted(owners)} (guard of uid "
            f"{answer.get('uid')}), not only by this user (uid {uid}); not using it"
        )
    return True


def main(argv: Sequence[str] | None = None) -> None:
    """Run Flower's ``flower-superlink`` with its HTTP app behind the guard.

    Parameters
    ----------
    argv : Sequence[str] | None
        ``flower-superlink`` arguments; ``None``: ``sys.argv[1:]``.
    """
    import uvicorn
    from flwr.superlink.cli.flower_superlink import flower_superlink

    for name in BYPASS_ENV:  # unguarded gRPC Control/Fleet servers: never
        os.environ.pop(name, None)
    serve = uvicorn.run

    def guarded_run(app: App, *args: Any, **kwargs: Any) -> None:
        serve(PeerUidGuard(app), *args, **kwargs)

    uvicorn.run = guarded_run  # type: ignore[assignment]  # Flower: uvicorn.run(app=)
    sys.argv = ["flower-superlink", *(sys.argv[1:] if argv is None else argv)]
    flower_superlink()


if __name__ == "__main__":
    main()
