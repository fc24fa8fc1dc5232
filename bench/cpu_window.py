"""CPU seconds each kind of process spends in a window of a run, from ``/proc``.

:class:`CpuSampler` is a thread that reads every process's CPU time (user +
system, its own and that of its reaped children) and the machine's busy time
every ``interval`` seconds. :meth:`CpuSampler.window` then gives the CPU seconds
of each kind of process between two wall times, and the machine's: what a
deployment's steady state costs per message, on which process.

A Flower SuperNode runs each message in a fresh ``flwr-clientapp`` process that
lives ~1-2 s; its CPU time is read from its parent, the SuperExec, whose
children's time grows when it reaps one (a process alive across an edge of the
window is counted in the window it ends in). Linux only.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path

__all__ = ["KINDS", "CpuSampler", "kind_of"]

KINDS = (
    ("flwr-clientapp", "flwr-clientapp (per message)"),
    ("flower-superexec", "flower-superexec"),
    ("flower-supernode", "flower-supernode"),
    ("flower-superlink", "flower-superlink"),
    ("tpsl_flwr.engines.superlink_guard", "flower-superlink"),
    ("flwr-serverapp", "label party (flwr-serverapp)"),
    ("tpsl_flwr.cli executor", "warm executors"),
)
"""(text in the command line, kind) in the order they are matched."""
CLIENTAPP = KINDS[0][1]
_HZ = os.sysconf("SC_CLK_TCK")


def kind_of(cmdline: str) -> str:
    """The kind of a process from its command line (``other`` if none matches)."""
    for text, kind in KINDS:
        if text in cmdline:
            return kind
    return "other"


def _machine_busy() -> float:
    """Busy CPU seconds of the whole machine since boot (all CPUs)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(v) for v in fields]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks[:8]) - idle) / _HZ


def _processes() -> dict[tuple[int, int], tuple[str, float, float]]:
    """(pid, start tick) -> (kind, own CPU s, reaped children's CPU s)."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if not cmdline:
            continue
        f = stat.rsplit(")", 1)[1].split()
        own = (int(f[11]) + int(f[12])) / _HZ
        children = (int(f[13]) + int(f[14])) / _HZ
        kind = kind_of(cmdline.replace(b"\0", b" ").decode(errors="replace") + " ")
        found[(int(pid), int(f[19]))] = (kind, own, children)
    return found


class CpuSampler(threading.Thread):
    """Samples every process's CPU time until :meth:`stop`.

    Parameters
    ----------
    interval
        Seconds between two samples.
    """

    def __init__(self, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.samples: list[tuple[float, float, dict]] = []
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            self.samples.append((time.time(), _machine_busy(), _processes()))
            self._done.wait(self.interval)

    def stop(self) -> None:
        """End sampling (one last sample is taken first)."""
        self.samples.append((time.time(), _machine_busy(), _processes()))
        self._done.set()
        self.join(timeout=5)

    def _at(self, when: float) -> tuple[float, float, dict]:
        """The last sample taken at or before ``when`` (else the first)."""
        before = [s for s in self.samples if s[0] <= when]
        return before[-1] if before else self.samples[0]

    def window(self, start: float, end: float) -> tuple[float, Counter[str]]:
        """Seconds of the window and CPU seconds by kind (``machine``: all).

        A process's own time is counted for every kind but ``flwr-clientapp``,
        whose time is its SuperExec's reaped children's (the processes are
        too short-lived to sample).
        """
        t0, busy0, procs0 = self._at(start)
        t1, busy1, procs1 = self._at(end)
        used: Counter[str] = Counter()
        for key, (kind, own, children) in procs1.items():
            own0, children0 = procs0.get(key, (kind, 0.0, 0.0))[1:]
            if kind != CLIENTAPP:
                used[kind] += own - own0
            if kind == "flower-superexec":
                used[CLIENTAPP] += children - children0
        used["machine"] = busy1 - busy0
        return t1 - t0, used
