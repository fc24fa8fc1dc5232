"""The Flower internals the warm executor is built on are where it expects them."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest

from tpsl_flwr.engines.executor import flower_seam


def test_every_flower_symbol_the_executor_uses_is_where_it_expects() -> None:
    # Execute
    gone = flower_seam.missing()

    # Assert: a Flower that moved one fails here, naming module.symbol
    assert gone == [], f"the installed Flower moved: {', '.join(gone)}"


def test_the_functions_it_calls_by_position_keep_their_parameters() -> None:
    # Execute
    changed = flower_seam.moved_signatures()

    # Assert
    assert changed == [], "; ".join(changed)


def test_a_moved_symbol_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: a symbol Flower does not have, and a module it does not have
    seam = {
        **flower_seam.SEAM,
        "pull_task_input_v2": "flwr.supernode.runtime.run_clientapp",
        "RuntimeHttpClient": "flwr.supercore.no_such_module",
    }
    monkeypatch.setattr(flower_seam, "SEAM", seam)

    # Execute
    gone = flower_seam.missing()

    # Assert
    assert gone == [
        "flwr.supercore.no_such_module.RuntimeHttpClient",
        "flwr.supernode.runtime.run_clientapp.pull_task_input_v2",
    ]


def test_a_changed_signature_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: what the executor would expect of a changed push_message
    signatures = {**flower_seam.SIGNATURES, "push_message": ("client", "message")}
    monkeypatch.setattr(flower_seam, "SIGNATURES", signatures)

    # Execute
    changed = flower_seam.moved_signatures()

    # Assert
    assert changed == [
        "flwr.supernode.runtime.run_clientapp.push_message('client', 'message') is "
        "now push_message('client', 'message', 'context')"
    ]


def test_the_executor_reads_the_pull_backoff_it_shortens_from_flower() -> None:
    # The warm executor's pull retries after 5 ms where Flower waits 1 s; if
    # Flower drops the wait, the executor's own pull is no longer needed.
    from flwr.supercore import constant

    assert constant.PULL_INITIAL_BACKOFF == 1


class _Beating:
    """A Runtime API client whose task heartbeat answers ``success`` or ``status``."""

    def __init__(self, success: bool = True, status: int | None = None) -> None:
        self.success, self.status = success, status

    def SendTaskHeartbeat(self, request: object) -> object:
        if self.status is not None:
            url = "http://127.0.0.1:9/v1/runtime/send-task-heartbeat"
            request_ = httpx.Request("POST", url)
            response = httpx.Response(self.status, request=request_)
            raise httpx.HTTPStatusError("refused", request=request_, response=response)
        return SimpleNamespace(success=self.success)


@pytest.fixture
def sigints() -> Iterator[list[int]]:
    seen: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    yield seen
    signal.signal(signal.SIGINT, previous)


def test_flowers_own_heartbeat_interrupts_the_whole_process(
    sigints: list[int],
) -> None:
    # What the warm executor must not use: one rejected task stops it
    beat = flower_seam.make_task_heartbeat_fn_http(_Beating(success=False))
    beat()
    assert sigints == [signal.SIGINT]


@pytest.mark.parametrize(
    ("client", "why"),
    [
        (_Beating(success=False), "rejected the task heartbeat"),
        (_Beating(status=401), "HTTP 401"),
        (_Beating(status=403), "HTTP 403"),
    ],
)
def test_a_rejected_heartbeat_is_reported_not_a_sigint(
    sigints: list[int], client: _Beating, why: str
) -> None:
    rejected: list[str] = []
    beat = flower_seam.task_heartbeat_fn(client, rejected.append)

    assert beat() is True  # no retry
    assert sigints == []
    assert len(rejected) == 1 and why in rejected[0]


def test_a_busy_supernode_is_retried_and_a_live_task_is_fine(
    sigints: list[int],
) -> None:
    rejected: list[str] = []
    assert (
        flower_seam.task_heartbeat_fn(_Beating(status=503), rejected.append)() is False
    )
    assert flower_seam.task_heartbeat_fn(_Beating(), rejected.append)() is True
    assert rejected == [] and sigints == []


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_heartbeat_through_the_executors_client_is_reported(
    sigints: list[int], status: int
) -> None:
    # Prepare: the executor's own client (Flower's, with the executor's retry
    # invoker) to a SuperNode that refuses the task's heartbeat: its token
    # expired (401) or its run is over (403, which Flower's invoker turns
    # into a RunNotRunningException, a BaseException)
    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, request=request)

    client = flower_seam.RuntimeHttpClient.from_server_address(
        server_address="127.0.0.1:9",
        insecure=True,
        root_certificates=None,
        interceptors=[],
        retry_invoker=flower_seam.unsignalled_retry_invoker(),
    )
    client._client = httpx.Client(transport=httpx.MockTransport(refuse))
    rejected: list[str] = []

    # Execute
    try:
        done = flower_seam.task_heartbeat_fn(client, rejected.append)()
    finally:
        client.close()

    # Assert: reported once, no retry, no SIGINT
    assert done is True
    assert rejected == [f"the task heartbeat got HTTP {status}"]
    assert sigints == []
