"""The warm executor's decisions, without a SuperNode (its runs are ``slow``)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from tpsl_flwr.cli.executor import check_loopback
from tpsl_flwr.engines.executor import warm
from tpsl_flwr.engines.executor.fab_match import DEFAULT_WARM_APP, WarmVerdict
from tpsl_flwr.engines.executor.warm import (
    DEFAULT_TASK_BOUND,
    EXIT_STUCK,
    ExecutorSettings,
    WarmExecutor,
    error_reason,
    node_name,
    restart,
    task_bound,
)
from tpsl_flwr.engines.virtual_nodes import task_identity
from tpsl_flwr.errors import ConfigError, PrivacyError, ProtocolError
from tpsl_flwr.wire.node_edge import read_node_error

THEIR_PYPROJECT = """
[project]
name = "app"
version = "1.0.0"

[tool.flwr.app]
publisher = "someone"

[tool.flwr.app.components]
serverapp = "theirapp.server:app"
clientapp = "theirapp.client:app"
"""


def _context(node_config: dict[str, int | str]) -> Context:
    return Context(7, 42, dict(node_config), RecordDict(), {})


@pytest.fixture
def executor(tmp_path: Path) -> Iterator[WarmExecutor]:
    made = WarmExecutor(ExecutorSettings("127.0.0.1:9"))  # never contacted
    yield made
    made.close()


def test_an_error_reply_names_the_node_and_its_partition() -> None:
    # Prepare
    context = _context({"partition-id": 1, "num-partitions": 2})

    # Execute
    reason = error_reason(ValueError("bad batch\nsecond line"), context)

    # Assert: the label party reads the partition and the root cause back
    assert reason.startswith("<class 'tpsl_flwr.wire.node_edge.NodeFailure'>:<'")
    found = read_node_error(reason)
    assert (found.partition, found.cause) == (1, "ValueError: bad batch")
    assert node_name(context) == "node 42 (partition 1)"


def test_an_error_that_names_its_partition_is_kept_as_it_is() -> None:
    context = _context({"partition-id": 0, "num-partitions": 2})
    marked = RuntimeError("[tpsl partition 0 of 2] KeyError: 'x'")

    assert error_reason(marked, context) == (
        "<class 'RuntimeError'>:<'[tpsl partition 0 of 2] KeyError: 'x''>"
    )
    assert error_reason(marked, None).startswith("<class 'RuntimeError'>")


def test_the_task_bound_is_the_flag_else_the_reply_timeout_else_600() -> None:
    plain = ExecutorSettings("127.0.0.1:1")
    flagged = ExecutorSettings("127.0.0.1:1", task_timeout=5.0)

    assert task_bound(flagged, {"reply-timeout": 40.0}) == 5.0
    assert task_bound(plain, {"reply-timeout": 40}) == 40.0
    assert task_bound(plain, {"reply-timeout": True}) == DEFAULT_TASK_BOUND
    assert task_bound(plain, {}) == DEFAULT_TASK_BOUND


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"poll_interval": 0.0}, "poll_interval must be in (0, 60] seconds, got 0.0"),
        ({"task_timeout": -1.0}, "task_timeout must be > 0, got -1.0"),
        ({"warm_apps": ()}, "warm_apps must name at least one ClientApp"),
    ],
)
def test_settings_refuse_bad_values_naming_them(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError) as err:
        ExecutorSettings("127.0.0.1:1", **options)  # type: ignore[arg-type]
    assert str(err.value) == message


def test_the_runtime_api_address_must_be_loopback() -> None:
    assert check_loopback("[::1]:9094") == "[::1]:9094"
    assert check_loopback("localhost:9094") == "localhost:9094"
    for address in ("0.0.0.0:9094", "192.168.1.4:9094", "127.0.0.1", "node:9094"):
        with pytest.raises(ConfigError, match="must be on loopback"):
            check_loopback(address)


def test_one_fab_at_most_runs_warm(executor: WarmExecutor) -> None:
    # Prepare: two bundles judged warm (same code, e.g. another pyproject)
    ok = WarmVerdict("tpsl_flwr.simulations.client_app:app", None)
    executor.verdicts = {"a" * 64: ok, "b" * 64: ok, "c" * 64: WarmVerdict(None, "x")}

    # Execute / Assert: the first one served warm keeps the process
    assert executor.warm_for("b" * 64)
    assert not executor.warm_for("a" * 64)
    assert not executor.warm_for("c" * 64)
    assert not executor.warm_for("d" * 64)  # never judged: stock first
    assert executor.warm_hash == "b" * 64


def test_an_unjudged_bundle_is_judged_once_installed(
    executor: WarmExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: FLWR_HOME without the bundle, then with one of foreign code
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    fab_hash = "0123abcd" + "0" * 56

    # Execute / Assert: not installed yet -> not remembered, judged later
    assert executor.judge(fab_hash).reason == "not installed yet"
    assert fab_hash not in executor.verdicts
    app = tmp_path / "apps" / "someone.app.1.0.0.0123abcd"
    (app / "theirapp").mkdir(parents=True)
    (app / "pyproject.toml").write_text(THEIR_PYPROJECT)
    verdict = executor.judge(fab_hash)
    assert verdict.reason is not None and "not in --warm-app" in verdict.reason
    assert executor.verdicts[fab_hash] is verdict
    assert not executor.warm_for(fab_hash)


def test_a_stuck_task_without_a_restart_command_exits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    codes: list[int] = []
    monkeypatch.setattr(warm.os, "execv", lambda *a: codes.append(-1))

    restart(None, exit_=codes.append)

    assert codes == [EXIT_STUCK]


# ------------------------------------------------- refusals by the SuperNode
FAB = "f" * 64
"""The one bundle of the fake SuperNode's tasks, judged warm beforehand."""


