"""Cost of more non-label parties: N virtual clients in Flower's Ray simulation.

For each N (default 1, 2, 4, 8; ``--more`` adds 16 and 32) it runs one TPSL
experiment with ``num-parties = N`` through ``run_on_ray`` (``flwr run`` of the
repo app: local SuperLink, ``flwr-simulation``, Ray; one SuperNode per party),
on a small dataset for one epoch (default: digits, whose 64 feature columns
split among up to 64 parties; batch 64, Laplace eps 1, audit off). Reported:
``ms/step`` (batch size over the run's ``samples_per_second``: one round trip
to all N nodes plus the label party's step), ``wall s`` (what the caller waits
for, start-up and clean-up included) and ``peak RSS`` (the largest sum of
resident memory over every process of the run, sampled from ``/proc`` every
0.2 s: this process's tree plus every process carrying this benchmark's marker
in its environment, which the SuperLink, the simulation and Ray's workers
inherit). Ratios are against N = 1. Party counts above the dataset's column
count are refused before anything runs; a run that fails is reported as such
and the others still are.

Usage: ``python bench/scale.py [--parties 1 2 4 8] [--more] [--dataset digits]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

MARKER = "TPSL_BENCH_SCALE_ID"
PAGE = os.sysconf("SC_PAGE_SIZE")


def _processes(marker: bytes) -> set[int]:
    """PIDs of this process's tree plus every process with ``marker`` in its env."""
    ppid: dict[int, int] = {}
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat = (entry / "stat").read_text()
            ppid[pid] = int(stat.rsplit(")", 1)[1].split()[1])
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.add(pid)
        except (OSError, ValueError, IndexError):
            continue
    children: dict[int, list[int]] = {}
    for pid, parent in ppid.items():
        children.setdefault(parent, []).append(pid)
    stack = [os.getpid()]
    while stack:
        pid = stack.pop()
        found.add(pid)
        stack.extend(c for c in children.get(pid, ()) if c not in found)
    return found


def _rss(pids: set[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            continue
    return total


class PeakMemory:
    """Sample the summed RSS of the run's processes in a background thread."""

    def __init__(self, marker: bytes, interval: float = 0.2) -> None:
        self.marker = marker
        self.interval = interval
        self.peak = 0
        self.processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            pids = _processes(self.marker)
            rss = _rss(pids)
            if rss > self.peak:
                self.peak = rss
                self.processes = len(pids)
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parties", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--more", action="store_true", help="also 16 and 32")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--rows", type=int, default=0)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    counts = list(args.parties) + ([16, 32] if args.more else [])

    from tpsl_flwr.experiments.config import ExperimentConfig
    from tpsl_flwr.experiments.ray_run import run_on_ray

    train = ExperimentConfig(dataset=args.dataset, rows=args.rows).load_data().train
    columns = len(train.numeric_names) + len(train.categorical_names)
    too_many = [n for n in counts if n > columns]
    if too_many:
        parser.error(
            f"{args.dataset} has {columns} feature columns, too few for "
            f"{too_many} parties (each party needs at least one column)"
        )

    marker_value = uuid.uuid4().hex
    os.environ[MARKER] = marker_value
    marker = f"{MARKER}={marker_value}".encode()
    rows = []
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            run_config = {
                "dataset": args.dataset,
                "rows": args.rows,
                "mechanism": "laplace",
                "epsilon": 1.0,
                "epochs": 1,
                "batch-size": args.batch,
                "num-parties": n,
                "audit": False,
                "checkpoint": False,
                "out-dir": str(Path(tmp) / f"n{n}"),
            }
            started = time.perf_counter()
            try:
                with PeakMemory(marker) as memory:
                    results = run_on_ray(run_config, timeout=args.timeout, echo=None)
            except Exception as err:  # report it, keep the other counts
                failures.append(f"N={n} failed: {str(err).splitlines()[0][:300]}")
                print(failures[-1], file=sys.stderr, flush=True)
                continue
            wall = time.perf_counter() - started
            step_ms = 1000 * args.batch / results["samples_per_second"]
            rows.append((n, step_ms, wall, memory.peak / 2**20, memory.processes))
    print(
        f"scale: {args.dataset}, batch {args.batch}, 1 epoch, Laplace eps 1, "
        f"Flower Ray simulation, {os.cpu_count()} cores"
    )
    print()
    for failure in failures:
        print(failure)
    if not rows:
        raise SystemExit("scale: every run failed")
    print("| parties | ms/step | x N=1 | wall s | peak RSS MiB | x N=1 | processes |")
    print("|---|---|---|---|---|---|---|")
    _, step1, _, mem1, _ = rows[0]
    for n, step_ms, wall, mem, procs in rows:
        print(
            f"| {n} | {step_ms:.1f} | {step_ms / step1:.2f} | {wall:.1f} | "
            f"{mem:.0f} | {mem / mem1:.2f} | {procs} |"
        )
    if len(rows) > 1:
        (n0, s0, _, m0, _), (n1, s1, _, m1, _) = rows[0], rows[-1]
        per_step = (s1 - s0) / (n1 - n0)
        per_mem = (m1 - m0) / (n1 - n0)
        print()
        print(
            f"growth from N={n0} to N={n1}: {per_step:+.1f} ms/step and "
            f"{per_mem:+.0f} MiB peak RSS per added party"
        )


if __name__ == "__main__":
    main()
