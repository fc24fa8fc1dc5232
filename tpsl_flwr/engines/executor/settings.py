"""A warm executor's settings, the bound of its tasks, and how it names them.

What :class:`~tpsl_flwr.engines.executor.warm.WarmExecutor` is told (the
SuperNode's Runtime API address, the ClientApps allowed warm, its poll interval
and task bound, the SuperExec secret), the seconds a task may run, and the one
line an error reply gives the label party, naming the node and its partition
as the label party names them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flwr.app import Context

from tpsl_flwr.engines.executor.fab_match import DEFAULT_WARM_APP
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.node_edge import node_failure

__all__ = [
    "DEFAULT_TASK_BOUND",
    "EXIT_STUCK",
    "FIRST_POLL",
    "ExecutorSettings",
    "error_reason",
    "node_name",
    "one_line",
    "task_bound",
]

DEFAULT_TASK_BOUND = 600.0
"""Seconds a task may run when neither ``--task-timeout`` nor the run bounds it."""
FIRST_POLL = 0.002
"""Seconds before the second ``AcquireTask`` after a task or at start."""
EXIT_STUCK = 3
"""Exit status when a stuck task ends the executor (no ``restart_argv``)."""


@dataclass(frozen=True)
class ExecutorSettings:
    """How a :class:`WarmExecutor` reaches its SuperNode and what it loads warm.

    Parameters
    ----------
    runtime_api_address
        The SuperNode's Runtime API (``host:port``, loopback).
    warm_apps
        ClientApp references (``module:attribute``) allowed to run warm.
    poll_interval
        Longest wait between two ``AcquireTask`` calls when idle (seconds);
        after a task the executor polls after :data:`FIRST_POLL` and doubles.
    task_timeout
        The bound of a warm task in seconds; ``None``: the run config's
        ``reply-timeout``, else :data:`DEFAULT_TASK_BOUND`. A stock
        ``flwr-clientapp`` process is bounded by the larger of this and
        :data:`DEFAULT_TASK_BOUND` (its start alone takes seconds).
    auth_secret
        The SuperExec shared secret the SuperNode was given
        (``--superexec-auth-secret-file``); ``None``: unauthenticated.
    restart_argv
        The command line to ``exec`` after a stuck task (the executor's own);
        ``None``: exit with :data:`EXIT_STUCK` instead.
    clientapp_command
        The stock executable for tasks that do not run warm.
    supernode_uid
        The user the SuperNode runs as; ``None``: the executor's own. A
        listener of any other user on the Runtime API port is refused
        (:func:`~tpsl_flwr.engines.executor.listener.check_listener`).
    """

    runtime_api_address: str
    warm_apps: tuple[str, ...] = (DEFAULT_WARM_APP,)
    poll_interval: float = 0.05
    task_timeout: float | None = None
    auth_secret: bytes | None = None
    restart_argv: Sequence[str] | None = None
    clientapp_command: str = "flwr-clientapp"
    supernode_uid: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.poll_interval <= 60:
            raise ValueError(
                f"poll_interval must be in (0, 60] seconds, got {self.poll_interval}"
            )
        if self.task_timeout is not None and not self.task_timeout > 0:
            raise ValueError(f"task_timeout must be > 0, got {self.task_timeout}")
        if not self.warm_apps:
            raise ValueError("warm_apps must name at least one ClientApp")


def node_name(context: Context | None, node_id: int | None = None) -> str:
    """``node N (partition P)`` from a task's context, as the label party says it."""
    if context is None:
        return f"node {node_id}" if node_id is not None else "this node"
    partition = context.node_config.get(P.PARTITION_ID)
    suffix = "" if partition is None else f" (partition {partition})"
    return f"node {context.node_id}{suffix}"


def task_bound(settings: ExecutorSettings, run_config: dict[str, Any]) -> float:
    """Seconds this task may run: ``--task-timeout``, the run's reply-timeout, 600."""
    if settings.task_timeout is not None:
        return settings.task_timeout
    value = run_config.get("reply-timeout")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return DEFAULT_TASK_BOUND


def error_reason(error: BaseException, context: Context | None) -> str:
    """Flower's reason text for ``error`` (``<class 'X'>:<'why'>``), node named.

    An error that does not already name its partition (the project's
    ClientApp marks its own) is marked with the node config's partition.
    """
    if context is not None and "[tpsl partition " not in str(error):
        config = context.node_config
        part, parts = config.get(P.PARTITION_ID), config.get(P.NUM_PARTITIONS)
        if isinstance(part, int) and isinstance(parts, int):
            error = node_failure(error, part, parts)
    return str(type(error)) + ":<'" + str(error) + "'>"


def one_line(error: BaseException) -> str:
    r"""An error of the Runtime API in one line: its HTTP status, else its first line.

    Examples
    --------
    >>> one_line(RuntimeError("first\nsecond"))
    'RuntimeError: first'
    """
    response = getattr(error, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(status, int):
        return f"the SuperNode answered HTTP {status}"
    lines = str(error).splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
