"""Crash and restart the processes of a local deployment, by PID, for fault tests.

A SuperNode that crashes takes its ``flower-superexec`` and its running
``flwr-clientapp`` with it; :func:`kill_supernode` does that to SuperNode ``i``
of a :class:`~tpsl_flwr.engines.deployment.runtime.DeploymentRuntime` (SIGKILL, no
clean shutdown: the SuperLink keeps listing the node until its heartbeat
expires, up to 2 x 30 s in flwr 1.42). :func:`restart_supernode` starts it
again with the same command line (same SuperLink, port and node config); it
registers under a new node id. :func:`kill_executor` and
:func:`restart_executor` do the same to a SuperNode's warm executor (the
SuperNode keeps running). :func:`kill_server_app` kills the label party's
``flwr-serverapp`` process of a run. Every process here carries the runtime's
launch marker, so the runtime's ``stop`` ends restarted ones too.
Linux only (``/proc``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpsl_flwr.engines.deployment.runtime import DeploymentRuntime, open_log
from tpsl_flwr.engines.deployment.security import log_contains
from tpsl_flwr.engines.processes import (
    FlowerLaunchError,
    descendants,
    find_launched_processes,
)

__all__ = [
    "KilledSupernode",
    "kill_executor",
    "kill_server_app",
    "kill_supernode",
    "restart_executor",
    "restart_supernode",
]

_PROC = Path("/proc")
_READY = re.compile(r"SuperNode ID: (\d+)")
_EXECUTOR_READY = re.compile(r"executor ready for ")


@dataclass(frozen=True)
class KilledSupernode:
    """What :func:`kill_supernode` killed, and how to start it again.

    Attributes
    ----------
    index
        The SuperNode's index (its ``partition-id``).
    command
        Its command line, as it was started.
    pids
        The PIDs killed: the SuperNode first, then its descendants.
    killed_at
        ``time.monotonic()`` right after the SIGKILLs.
    """

    index: int
    command: list[str]
    pids: list[int]
    killed_at: float


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_supernode(runtime: DeploymentRuntime, index: int) -> KilledSupernode:
    """SIGKILL SuperNode ``index`` and every process under it, as a crash would.

    The SuperNode's warm executor is a separate process, not under the
    SuperNode: it keeps running and polls on, as it would when only the
    SuperNode process crashes (:func:`kill_executor` ends it).

    Parameters
    ----------
    runtime
        A started runtime.
    index
        Which SuperNode (``0 .. num_supernodes - 1``).

    Returns
    -------
    KilledSupernode
        The command line to restart it with and the PIDs killed.
    """
    pid = runtime.pids[1 + index]
    command = [
        arg.decode() for arg in (_PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    ][:-1]
    pids = [pid, *descendants(pid)]
    _kill(pids)
    killed_at = time.monotonic()
    return KilledSupernode(index, command, pids, killed_at)


def restart_supernode(
    runtime: DeploymentRuntime, killed: KilledSupernode, timeout: float = 60.0
) -> subprocess.Popen[Any]:
    """Start a killed SuperNode again and wait until it has its (new) node id.

    Parameters
    ----------
    runtime
        The runtime it belonged to (its environment and log folder).
    killed
        What :func:`kill_supernode` returned.
    timeout
        Seconds to wait for the SuperNode to connect.

    Returns
    -------
    subprocess.Popen
        The new SuperNode; the runtime's ``stop`` ends it (launch marker),
        the caller reaps it (``wait()``). Its log is
        ``supernode-<i>-restarted.log`` in the runtime's log folder.

    Raises
    ------
    FlowerLaunchError
        If it exits or does not connect within ``timeout``.
    """
    log_path = runtime.log_dir / f"supernode-{killed.index}-restarted.log"
    with open_log(log_path) as log_file:
        proc = subprocess.Popen(
            killed.command,
            env=runtime.env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    deadline = time.monotonic() + timeout
    while not log_contains(log_path, _READY):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise FlowerLaunchError(
                f"restarted SuperNode {killed.index} did not connect within "
                f"{timeout:g} s; see {log_path}"
            )
        time.sleep(0.2)
    return proc


def kill_executor(runtime: DeploymentRuntime, index: int) -> list[int]:
    """SIGKILL SuperNode ``index``'s warm executor and any ``flwr-clientapp`` it ran.

    Its SuperNode keeps running: a task the executor held is lost with it
    (no reply; the label party's reply-timeout names the node), and the
    SuperNode's next tasks wait for an executor.

    Returns
    -------
    list[int]
        The PIDs killed: the executor first, then its descendants.
    """
    proc = runtime.executors[index]
    pids = [proc.pid, *descendants(proc.pid)]
    _kill(pids)
    proc.wait()
    return pids


def restart_executor(
    runtime: DeploymentRuntime,
    index: int,
    extra: list[str] | None = None,
    timeout: float = 60.0,
) -> subprocess.Popen[Any]:
    """Start SuperNode ``index``'s executor again (same command, plus ``extra``).

    It replaces the runtime's handle, so the runtime's ``stop`` ends it; its
    log is ``executor-<i>-restarted.log``. Waits until it is ready.

    Raises
    ------
    FlowerLaunchError
        If it exits or is not ready within ``timeout``.
    """
    log_path = runtime.log_dir / f"executor-{index}-restarted.log"
    command = [*runtime.executor_commands[index], *(extra or [])]
    with open_log(log_path) as log_file:
        proc = subprocess.Popen(
            command,
            env=runtime.env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    runtime.executors[index] = proc
    deadline = time.monotonic() + timeout
    while not log_contains(log_path, _EXECUTOR_READY):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise FlowerLaunchError(
                f"restarted executor {index} was not ready within {timeout:g} s; "
                f"see {log_path}"
            )
        time.sleep(0.1)
    return proc


def kill_server_app(runtime: DeploymentRuntime) -> list[int]:
    """SIGKILL every ``flwr-serverapp`` process of ``runtime`` (the label party).

    Returns
    -------
    list[int]
        The PIDs killed (empty if no run's ServerApp is running).
    """
    pids = []
    for pid in find_launched_processes(runtime.launch_id):
        try:
            cmdline = (_PROC / str(pid) / "cmdline").read_bytes()
        except OSError:
            continue
        if b"flwr-serverapp" in cmdline:
            pids.append(pid)
    _kill(pids)
    return pids