class _FakeSuperNode:
    """A SuperNode's Runtime API, as HTTP answers (``httpx.MockTransport``).

    It hands out ``tasks`` (task id, run id) in order, accepts every task
    heartbeat, and answers a task's status push with ``refuse[task id]``
    (an HTTP status) or success; ``acquire_status`` refuses ``AcquireTask``.
    """

    def __init__(self, tasks: list[tuple[int, int]]) -> None:
        self.tasks = list(tasks)
        self.refuse: dict[int, int] = {}
        self.acquire_status: int | None = None
        self.current: tuple[int, int] | None = None
        self.statuses: list[tuple[int, str, str]] = []
        self.replies: list[Message] = []  # as the executor pushed them

    def handle(self, request: httpx.Request) -> httpx.Response:
        from flwr.proto.runtime_pb2 import (  # pylint: disable=E0611
            AcquireTaskResponse,
            PushTaskOutputRequest,
            PushTaskOutputResponse,
            SendTaskHeartbeatResponse,
        )

        path = request.url.path
        if path.endswith("/acquire-task"):
            if self.acquire_status is not None:
                return httpx.Response(self.acquire_status, request=request)
            answer = AcquireTaskResponse()
            if self.tasks:
                self.current = self.tasks.pop(0)
                task_id, run_id = self.current
                answer.task.task_id, answer.task.run_id = task_id, run_id
                answer.task.fab_hash = FAB
                answer.token = f"token-{task_id}"
            return self._ok(answer, request)
        if path.endswith("/send-task-heartbeat"):
            return self._ok(SendTaskHeartbeatResponse(success=True), request)
        if path.endswith("/push-task-output"):
            task_id = int(request.headers["flwr-task-token"].rpartition("-")[2])
            pushed = PushTaskOutputRequest()
            pushed.ParseFromString(request.content)
            self.statuses.append((task_id, pushed.sub_status, pushed.details))
            if task_id in self.refuse:
                return httpx.Response(self.refuse[task_id], request=request)
            return self._ok(PushTaskOutputResponse(), request)
        return httpx.Response(404, request=request)

    @staticmethod
    def _ok(answer: Any, request: httpx.Request) -> httpx.Response:
        headers = {"content-type": "application/protobuf"}
        return httpx.Response(
            200, content=answer.SerializeToString(), headers=headers, request=request
        )


