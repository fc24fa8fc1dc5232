"""The party worker: its socket's access rules, its answers, the light ClientApp.

Malformed frames (issue 20): each kind is answered and logged once and the
worker serves the next request; a length claim allocates nothing; the client
checks the listener's uid before sending.

The worker (``tpsl-flwr party``) serves a node's messages over a Unix socket
in a 0700 folder; the per-message ClientApp forwards to it and imports no
torch. A real deployment with workers, checked against the in-process engine,
is ``tests/engines/test_engines.py::test_deployment_runtime_runs_tpsl_app`` (``slow``).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from tpsl_flwr.engines.virtual_nodes import task_identity
from tpsl_flwr.errors import ProtocolError
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.simulations.client_app import app as forwarding_app
from tpsl_flwr.simulations.node_app import app as node_app
from tpsl_flwr.simulations.party_worker import PartyWorker
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire import worker_link
from tpsl_flwr.wire.arrays import from_array, to_array
from tpsl_flwr.wire.batch_pack import stack_rows
from tpsl_flwr.wire.node_side import STATE_KEY
from tpsl_flwr.wire.worker_link import (
    MAX_FRAME_BYTES,
    WORKER_SOCKET,
    FrameError,
    WorkerError,
    WorkerServer,
    ask_worker,
    socket_path,
)


@pytest.fixture
def private_dir():
    # a short path: a Unix socket path must stay under ~100 bytes
    folder = Path(tempfile.mkdtemp(prefix="tpsl-test-"))
    yield folder
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()


def _serve(server: WorkerServer, count: int) -> threading.Thread:
    thread = threading.Thread(
        target=lambda: [server.serve_one() for _ in range(count)], daemon=True
    )
    thread.start()
    return thread


def _echo(message: Message, context: Context) -> Message:
    return Message(message.content, reply_to=message)


def _message(content: RecordDict, message_type: str, run_id: int = 3) -> Message:
    with task_identity(run_id, 11, 1):
        msg = Message(content, dst_node_id=11, message_type=message_type)
    msg.metadata.__dict__["_message_id"] = f"m-{message_type}-{id(msg)}"
    return msg


def test_socket_is_0600_in_a_0700_folder_and_a_loose_folder_is_refused(private_dir):
    # Arrange / Act
    server = WorkerServer(socket_path(private_dir, 0), _echo)
    try:
        # Assert: the folder reachable by its owner only, the socket 0600
        assert stat.S_IMODE(private_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE(server.path.stat().st_mode) == 0o600
    finally:
        server.close()
    assert not server.path.exists()
    for mode in (0o750, 0o705, 0o777):
        private_dir.chmod(mode)
        with pytest.raises(WorkerError, match="reachable by its owner only"):
            WorkerServer(socket_path(private_dir, 0), _echo)
    private_dir.chmod(0o700)


def test_a_peer_of_another_uid_gets_no_answer(private_dir):
    # Arrange: the server serves only a uid that is not ours (SO_PEERCRED)
    server = WorkerServer(
        socket_path(private_dir, 0), _echo, allowed_uid=os.getuid() + 1
    )
    thread = _serve(server, 1)
    msg = _message(RecordDict({"c": ConfigRecord({"x": 1})}), "query")
    context = Context(3, 11, {}, RecordDict(), {})

    # Act / Assert: the connection is closed unanswered
    with pytest.raises(WorkerError, match="closed the connection"):
        ask_worker(server.path, msg, context)
    thread.join(timeout=10)
    assert server.refused == 1
    server.close()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_another_user_cannot_reach_the_socket(private_dir):
    # Arrange: a real other user (nobody) tries to connect
    server = WorkerServer(socket_path(private_dir, 0), _echo)
    code = (
        "import os, socket, sys\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n    s.connect(sys.argv[1])\nexcept PermissionError:\n"
        "    print('refused')\nelse:\n    print('connected')\n"
    )

    # Act
    done = subprocess.run(
        [sys.executable, "-c", code, str(server.path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    server.close()

    # Assert
    assert done.stdout.strip() == "refused", done.stderr


def test_the_clientapp_module_imports_no_torch():
    # Act: a fresh interpreter imports the FAB's clientapp component
    code = (
        "import sys\nimport tpsl_flwr.simulations.client_app as m\n"
        "assert isinstance(m.app, __import__('flwr').clientapp.ClientApp)\n"
        "print(sorted(n for n in ('torch', 'scipy', 'dp_accounting') "
        "if n in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )

    # Assert
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_the_worker_answers_as_the_node_app_does(private_dir):
    # Arrange: the same node twice: in this process, and behind a worker
    cfg = ExperimentConfig(dataset="breast-cancer", batch_size=32)
    run_config = cfg.to_run_config()
    path = socket_path(private_dir, 1)
    node_config = {P.PARTITION_ID: 1, P.NUM_PARTITIONS: 2, WORKER_SOCKET: str(path)}
    worker = PartyWorker(1, 2, run_config)
    server = WorkerServer(path, worker.handle)
    ids, rows = stack_rows([np.arange(8, dtype=np.int64)])
    hello = RecordDict({P.CONFIG: ConfigRecord({})})
    step = RecordDict(
        {
            P.CONFIG: ConfigRecord({P.BATCH_ROWS: rows}),
            P.NEW_IDS: ArrayRecord({P.IDS_KEY: to_array(ids)}),
        }
    )
    thread = _serve(server, 3)
    local = Context(3, 11, node_config, RecordDict(), run_config)
    remote = Context(3, 11, node_config, RecordDict(), run_config)
    replies = {}

    # Act: hello, then two steps (the second applies no gradient: same bottom)
    for name, context, app in (
        ("local", local, node_app),
        ("remote", remote, forwarding_app),
    ):
        got = []
        for content, kind in ((hello, "query.hello"), (step, "train"), (step, "train")):
            with task_identity(3, 11, 1):
                got.append(app(_message(content, kind), context))
        replies[name] = got
    thread.join(timeout=30)
    server.close()

    # Assert: the same answers; the node's state stays in the worker
    assert replies["local"][0].content[P.NODE] == replies["remote"][0].content[P.NODE]
    for mine, theirs in zip(replies["local"][1:], replies["remote"][1:], strict=True):
        a = from_array(mine.content[P.EMBEDDINGS][P.EMBEDDINGS_KEY])
        b = from_array(theirs.content[P.EMBEDDINGS][P.EMBEDDINGS_KEY])
        assert a.shape[0] == 8
        np.testing.assert_array_equal(a, b)
    assert len(remote.state) == 0 and len(local.state) > 0
    # the worker keeps its party in the app object: a version, no encoded copy
    kept = worker.contexts[3].state.config_records
    assert dict(kept[STATE_KEY]) == {"version": 2}
    assert len(worker.contexts[3].state.array_records) == 0


def _worker_run_and_step() -> tuple[PartyWorker, Context, np.ndarray, RecordDict]:
    """A worker of partition 1, run 3's context, and a step's ids and content."""
    cfg = ExperimentConfig(dataset="breast-cancer", batch_size=32)
    worker = PartyWorker(1, 2, cfg.to_run_config())
    context = Context(
        3,
        11,
        {P.PARTITION_ID: 1, P.NUM_PARTITIONS: 2},
        RecordDict(),
        cfg.to_run_config(),
    )
    ids, rows = stack_rows([np.arange(8, dtype=np.int64)])
    step = RecordDict(
        {
            P.CONFIG: ConfigRecord({P.BATCH_ROWS: rows}),
            P.NEW_IDS: ArrayRecord({P.IDS_KEY: to_array(ids)}),
        }
    )
    return worker, context, ids, step


def test_after_a_failed_message_a_worker_refuses_the_run_s_next_one():
    # Arrange: a node that answered a hello and a step
    worker, context, ids, step = _worker_run_and_step()
    worker.handle(
        _message(RecordDict({P.CONFIG: ConfigRecord({})}), "query.hello"), context
    )
    worker.handle(_message(step, "train"), context)
    bad = RecordDict(
        {
            P.CONFIG: ConfigRecord({P.BATCH_ROWS: "3,4"}),  # 7 rows claimed, 8 sent
            P.NEW_IDS: ArrayRecord({P.IDS_KEY: to_array(ids)}),
        }
    )

    # Act: a malformed message fails; then a good one
    with pytest.raises(Exception, match="add up to 7"):
        worker.handle(_message(bad, "train"), context)
    with pytest.raises(Exception, match="kept in the process that served") as refused:
        worker.handle(_message(step, "train"), context)

    # Assert: the context kept the last good version; no fresh or half-updated party
    assert dict(worker.contexts[3].state.config_records[STATE_KEY]) == {"version": 1}
    assert "has none" in str(refused.value)


def test_a_worker_refuses_a_run_whose_hello_it_did_not_answer():
    # Arrange: a worker (re)started in the middle of run 3
    worker, context, _ids, step = _worker_run_and_step()

    # Act / Assert: no fresh party for the run's next step; a hello starts one
    with pytest.raises(ProtocolError, match=r"holds no state of run 3.*resume"):
        worker.handle(_message(step, "train"), context)
    assert worker.contexts == {}
    worker.handle(
        _message(RecordDict({P.CONFIG: ConfigRecord({})}), "query.hello"), context
    )
    assert worker.handle(_message(step, "train"), context).content[P.EMBEDDINGS]


def test_a_second_worker_on_a_live_socket_is_refused_a_stale_one_replaced(
    private_dir,
):
    # Arrange: a serving worker's socket, and a stale one left by a dead worker
    path = socket_path(private_dir, 0)
    serving = WorkerServer(path, _echo)
    stale_path = socket_path(private_dir, 1)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(stale_path))
    stale.close()  # the file stays, nobody listens
    try:
        # Act / Assert
        with pytest.raises(WorkerError, match="already serving"):
            WorkerServer(path, _echo)
        assert path.is_socket()
        WorkerServer(stale_path, _echo).close()
    finally:
        serving.close()


def test_a_worker_refuses_a_node_of_another_partition():
    # Arrange
    worker = PartyWorker(0, 2)
    context = Context(3, 11, {P.PARTITION_ID: 1, P.NUM_PARTITIONS: 2}, RecordDict(), {})

    # Act / Assert
    with pytest.raises(Exception, match="serves partition 0 of 2"):
        worker.handle(_message(RecordDict(), "train"), context)


# ------------------------------------------------------- malformed frames, uids
def _raw_request(path: Path, data: bytes) -> bytes:
    """Send ``data`` as is, half-close, and read whatever the worker answers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(str(path))
        conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
        chunks = []
        try:
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
    return b"".join(chunks)


