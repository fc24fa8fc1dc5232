"""Processes of a Flower launch: a marker in their environment, ended by PID.

Flower starts processes that outlive the command that started them:
``flwr run ... local`` spawns a *detached* ``flower-superlink`` (own session,
no CLI to stop it) that in turn spawns ``flower-superexec`` and, per run,
``flwr-simulation`` with its Ray processes; a SuperNode spawns its own
``flower-superexec`` and one ``flwr-clientapp`` per message, and those survive
a SIGTERM of the SuperNode for a few seconds. Every process the launchers
(:mod:`~tpsl_flwr.engines.simulation`, :mod:`~tpsl_flwr.engines.deployment.runtime`)
start therefore gets a unique marker in its environment
(:data:`LAUNCH_ID_ENV`), which all descendants inherit, detached or not;
:func:`terminate_launched` finds them by that marker (plus by parentage) in
``/proc`` and ends them by PID: SIGTERM, a grace period, then SIGKILL.
:func:`find_launched_processes` lets tests assert that nothing is left.
Finding detached processes needs Linux ``/proc``; elsewhere only the processes
started directly are ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "LAUNCH_ID_ENV",
    "FlowerLaunchError",
    "descendants",
    "find_launched_processes",
    "terminate_launched",
]

LAUNCH_ID_ENV = "TPSL_FLWR_LAUNCH_ID"
"""Environment variable that marks every process of one launch."""

_PROC = Path("/proc")


class FlowerLaunchError(RuntimeError):
    """A Flower process could not start, a run timed out or did not complete.

    The one error of every launcher here (simulation, deployment, cleanup).
    """


def _ppid_map() -> dict[int, int]:
    table: dict[int, int] = {}
    for entry in _PROC.iterdir() if _PROC.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields and fields[0] != "Z":
            table[int(entry.name)] = int(fields[1])
    return table


def descendants(pid: int) -> list[int]:
    """The live PIDs under ``pid`` (children, their children, ...), zombies left out."""
    children: dict[int, list[int]] = {}
    for child, parent in _ppid_map().items():
        children.setdefault(parent, []).append(child)
    found, stack = [], list(children.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children.get(child, []))
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (zombies count as ended)."""
    if _PROC.is_dir():
        try:
            stat = (_PROC / str(pid) / "stat").read_text()
        except OSError:
            return False
        return stat[stat.rfind(")") + 2 :].split()[0] != "Z"
    try:  # no /proc: a zombie counts as alive until its parent reaps it
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def find_launched_processes(launch_id: str, roots: Iterable[int] = ()) -> list[int]:
    """Return the live PIDs marked with ``launch_id`` or descending from ``roots``.

    Parameters
    ----------
    launch_id : str
        The marker (``CompletedRun.launch_id``, ``DeploymentRuntime.launch_id``).
    roots : Iterable[int]
        PIDs whose descendants (and themselves) are included too. Pass only
        processes known to be running (e.g. a ``Popen`` not yet reaped): the
        PID of a process that has ended may belong to another process by now.

    Returns
    -------
    list[int]
        Sorted PIDs; empty when everything has ended.
    """
    needle = f"{LAUNCH_ID_ENV}={launch_id}".encode()
    ppids = _ppid_map()
    found: set[int] = set()
    for pid in ppids:
        try:
            environ = (_PROC / str(pid) / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.add(pid)
    children: dict[int, list[int]] = {}
    for pid, ppid in ppids.items():
        children.setdefault(ppid, []).append(pid)
    stack = [pid for pid in roots if _alive(pid)]
    while stack:
        pid = stack.pop()
        found.add(pid)
        stack.extend(c for c in children.get(pid, ()) if c not in found)
    found.discard(os.getpid())
    return sorted(found)


def _signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_gone(
    launch_id: str, popens: Sequence[subprocess.Popen[Any]], timeout: float
) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        # Reap our direct children; a reaped child's PID is free for reuse by
        # any other process, so only unreaped ones may serve as roots.
        roots = [proc.pid for proc in popens if proc.poll() is None]
        left = find_launched_processes(launch_id, roots)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def terminate_launched(
    launch_id: str,
    popens: Sequence[subprocess.Popen[Any]] = (),
    grace_s: float = 10.0,
) -> list[int]:
    """End every process of a launch, by PID, and return the PIDs signalled.

    Every live process started directly (``popens``) or carrying the marker
    gets SIGTERM (Flower's processes shut down cleanly on it); those still
    alive after ``grace_s`` (or spawned meanwhile) get SIGTERM again, then
    SIGKILL.

    Parameters
    ----------
    launch_id : str
        The launch's marker.
    popens : Sequence[subprocess.Popen[Any]]
        Processes started directly (they are also reaped).
    grace_s : float
        Seconds to wait after each SIGTERM round.

    Returns
    -------
    list[int]
        Sorted PIDs that were signalled.

    Raises
    ------
    FlowerLaunchError
        If a process is still alive after SIGKILL.
    """
    signalled: set[int] = set()
    first = {p.pid for p in popens if p.poll() is None}
    first |= set(find_launched_processes(launch_id))
    _signal_all(first, signal.SIGTERM)
    signalled.update(first)
    left = _wait_gone(launch_id, popens, grace_s)
    if left:  # e.g. spawned while shutting down
        _signal_all(left, signal.SIGTERM)
        signalled.update(left)
        left = _wait_gone(launch_id, popens, min(grace_s, 2.0))
    for _ in range(3):
        if not left:
            break
        _signal_all(left, signal.SIGKILL)
        signalled.update(left)
        left = _wait_gone(launch_id, popens, 5.0)
    if left:
        raise FlowerLaunchError(f"processes {left} survived SIGKILL")
    return sorted(signalled)
