"""The Flower internals the warm executor runs on, imported in this one place.

Flower 1.42 has no public API for an executor outside its own SuperExec: the
task protocol lives in ``flwr.supernode.runtime.run_clientapp`` (what
``flwr-clientapp`` does with one token) and ``flwr.supercore`` (the Runtime
API client, its interceptors, the task heartbeat). The executor reuses those
functions as they are rather than re-implementing the protocol, so every one
it touches is listed in :data:`SEAM`; a Flower that moved one fails to import
this module with an ``ImportError`` naming the symbol and where it was
(:func:`missing`), and ``tests/engines/executor/test_flower_seam.py`` pins
them, with the call signatures the executor relies on.
"""

from __future__ import annotations

import importlib
import inspect
import time
from collections.abc import Callable
from typing import Any

import httpx
from flwr.app import Context, Message

__all__ = [
    "SEAM",
    "SIGNATURES",
    "AcquireTaskRequest",
    "ErrorCode",
    "HeartbeatSender",
    "LoadClientAppError",
    "Node",
    "PullAppMessagesRequest",
    "PullTaskInputRequest",
    "PushTaskOutputRequest",
    "RuntimeHttpClient",
    "RuntimeTokenHttpInterceptor",
    "RuntimeVersionHttpInterceptor",
    "SubStatus",
    "SuperExecAuthHttpInterceptor",
    "TaskIdentity",
    "TaskType",
    "build_fab_from_disk",
    "context_from_proto",
    "context_to_proto",
    "fab_from_proto",
    "get_flwr_home",
    "get_project_config",
    "install_from_fab",
    "load_app",
    "make_confirm_message_received_fn_protobuf",
    "make_pull_object_fn_protobuf",
    "make_simple_http_retry_invoker",
    "make_task_heartbeat_fn_http",
    "missing",
    "moved_signatures",
    "pull_and_inflate_object_from_tree",
    "pull_input",
    "pull_task_input",
    "push_message",
    "push_status",
    "push_task_output",
    "run_from_proto",
    "task_heartbeat_fn",
    "unsignalled_retry_invoker",
]

SEAM: dict[str, str] = {
    "pull_task_input": "flwr.supernode.runtime.run_clientapp",
    "PullTaskInputRequest": "flwr.proto.runtime_pb2",
    "PullAppMessagesRequest": "flwr.proto.runtime_pb2",
    "PushTaskOutputRequest": "flwr.proto.runtime_pb2",
    "Node": "flwr.proto.node_pb2",
    "TaskIdentity": "flwr.supercore.task_identity",
    "run_from_proto": "flwr.common.serde",
    "fab_from_proto": "flwr.common.serde",
    "pull_and_inflate_object_from_tree": "flwr.supercore.inflatable.inflatable_utils",
    "make_pull_object_fn_protobuf": (
        "flwr.supercore.inflatable.inflatable_protobuf_utils"
    ),
    "make_confirm_message_received_fn_protobuf": (
        "flwr.supercore.inflatable.inflatable_protobuf_utils"
    ),
    "push_message": "flwr.supernode.runtime.run_clientapp",
    "push_task_output": "flwr.supernode.runtime.run_clientapp",
    "RuntimeHttpClient": "flwr.supercore.runtime",
    "RuntimeTokenHttpInterceptor": "flwr.supercore.interceptors",
    "RuntimeVersionHttpInterceptor": "flwr.supercore.interceptors",
    "SuperExecAuthHttpInterceptor": "flwr.supercore.interceptors",
    "make_simple_http_retry_invoker": "flwr.supercore.retry",
    "HeartbeatSender": "flwr.supercore.heartbeat",
    "make_task_heartbeat_fn_http": "flwr.supercore.heartbeat",
    "AcquireTaskRequest": "flwr.proto.runtime_pb2",
    "SendTaskHeartbeatRequest": "flwr.proto.runtime_pb2",
    "TaskType": "flwr.supercore.constant",
    "ErrorCode": "flwr.common.constant",
    "SubStatus": "flwr.common.constant",
    "load_app": "flwr.supercore.object_ref",
    "LoadClientAppError": "flwr.clientapp.client_app",
    "get_flwr_home": "flwr.common.config",
    "get_project_config": "flwr.common.config",
    "context_to_proto": "flwr.common.serde",
    "context_from_proto": "flwr.common.serde",
    "build_fab_from_disk": "flwr.cli.build",
    "install_from_fab": "flwr.cli.install",
}
"""Each Flower symbol the executor uses, by the module it is imported from."""