@pytest.fixture
def sigints() -> Iterator[list[int]]:
    seen: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    yield seen
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def supernode(monkeypatch: pytest.MonkeyPatch) -> _FakeSuperNode:
    """The fake SuperNode behind every Runtime API client the executor makes.

    Flower's own client, interceptors, retry invoker (the executor's), task
    heartbeat and ``push_task_output`` run as they are; only the transport is
    the fake's, the task input is built here (``pull_input``) and replies are
    recorded (``push_message``).
    """
    from tpsl_flwr.engines.executor import flower_seam

    fake = _FakeSuperNode([])
    base = flower_seam.RuntimeHttpClient

    class _Client(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._client = httpx.Client(transport=httpx.MockTransport(fake.handle))

    def pull_input(client: Any, times: Any = None) -> tuple[Any, ...]:
        assert fake.current is not None
        task_id, run_id = fake.current
        with task_identity(run_id, 42, task_id):
            message = Message(RecordDict(), dst_node_id=42, message_type="train")
        message.metadata.__dict__["_message_id"] = f"message-{task_id}"
        node_config = {"partition-id": 1, "num-partitions": 2}
        context = Context(run_id, 42, node_config, RecordDict(), {})
        run = SimpleNamespace(fab_hash=FAB)
        return message, context, run, SimpleNamespace(hash_str=FAB)

    monkeypatch.setattr(flower_seam, "RuntimeHttpClient", _Client)
    monkeypatch.setattr(flower_seam, "pull_input", pull_input)

    def push_message(client: Any, reply: Message, context: Context) -> None:
        fake.replies.append(reply)

    monkeypatch.setattr(flower_seam, "push_message", push_message)
    monkeypatch.setattr(warm, "check_listener", lambda port, uid: True)
    return fake


def _warm_executor(called: list[int]) -> WarmExecutor:
    """An executor with the fake's bundle loaded warm: an app that counts calls."""
    app = ClientApp()

    @app.train()
    def train(message: Message, context: Context) -> Message:
        called.append(context.run_id)
        return Message(RecordDict(), reply_to=message)

    executor = WarmExecutor(ExecutorSettings("127.0.0.1:9"))
    executor.verdicts = {FAB: WarmVerdict("fake.app:app", None)}
    executor.warm_hash = FAB
    executor._confirmed.add(FAB)  # its bytes judged (the fake sends none)
    executor.app = app
    return executor


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_status_push_fails_its_run_and_the_next_task_comes(
    supernode: _FakeSuperNode, sigints: list[int], status: int
) -> None:
    # Prepare: run 7's first status push is refused (its token expired: 401;
    # the run is over: 403), then run 7 sends again, then run 8 starts.
    supernode.tasks = [(1, 7), (2, 7), (3, 8)]
    supernode.refuse = {1: status}
    called: list[int] = []
    executor = _warm_executor(called)

    # Execute
    try:
        served = [executor.serve_next() for _ in range(4)]
    finally:
        executor.close()

    # Assert: no SIGINT; every task answered, the SuperNode's queue drained
    assert sigints == []
    assert served == [True, True, True, False]
    # run 7 is failed here, naming the refused push; its next message is an
    # error reply saying to resume, never run on the party
    assert "status push failed" in executor.failed_runs[7]
    assert called == [7, 8]
    second = supernode.replies[1]
    assert second.has_error()
    assert "an earlier message of run 7 failed here (status push failed" in (
        second.error.reason
    )
    assert "resume the run (resume = true)" in second.error.reason
    # ... while another run is served warm as before
    assert not supernode.replies[2].has_error()
    assert [(t, s) for t, s, _ in supernode.statuses] == [
        (1, "completed"),
        (2, "failed"),
        (3, "completed"),
    ]
    assert 8 not in executor.failed_runs


def test_a_refused_superexec_signature_stops_the_executor_naming_the_secret(
    supernode: _FakeSuperNode, sigints: list[int]
) -> None:
    # Prepare: the SuperNode refuses the executor's AcquireTask signature
    supernode.acquire_status = 401
    executor = _warm_executor([])

    # Execute / Assert: one error naming the secret, no SIGINT
    try:
        with pytest.raises(PrivacyError) as refused:
            executor.serve_next()
    finally:
        executor.close()
    assert str(refused.value) == (
        "the Runtime API at 127.0.0.1:9 refused the executor's SuperExec signature "
        "(HTTP 401): its secret is not the one given to this SuperNode"
    )
    assert sigints == []


def test_a_refused_acquire_task_is_logged_with_its_status_and_polled_on(
    supernode: _FakeSuperNode,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: the executor starts before its SuperNode (nothing listens), then
    # the SuperNode answers AcquireTask with 403 on every poll, then 404 (not a
    # signature problem: the executor polls on, and the log says it is refused)
    listening = [False]
    monkeypatch.setattr(warm, "check_listener", lambda port, uid: listening[0])
    executor = _warm_executor([])

    # Execute
    try:
        with caplog.at_level("WARNING"):
            served = [executor.serve_next()]
            listening[0] = True
            supernode.acquire_status = 403
            served += [executor.serve_next() for _ in range(3)]
            supernode.acquire_status = 404
            served.append(executor.serve_next())
    finally:
        executor.close()

    # Assert: no task; one line per change of failure, each naming its status
    assert served == [False] * 5
    lines = [r.getMessage() for r in caplog.records if "polling on" in r.getMessage()]
    assert len(lines) == 3
    assert "nothing listens on 127.0.0.1:9 yet" in lines[0]
    assert "127.0.0.1:9 refuses AcquireTask (HTTP 403)" in lines[1]
    assert "127.0.0.1:9 refuses AcquireTask (HTTP 404)" in lines[2]
    assert not any("does not answer" in line for line in lines)


def test_a_bundle_judged_warm_by_its_folder_but_not_by_its_bytes_is_refused(
    executor: WarmExecutor,
) -> None:
    # Prepare: a verdict from an installed folder (found by 8 hex digits of the
    # hash), then the task's own bytes: not a bundle of the imported code
    fab_hash = "ab" * 32
    executor.verdicts = {fab_hash: WarmVerdict(DEFAULT_WARM_APP, None)}
    assert executor.warm_for(fab_hash)

    # Execute / Assert: refused naming why; nothing warm is kept for it
    with pytest.raises(ProtocolError, match="its own bytes do not run warm"):
        executor._confirm_bytes(SimpleNamespace(hash_str=fab_hash, content=b"no"))
    assert not executor.verdicts[fab_hash].warm
    assert executor.warm_hash is None
    assert not executor.warm_for(fab_hash)