_GIB16 = 16 << 30
_LENGTH = struct.Struct(">Q")
MALFORMED = {
    "short header": (b"\x00\x00\x01", "truncated frame header"),
    "text as header": (b"GET / HTTP/1.1\r\n\r\n", "bytes refused"),
    "truncated body": (_LENGTH.pack(100) + b"x" * 10, "after 10 of 100 bytes"),
    "message longer than frame": (
        _LENGTH.pack(12) + _LENGTH.pack(999) + b"abcd",
        "message has 999 bytes",
    ),
    "undecodable payload": (
        _LENGTH.pack(11) + _LENGTH.pack(3) + b"\xff\xff\xff",
        "undecodable request",
    ),
    "16 GiB claim": (_LENGTH.pack(_GIB16), f"frame of {_GIB16} bytes refused"),
}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_a_malformed_frame_is_answered_logged_and_the_next_one_served(
    private_dir, caplog, kind
):
    # Arrange: a worker serving two connections
    data, reason = MALFORMED[kind]
    server = WorkerServer(socket_path(private_dir, 0), _echo)
    thread = _serve(server, 2)
    msg = _message(RecordDict({"c": ConfigRecord({"x": 1})}), "query")
    context = Context(3, 11, {}, RecordDict(), {})

    # Act: the malformed request, then a valid one
    with caplog.at_level(logging.WARNING, logger=worker_link.__name__):
        answer = _raw_request(server.path, data)
        reply = ask_worker(server.path, msg, context)
    thread.join(timeout=10)
    server.close()

    # Assert: an error answer naming the fault, one log line, the next served
    assert answer[_LENGTH.size : _LENGTH.size + 2] == b"er"
    assert reason in answer.decode("utf-8", errors="replace")
    lines = [r.getMessage() for r in caplog.records if r.name == worker_link.__name__]
    assert len(lines) == 1 and reason in lines[0], lines
    assert server.dropped == 1 and not thread.is_alive()
    assert reply["c"]["x"] == 1