SIGNATURES: dict[str, tuple[str, ...]] = {
    "pull_task_input": ("client",),
    "push_message": ("client", "message", "context"),
    "push_task_output": ("client", "context", "sub_status", "details"),
    "make_task_heartbeat_fn_http": ("client",),
    "load_app": ("module_attribute_str", "error_type", "project_dir"),
    "build_fab_from_disk": ("app",),
    "install_from_fab": ("fab_file", "install_dir", "skip_prompt"),
    "pull_and_inflate_object_from_tree": (
        "object_tree",
        "pull_object_fn",
        "confirm_object_received_fn",
        "return_type",
        "max_concurrent_pulls",
        "max_time",
        "max_tries_per_object",
        "initial_backoff",
        "backoff_cap",
    ),
}
"""The parameters (in order) of each function the executor calls by position."""


def missing() -> list[str]:
    """``module.name`` of every :data:`SEAM` symbol the installed Flower lacks."""
    gone = []
    for name, module in SEAM.items():
        try:
            found = hasattr(importlib.import_module(module), name)
        except ImportError:
            found = False
        if not found:
            gone.append(f"{module}.{name}")
    return gone


def moved_signatures() -> list[str]:
    """Each :data:`SIGNATURES` function whose parameters changed, with both lists."""
    changed = []
    for name, want in SIGNATURES.items():
        try:
            function = getattr(importlib.import_module(SEAM[name]), name)
        except (ImportError, AttributeError):
            continue  # reported by missing()
        got = tuple(inspect.signature(function).parameters)
        if got != want:
            changed.append(f"{SEAM[name]}.{name}{want} is now {name}{got}")
    return changed


def _seam_error() -> ImportError:
    import flwr

    gone = ", ".join(missing()) or "none (an import inside Flower failed)"
    return ImportError(
        "tpsl-flwr's warm executor is built on Flower 1.42's task protocol; the "
        f"installed flwr {flwr.__version__} lacks: {gone}"
    )


try:
    from flwr.cli.build import build_fab_from_disk
    from flwr.cli.install import install_from_fab
    from flwr.clientapp.client_app import LoadClientAppError
    from flwr.common.config import get_flwr_home, get_project_config
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.common.serde import (
        context_from_proto,
        context_to_proto,
        fab_from_proto,
        run_from_proto,
    )
    from flwr.proto.node_pb2 import Node  # pylint: disable=E0611
    from flwr.proto.runtime_pb2 import (  # pylint: disable=E0611
        AcquireTaskRequest,
        PullAppMessagesRequest,
        PullTaskInputRequest,
        PushTaskOutputRequest,
        SendTaskHeartbeatRequest,
    )
    from flwr.supercore.constant import TaskType
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
    from flwr.supercore.inflatable.inflatable_protobuf_utils import (
        make_confirm_message_received_fn_protobuf,
        make_pull_object_fn_protobuf,
    )
    from flwr.supercore.inflatable.inflatable_utils import (
        pull_and_inflate_object_from_tree,
    )
    from flwr.supercore.interceptors import (
        RuntimeTokenHttpInterceptor,
        RuntimeVersionHttpInterceptor,
        SuperExecAuthHttpInterceptor,
    )
    from flwr.supercore.object_ref import load_app
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supernode.runtime.run_clientapp import (
        pull_task_input,
        push_message,
        push_task_output,
    )
except ImportError as _err:  # pragma: no cover - only with another Flower
    raise _seam_error() from _err


_RETRY_LATER = (503, 504)
"""HTTP statuses after which Flower's task heartbeat is retried."""


def task_heartbeat_fn(client: Any, on_rejected: Callable[[str], None]) -> Any:
    """Flower's task heartbeat, with ``on_rejected`` in place of its ``SIGINT``.

    ``make_task_heartbeat_fn_http`` (``flwr/supercore/heartbeat.py``) raises
    ``SIGINT`` in the process when the SuperNode rejects a heartbeat (the
    task is finished or its token expired): that ends ``flwr-clientapp``, one
    task, but in the warm executor it would end every task to come. Here the
    rejection, and an HTTP error other than 503/504 (which Flower's would
    raise in the heartbeat thread, ending its heartbeats unseen), call
    ``on_rejected`` with one line saying why, at each beat so rejected.
    Transport errors and 503/504 are retried, as Flower's are.
    """
    request = SendTaskHeartbeatRequest()

    def beat() -> bool:
        try:
            response = client.SendTaskHeartbeat(request)
        except httpx.TransportError:
            return False
        except httpx.HTTPStatusError as err:
            if err.response.status_code in _RETRY_LATER:
                return False
            on_rejected(f"the task heartbeat got HTTP {err.response.status_code}")
            return True
        if not response.success:
            on_rejected("the SuperNode rejected the task heartbeat (task over)")
        return True

    return beat


