"""The executor polls only a Runtime API port its own user listens on."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpsl_flwr.engines.executor.listener import (
    PROC_TABLES,
    check_listener,
    diag_listener_uids,
    listener_uids,
)
from tpsl_flwr.engines.executor.warm import ExecutorSettings, WarmExecutor
from tpsl_flwr.errors import PrivacyError

pytestmark = pytest.mark.skipif(
    not Path("/proc/net/tcp").exists(), reason="reads Linux's socket table"
)

TABLE = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:2382 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 111 1
   1: 0100007F:2382 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1002        0 112 1
   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 113 1
"""  # noqa: E501


class _Recorder(http.server.BaseHTTPRequestHandler):
    paths: list[str] = []
    status = 200

    def do_POST(self) -> None:
        self.paths.append(self.path)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(self.status)  # 200, empty: an AcquireTaskResponse, no task
        self.send_header("Content-Type", "application/protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def squatter(request: pytest.FixtureRequest) -> Iterator[tuple[int, list[str]]]:
    """A server on a free loopback port that records what it is sent."""
    paths: list[str] = []
    status = getattr(request, "param", 200)
    handler = type("Handler", (_Recorder,), {"paths": paths, "status": status})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], paths
    server.shutdown()
    server.server_close()
    thread.join()


def test_the_table_gives_the_listeners_uid_not_a_connections(tmp_path: Path) -> None:
    table = tmp_path / "tcp"
    table.write_text(TABLE)

    assert listener_uids(0x2382, [table]) == {1001}  # the ESTABLISHED row is not
    assert listener_uids(22, [table]) == {0}
    assert listener_uids(9094, [table]) == set()


def test_a_port_held_by_another_user_is_refused_naming_the_uid(
    tmp_path: Path,
) -> None:
    table = tmp_path / "tcp"
    table.write_text(TABLE)

    with pytest.raises(PrivacyError, match="held by uid 1001, not by uid 1000"):
        check_listener(0x2382, uid=1000, tables=[table])
    assert check_listener(0x2382, uid=1001, tables=[table])
    assert not check_listener(9094, uid=1001, tables=[table])


def test_without_a_socket_table_the_executor_fails_closed(tmp_path: Path) -> None:
    with pytest.raises(PrivacyError, match="cannot tell who listens"):
        check_listener(9094, tables=[tmp_path / "none"])


def test_the_kernel_names_this_user_for_a_port_it_listens_on(
    squatter: tuple[int, list[str]],
) -> None:
    port, _ = squatter
    assert listener_uids(port) == {os.getuid()}
    assert check_listener(port)


def test_the_executor_sends_nothing_to_another_users_listener(
    squatter: tuple[int, list[str]],
) -> None:
    # Prepare: the listener is this user's; the executor is told the SuperNode
    # runs as another, so to it the listener is a stranger's (a squatter)
    port, paths = squatter
    stranger = os.getuid() + 1
    executor = WarmExecutor(
        ExecutorSettings(f"127.0.0.1:{port}", supernode_uid=stranger)
    )
    try:
        # Execute / Assert: refused before any request, naming the owner
        with pytest.raises(PrivacyError, match=f"not by uid {stranger}"):
            executor.serve_next()
        assert paths == []
    finally:
        executor.close()


def test_the_executor_polls_its_own_users_supernode(
    squatter: tuple[int, list[str]],
) -> None:
    port, paths = squatter
    executor = WarmExecutor(ExecutorSettings(f"127.0.0.1:{port}"))
    try:
        assert not executor.serve_next()  # no task
        assert paths and paths[0].endswith("/acquire-task")
    finally:
        executor.close()


def test_nothing_listening_is_a_supernode_not_up_yet() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    executor = WarmExecutor(ExecutorSettings(f"127.0.0.1:{port}"))
    try:
        assert not executor.serve_next()
    finally:
        executor.close()


def test_netlink_and_the_socket_table_agree(
    squatter: tuple[int, list[str]],
) -> None:
    port, _ = squatter
    try:
        from_diag = diag_listener_uids(port)
    except OSError:
        pytest.skip("no netlink sock_diag here")
    assert from_diag == listener_uids(port, PROC_TABLES) == {os.getuid()}


@pytest.mark.parametrize("squatter", [401], indirect=True)
def test_a_refused_signature_stops_the_executor_naming_it_without_sigint(
    squatter: tuple[int, list[str]],
) -> None:
    # Prepare: Flower's own retry would SIGINT this process on a 401
    port, paths = squatter
    seen: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    executor = WarmExecutor(ExecutorSettings(f"127.0.0.1:{port}", auth_secret=b"x"))
    try:
        # Execute / Assert: one try, a clear error, no signal
        with pytest.raises(PrivacyError, match="HTTP 401"):
            executor.serve_next()
        assert len(paths) == 1 and seen == []
    finally:
        executor.close()
        signal.signal(signal.SIGINT, previous)
