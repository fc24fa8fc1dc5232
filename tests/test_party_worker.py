"""The party worker: its socket's access rules, its answers, the light ClientApp.

The worker (``tpsl-flwr party``) serves a node's messages over a Unix socket
in a 0700 folder; the per-message ClientApp forwards to it and imports no
torch. A real deployment with workers, checked against the in-process engine,
is ``tests/test_engines.py::test_deployment_runtime_runs_tpsl_app`` (``slow``).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from tpsl_flwr.engines.virtual_nodes import task_identity
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.simulations.client_app import app as forwarding_app
from tpsl_flwr.simulations.node_app import app as node_app
from tpsl_flwr.simulations.party_worker import PartyWorker
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.arrays import from_array, to_array
from tpsl_flwr.wire.worker_link import (
    WORKER_SOCKET,
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
    ids = to_array(np.arange(8, dtype=np.int64))
    hello = RecordDict({P.CONFIG: ConfigRecord({})})
    step = RecordDict({P.NEW_IDS: ArrayRecord({P.batch_key(0): ids})})
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
        a = from_array(mine.content[P.EMBEDDINGS][P.batch_key(0)])
        b = from_array(theirs.content[P.EMBEDDINGS][P.batch_key(0)])
        np.testing.assert_array_equal(a, b)
    assert len(remote.state) == 0 and len(local.state) > 0
    assert len(worker.contexts[3].state) > 0


def test_a_worker_refuses_a_node_of_another_partition():
    # Arrange
    worker = PartyWorker(0, 2)
    context = Context(3, 11, {P.PARTITION_ID: 1, P.NUM_PARTITIONS: 2}, RecordDict(), {})

    # Act / Assert
    with pytest.raises(Exception, match="serves partition 0 of 2"):
        worker.handle(_message(RecordDict(), "train"), context)