_REFUSED = (httpx.codes.UNAUTHORIZED, httpx.codes.FORBIDDEN)
"""HTTP statuses a task's request gets when the task or its run is over."""


def unsignalled_retry_invoker() -> Any:
    """Flower's HTTP retry invoker, except that a 401 or 403 is the caller's.

    ``make_simple_http_retry_invoker`` (``flwr/supercore/retry/http_retry.py``)
    answers an HTTP 401 with ``SIGINT`` to its own process, then sleeps and
    retries, and an HTTP 403 by raising ``RunNotRunningException``, a
    ``BaseException`` that no ``except Exception`` stops: right for
    ``flwr-clientapp`` (one task, which either ends), wrong for the warm
    executor, which a task's expired token or finished run would stop for
    every task to come (the 401 silently, with exit status 0). Here a 401 or a
    403 gives up at once and the ``HTTPStatusError`` reaches the caller.
    """
    invoker = make_simple_http_retry_invoker()
    flowers = invoker.should_giveup

    def should_giveup(exc: Exception) -> bool:
        if (
            isinstance(exc, httpx.HTTPStatusError)
            and exc.response.status_code in _REFUSED
        ):
            return True
        return bool(flowers(exc)) if flowers is not None else False

    invoker.should_giveup = should_giveup
    return invoker


def push_status(
    client: Any, context: Context | None, sub_status: str, details: str
) -> None:
    """Flower's ``push_task_output``, except that a refusal reaches the caller.

    ``push_task_output`` (``flwr/supernode/runtime/run_clientapp.py``) pushes
    the task's context and final status, and logs an HTTP error and returns:
    ``flwr-clientapp`` exits next anyway. The warm executor must know that the
    SuperNode did not take the context (the task or its run is over), so here
    the same request raises the ``HTTPStatusError``.
    """
    client.PushTaskOutput(
        PushTaskOutputRequest(
            context=context_to_proto(context) if context else None,
            sub_status=sub_status,
            details=details,
        )
    )


PULL_BACKOFF = 0.005
"""Seconds before the first retry of a message object not yet at the SuperNode."""
PULL_BACKOFF_CAP = 0.1
"""Longest wait between two retries of one object (Flower's own: 1 s to 10 s)."""


def pull_input(
    client: Any, times: list[float] | None = None
) -> tuple[Message, Context, Any, Any]:
    """Flower's ``pull_task_input`` with a short retry for objects still in transit.

    A SuperNode creates the task before it has pulled the message's objects
    from the SuperLink (``flwr/supernode/start_client_internal.py``,
    ``_pull_and_store_message``). A warm executor acquires the task within
    milliseconds, so an object may not be there yet; Flower's pull then waits
    its ``PULL_INITIAL_BACKOFF`` of 1 s (``flwr/supercore/constant.py``)
    before the retry. This is ``pull_task_input``
    (``flwr/supernode/runtime/run_clientapp.py``) step by step, the same Flower
    calls, with the first retry after :data:`PULL_BACKOFF` instead.
    ``times`` (if given) gets ``time.time()`` after the task input (context,
    run, bundle) and after the message's head.
    """
    res = client.PullTaskInput(PullTaskInputRequest())
    if times is not None:
        times.append(time.time())
    TaskIdentity.task_id = res.task_id
    TaskIdentity.run_id = res.run.run_id
    TaskIdentity.node_id = res.context.node_id
    context = context_from_proto(res.context)
    run = run_from_proto(res.run)
    fab = fab_from_proto(res.fab)
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("No messages received from Runtime API")
    if times is not None:
        times.append(time.time())
    node = Node(node_id=context.node_id)
    tree = pulled.message_object_trees[0]
    message = pull_and_inflate_object_from_tree(
        tree,
        make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(
            client.ConfirmMessageReceived, node, context.run_id
        ),
        return_type=Message,
        initial_backoff=PULL_BACKOFF,
        backoff_cap=PULL_BACKOFF_CAP,
    )
    # as Flower does: the deflated message does not hold its own id
    message.metadata.__dict__["_message_id"] = tree.object_id
    return message, context, run, fab
