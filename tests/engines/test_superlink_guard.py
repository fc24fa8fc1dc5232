"""Only the label party's OS user reaches its SuperLink (the peer-uid guard).

Fast tests read fake kernel TCP tables (the owner of an ``ESTABLISHED``
socket, never of a ``TIME_WAIT`` one), drive :class:`PeerUidGuard` as an ASGI
app, and check that :func:`guard_ready` refuses a server without the guard.
The ``slow`` ones start real SuperLinks (the plaintext deployment and the
simulation SuperLink) and make Control and Runtime calls as ``nobody``
(``setpriv``; root only): each gets ``403`` while the same calls, and
``flwr ls``, work for this user. Every process is ended by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tpsl_flwr.engines.deployment.runtime import DeploymentRuntime
from tpsl_flwr.engines.flower_env import offline_flower_env
from tpsl_flwr.engines.processes import (
    LAUNCH_ID_ENV,
    FlowerLaunchError,
    find_launched_processes,
    terminate_launched,
)
from tpsl_flwr.engines.simulation import start_simulation_superlink
from tpsl_flwr.engines.superlink_guard import (
    GUARD_PATH,
    PeerUidGuard,
    guard_ready,
    listener_uids,
    peer_uid,
)

_HEADER = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when "
    "retrnsmt   uid  timeout inode\n"
)


def _row(local: str, remote: str, state: str, uid: int, inode: int) -> str:
    return (
        f"   0: {local} {remote} {state} 00000000:00000000 00:00000000 "
        f"00000000 {uid:5d}        0 {inode} 1 0000000000000000 20 0 0 10 -1\n"
    )


LINK, ME, OTHER, GONE = 39555, 59644, 59650, 59660  # 9A83, E8FC, E902, E90C
LO = "0100007F" if sys.byteorder == "little" else "7F000001"


@pytest.fixture
def proc_net(tmp_path: Path) -> Path:
    """A ``tcp`` table: a listener, two clients (uid 1000, 4242), a TIME_WAIT."""
    rows = [
        _row(f"{LO}:9A83", "00000000:0000", "0A", 1000, 11),
        _row(f"{LO}:9A83", f"{LO}:E8FC", "01", 1000, 12),  # server side
        _row(f"{LO}:E8FC", f"{LO}:9A83", "01", 1000, 13),
        _row(f"{LO}:E902", f"{LO}:9A83", "01", 4242, 14),
        _row(f"{LO}:E90C", f"{LO}:9A83", "06", 0, 0),
    ]
    (tmp_path / "tcp").write_text(_HEADER + "".join(rows))
    (tmp_path / "tcp6").write_text(_HEADER)
    return tmp_path


def test_peer_uid_reads_the_owner_of_the_connecting_socket(proc_net: Path) -> None:
    server = ("127.0.0.1", LINK)
    assert peer_uid(("127.0.0.1", ME), server, proc_net) == 1000
    assert peer_uid(("127.0.0.1", OTHER), server, proc_net) == 4242
    # TIME_WAIT rows carry uid 0 and no inode: never an owner
    assert peer_uid(("127.0.0.1", GONE), server, proc_net) is None
    assert peer_uid(("127.0.0.1", 1), server, proc_net) is None
    assert peer_uid(("10.0.0.9", ME), server, proc_net) is None  # not this host
    assert peer_uid(("::1", ME), server, proc_net) is None  # tcp6 is empty
    assert peer_uid(("not-an-ip", ME), server, proc_net) is None
    assert listener_uids(LINK, proc_net) == {1000}
    assert listener_uids(ME, proc_net) == set()


@contextlib.contextmanager
def _connected() -> Iterator[tuple[tuple[str, int], tuple[str, int]]]:
    """A client connected to a listener on 127.0.0.1: (client, server) addresses."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = listener.accept()
            with accepted:
                yield client.getsockname(), ("127.0.0.1", port)


def test_peer_uid_of_a_real_connection_is_this_user() -> None:
    with _connected() as (client, server):
        assert peer_uid(client, server) == os.geteuid()
        assert listener_uids(server[1]) == {os.geteuid()}


def _call(guard: PeerUidGuard, scope: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    asyncio.run(guard(scope, receive, send))
    return sent


def test_guard_refuses_other_users_before_the_app(proc_net: Path) -> None:
    # Prepare
    calls: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        calls.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"runs"})

    guard = PeerUidGuard(app, uid=1000, proc_net=proc_net)

    def scope(port: int, path: str = "/v1/control/list-runs") -> dict[str, Any]:
        client, server = ("127.0.0.1", port), ("127.0.0.1", LINK)
        return {"type": "http", "path": path, "client": client, "server": server}

    # Execute
    other = _call(guard, scope(OTHER))
    gone = _call(guard, scope(GONE))
    mine = _call(guard, scope(ME))
    probe = _call(guard, scope(ME, GUARD_PATH))
    ws = _call(guard, {**scope(OTHER), "type": "websocket"})

    # Assert
    assert other[0]["status"] == gone[0]["status"] == 403
    assert b"runs" not in other[1]["body"] + gone[1]["body"]
    assert mine[0]["status"] == 200 and mine[1]["body"] == b"runs"
    assert probe[0]["status"] == 200
    assert json.loads(probe[1]["body"])["uid"] == 1000
    assert ws == [{"type": "websocket.close", "code": 1008}]
    assert calls == ["/v1/control/list-runs"]  # only this user's request


class _NoGuard(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


def test_guard_ready_refuses_a_server_without_the_guard() -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _NoGuard)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        address = f"127.0.0.1:{server.server_address[1]}"
        with pytest.raises(FlowerLaunchError, match="peer-uid guard"):
            guard_ready(address)
    finally:
        server.shutdown()
        server.server_close()
    assert guard_ready(address) is False  # nothing answers: not ready yet


# ----------------------------------------------------------- real SuperLinks
@pytest.fixture(scope="module")
def plain_runtime(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[DeploymentRuntime]:
    root = tmp_path_factory.mktemp("guarded-deployment")
    runtime = DeploymentRuntime(1, root / "logs", startup_timeout=90, grace_s=5)
    try:
        with runtime:
            yield runtime
    finally:
        assert find_launched_processes(runtime.launch_id) == []


@pytest.mark.slow
def test_deployment_control_and_runtime_refuse_other_users(
    only_this_user: Callable[[str, Path], None], plain_runtime: DeploymentRuntime
) -> None:
    runtime = plain_runtime

    only_this_user(f"http://{runtime.address}", runtime.log_dir / "superlink.log")

    # The label party's own CLI and its SuperNode still work
    nodes = runtime.list_supernodes()
    assert [n["status"] for n in nodes] == ["online"]
    ls = runtime.flwr_cli("ls", runtime.connection, "--format", "json")
    assert '"success": true' in ls.stdout, ls.stdout + ls.stderr


@pytest.mark.slow
def test_simulation_superlink_refuses_other_users(
    only_this_user: Callable[[str, Path], None], tmp_path: Path
) -> None:
    launch_id = uuid.uuid4().hex
    env = offline_flower_env(tmp_path / "flwr-home")
    env[LAUNCH_ID_ENV] = launch_id
    procs: list[subprocess.Popen[bytes]] = []
    try:
        address = start_simulation_superlink(tmp_path / "flwr-home", env, procs)

        only_this_user(
            f"http://{address}",
            tmp_path / "flwr-home" / "local-superlink" / "superlink.log",
        )
    finally:
        terminate_launched(launch_id, procs, grace_s=5)
    assert find_launched_processes(launch_id) == []
