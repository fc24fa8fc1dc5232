"""Peak memory and speed of one training epoch as the rows grow (Criteo format).

Writes one Criteo-format ``train.txt`` (the calibrated generator, the largest
size asked for) into a temporary folder, then for every size ``N`` and with and
without the transcript audit runs::

    tpsl-flwr simulate --dataset criteo --rows N --epochs 1 --batch-size 1024
        --engine local

in its own subprocess, sampling the anonymous resident memory (``RssAnon`` of
``/proc/PID/status``, summed over the process and its children) every
``--interval`` seconds. ``RssAnon`` leaves out the file-backed pages of the
memory-mapped cache, which the kernel can drop at will; it is the memory a run
really needs. Each size reads the first ``N`` rows of the same file, and its
first run (audit on) writes the encoded cache; the second reads it.

Prints, per size and audit setting, the peak ``RssAnon``, training samples/s
(as ``simulate`` reports it) and wall time, then the growth in bytes per row
between consecutive sizes: the figure that must stay flat (<= 100 B/row) for
memory to be bounded whatever the row count.

Which sample of ``RssAnon`` the sampler catches moves a peak by +-100 MB between
runs of the same code (the state of a step swings by a few hundred MB), so
``--repeat R`` runs every setting ``R`` times, interleaved, and keeps the
highest peak and the median samples/s. ``--malloc`` compares glibc's allocator
settings side by side in the same bench run: ``glibc`` (glibc's own dynamic
defaults), ``lean`` (``TPSL_FLWR_MALLOC=lean``: fixed mmap and trim thresholds,
:mod:`tpsl_flwr._util.allocator`) or ``both``.

Usage: ``python bench/scale_rows.py [--rows 50000,200000,500000] [--audit
both|on|off] [--repeat R] [--malloc glibc|lean|both] [--keep DIR] [-- extra
simulate flags]``. Each run also prints its start: the seconds until it logs
``Connected to`` (loading, views, strategy; the first run of a size writes the
cache, the others read it). With ``--keep DIR`` each run's ``results.json``
and timestamped log are kept there too (``results-ROWS-AUDIT-MALLOC-REPEAT.json``,
``log-ROWS-AUDIT-MALLOC-REPEAT.txt``).

Ray: ``-- --engine ray`` (the later ``--engine`` wins). ``--per-process``
prints each process's own peak (the label party's driver, each node actor,
Ray's daemons), and ``--time-limit S`` ends a run, and everything it started,
after ``S`` seconds: the peaks of a run's start and first steps, where a whole
epoch would take too long. With ``--per-process`` each process's line also gives
its peak after the run's last progress line (``... samples (x%) ... ETA``): the
end of the epoch (the evaluation query, the audit's scoring), where training's
peak and the end's may differ.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO


def rss_anon_kb(pid: int) -> int:
    """``RssAnon`` in KiB of ``pid`` (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (Linux ``/proc/PID/task/*/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children", encoding="ascii") as fh:
                    kids = [int(k) for k in fh.read().split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


def process_name(pid: int) -> str:
    """What a process calls itself (its first two arguments; Ray's actor title)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            words = fh.read().split(b"\0")
    except OSError:
        return "?"
    text = [w.decode(errors="replace") for w in words if w]
    if text and text[0].startswith("ray::"):
        return text[0]
    return " ".join(Path(w).name if i == 0 else w for i, w in enumerate(text[:3]))


def run_sampled(
    cmd: list[str],
    interval: float,
    ledger: Path,
    malloc: str,
    time_limit: float = 0.0,
    per_process: dict[int, tuple[str, int, int]] | None = None,
) -> tuple[int, float, int, float]:
    """Run ``cmd``; return its exit status, wall s, peak RssAnon (KiB), start s.

    ``time_limit > 0`` ends the run (its whole process group) after that many
    seconds; the status is then ``-9``. ``per_process``, if given, receives
    by pid each process's name, its own peak RssAnon (KiB) and its peak after
    the run's last progress line (KiB; 0 if none was sampled after it, or the
    run printed no progress line: shorter than the progress interval).

    ``ledger`` is the run's own privacy ledger folder, so that benchmark runs
    never count as releases of the user's label sets; ``malloc`` is the
    ``TPSL_FLWR_MALLOC`` setting of the run. The start is the seconds until
    the run logs ``Connected to``: loading the data (the cache warm or cold),
    building the views and the strategy, and meeting the nodes. The log, each
    line stamped with its seconds since the start, goes to ``log.txt`` beside
    the ledger folder.
    """
    env = {
        **os.environ,
        "TPSL_FLWR_LEDGER_DIR": str(ledger),
        "TPSL_FLWR_MALLOC": malloc,
    }
    log = ledger.parent / "log.txt"
    started = float("nan")
    last_progress = math.inf  # seconds of the last "... samples (x%) ... ETA"
    start = time.perf_counter()

    def copy(stream: IO[bytes], sink: IO[str]) -> None:
        nonlocal started, last_progress
        for raw in stream:
            line = raw.decode(errors="replace")
            now = time.perf_counter() - start
            if math.isnan(started) and "Connected to" in line:
                started = now
            if " samples (" in line and "ETA" in line:
                last_progress = now
            sink.write(f"{now:9.1f} {line}")
            sink.flush()

    with log.open("w", encoding="utf-8") as sink:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a time limit ends the run and all it began
        )
        assert proc.stdout is not None
        reader = threading.Thread(target=copy, args=(proc.stdout, sink), daemon=True)
        reader.start()
        peak, seen = 0, dict[int, int]()  # pid -> its start time
        timeline: list[tuple[float, dict[int, int]]] = []
        while proc.poll() is None:
            pids = (proc.pid, *children(proc.pid))
            for p in pids:
                if p not in seen:
                    seen[p] = _start_time(p)
            sizes = {p: rss_anon_kb(p) for p in pids}
            peak = max(peak, sum(sizes.values()))
            if per_process is not None:
                timeline.append((time.perf_counter() - start, sizes))
                for p, kb in sizes.items():
                    if kb > per_process.get(p, ("", 0, 0))[1]:
                        per_process[p] = (process_name(p), kb, 0)
            if time_limit and time.perf_counter() - start > time_limit:
                _end(proc.pid, seen)
            time.sleep(interval)
        _end(proc.pid, seen)  # anything the run left behind (Ray's daemons)
        reader.join()
    if per_process is not None:  # each one's peak after the last progress line
        for at, sizes in timeline:
            for p, kb in sizes.items():
                if at > last_progress and p in per_process:
                    name, whole, end = per_process[p]
                    per_process[p] = (name, whole, max(end, kb))
        if math.isfinite(last_progress):
            before = max(
                (sum(sizes.values()) for at, sizes in timeline if at <= last_progress),
                default=0,
            )
            mb = before / 1024
            print(f"    whole tree's peak up to the last progress line: {mb:,.0f} MB")
    if proc.returncode:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:]
        print(f"failed ({proc.returncode}): {tail}")
    return proc.returncode, time.perf_counter() - start, peak, started


def _start_time(pid: int) -> int:
    """The start time of ``pid`` (clock ticks since boot; -1 if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rpartition(")")[2].split()[19])  # field 22 of proc(5)


def _end(group: int, seen: dict[int, int]) -> None:
    """SIGKILL process group ``group`` and every process seen in the run.

    The local SuperLink that ``flwr run`` starts leaves the run's session, and
    Ray's daemons with it, so the group alone misses them. A pid seen earlier
    may since have been reused by another process: only a pid whose start time
    is still the one seen is ended.
    """
    import signal

    with contextlib.suppress(OSError):
        os.killpg(group, signal.SIGKILL)
    for pid, started in seen.items():
        if started >= 0 and _start_time(pid) == started:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def simulate_cmd(
    data: Path, rows: int, audit: bool, out: Path, extra: list[str]
) -> list[str]:
    """The ``simulate`` command of one measurement."""
    return [
        sys.executable, "-m", "tpsl_flwr.cli", "simulate",
        "--dataset", "criteo", "--data-path", str(data), "--rows", str(rows),
        "--epochs", "1", "--batch-size", "1024", "--engine", "local",
        "--audit" if audit else "--no-audit",
        "--out-dir", str(out / "run"), "--overwrite",
        "--json", str(out / "results.json"), *extra,
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="50000,200000,500000")
    parser.add_argument("--audit", choices=("both", "on", "off"), default="both")
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--malloc", choices=("glibc", "lean", "both"), default="glibc")
    parser.add_argument("--keep", help="write the file here and keep it")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=0.0,
        help="end each run after this many seconds (0: none); its peak is then "
        "the peak so far, e.g. of a Ray run's start and first steps",
    )
    parser.add_argument(
        "--per-process",
        action="store_true",
        help="also print each process's own peak RssAnon (Ray: every party's)",
    )
    parser.add_argument("extra", nargs="*", help="extra simulate flags (after --)")
    args = parser.parse_args()
    sizes = sorted(int(r) for r in args.rows.split(","))
    audits = {"both": (True, False), "on": (True,), "off": (False,)}[args.audit]
    mallocs = ("glibc", "lean") if args.malloc == "both" else (args.malloc,)
    settings = [(a, m) for a in audits for m in mallocs]

    from tpsl_flwr.testing.ctr_generator import write_criteo

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep) if args.keep else Path(tmp)
        data = folder / "train.txt"
        if not data.exists():
            write_criteo(data, sizes[-1], seed=0)
        runs: dict[tuple[int, bool, str], list[tuple[int, float, float]]] = {}
        for n in sizes:
            for rep in range(args.repeat):
                for audit, malloc in settings:
                    out = Path(tmp) / f"out-{n}-{int(audit)}-{malloc}-{rep}"
                    out.mkdir(parents=True, exist_ok=True)
                    cmd = simulate_cmd(data, n, audit, out, args.extra)
                    processes: dict[int, tuple[str, int, int]] = {}
                    rc, wall, peak, started = run_sampled(
                        cmd,
                        args.interval,
                        out / "ledger",
                        malloc,
                        args.time_limit,
                        processes if args.per_process else None,
                    )
                    speed, auc = float("nan"), float("nan")
                    if rc == 0:
                        result = json.loads((out / "results.json").read_text())
                        speed, auc = result["samples_per_second"], result["test_auc"]
                    if args.keep:  # the run's results and log beside the file
                        tag = f"{n}-{int(audit)}-{malloc}-{rep}"
                        if rc == 0:
                            kept = folder / f"results-{tag}.json"
                            kept.write_text(json.dumps(result, indent=1))
                        (folder / f"log-{tag}.txt").write_bytes(
                            (out / "log.txt").read_bytes()
                        )
                    runs.setdefault((n, audit, malloc), []).append(
                        (peak * 1024, speed, wall)
                    )
                    print(
                        f"rows {n:>9,d} audit {'on ' if audit else 'off'} malloc "
                        f"{malloc:5s} peak RssAnon {peak / 1024:8,.0f} MB  "
                        f"{speed:8,.0f} samples/s  {wall:6.1f} s (start "
                        f"{started:5.1f} s)  test AUC {auc:.4f}",
                        flush=True,
                    )
                    ranked = sorted(processes.items(), key=lambda kv: -kv[1][1])
                    for pid, (name, kb, end) in ranked[:8]:
                        # a run the time limit stopped has no end of epoch
                        stopped = rc != 0 or not end
                        tail = "     - MB" if stopped else f"{end / 1024:6,.0f} MB"
                        print(
                            f"    pid {pid:>7d} {kb / 1024:8,.0f} MB (end of epoch "
                            f"{tail})  {name[:60]}"
                        )
        print(
            f"\n{os.cpu_count()} CPUs; RssAnon sampled every {args.interval} s; "
            f"peak = max of {args.repeat} run(s), samples/s = median"
        )
        print(f"{'rows':>10s} {'audit':>5s} {'malloc':>6s} {'peak MB':>9s} "
              f"{'B/row growth':>13s} {'samples/s':>10s}")  # fmt: skip
        for audit, malloc in settings:
            prev = None
            for n in sizes:
                done = runs[(n, audit, malloc)]
                peak = max(p for p, _, _ in done)
                speed = statistics.median(s for _, s, _ in done)
                growth = (
                    "-" if prev is None else f"{(peak - prev[1]) / (n - prev[0]):,.0f}"
                )
                print(f"{n:>10,d} {'on' if audit else 'off':>5s} {malloc:>6s} "
                      f"{peak / 2**20:9,.0f} {growth:>13s} {speed:10,.0f}")  # fmt: skip
                prev = (n, peak)


if __name__ == "__main__":
    main()