@pytest.mark.parametrize(
    ("claim", "reason"),
    [(_GIB16, "bytes refused"), (512 << 20, "after 64 of 536870912 bytes")],
)
def test_a_large_length_claim_allocates_nothing(private_dir, claim, reason):
    # Arrange: the claim is queued on the socket before the worker accepts
    server = WorkerServer(socket_path(private_dir, 0), _echo)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(server.path))
    client.sendall(_LENGTH.pack(claim) + b"x" * 64)
    client.shutdown(socket.SHUT_WR)

    # Act: serve it under tracemalloc
    tracemalloc.start()
    started = time.perf_counter()
    try:
        served = server.serve_one()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    elapsed = time.perf_counter() - started
    answer = client.recv(65536)
    client.close()
    server.close()

    # Assert: refused (or found truncated) at once; memory follows the data
    assert not served and server.dropped == 1
    assert reason in answer.decode()
    assert peak < 4 << 20, peak
    assert elapsed < 5.0
    assert MAX_FRAME_BYTES < _GIB16


def test_the_client_refuses_a_server_of_another_uid(private_dir, monkeypatch):
    # Arrange: a plain listener; SO_PEERCRED made to report another uid
    path = socket_path(private_dir, 0)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    other = os.getuid() + 1
    monkeypatch.setattr(worker_link, "peer_uid", lambda conn: other)
    msg = _message(RecordDict({"c": ConfigRecord({"x": 1})}), "query")
    context = Context(3, 11, {}, RecordDict(), {})

    # Act
    with pytest.raises(WorkerError) as raised:
        ask_worker(path, msg, context)
    conn, _ = listener.accept()
    conn.settimeout(5)
    received = conn.recv(65536)
    conn.close()
    listener.close()

    # Assert: both uids named, and not one byte was sent
    assert f"uid {other}" in str(raised.value)
    assert f"uid {os.getuid()}" in str(raised.value)
    assert received == b""


def test_the_client_refuses_a_request_above_the_frame_limit(private_dir, monkeypatch):
    # Arrange: a limit smaller than the request; no worker needed
    monkeypatch.setattr(worker_link, "MAX_FRAME_BYTES", 64)
    msg = _message(RecordDict({"c": ConfigRecord({"x": "y" * 100})}), "query")
    context = Context(3, 11, {}, RecordDict(), {})

    # Act / Assert
    with pytest.raises(FrameError, match="limit of 64 bytes"):
        ask_worker(socket_path(private_dir, 0), msg, context)
