"""A TPSL round trip on a local Flower deployment vs Ray and in-process; where it goes.

Part 1 runs the SAME config (breast-cancer, Laplace eps 1, 2 non-label
parties, 1 epoch, seeded noise key, transcript audit off) for each batch size
(default 64 and 1024) and steps-per-message value (default 1) on each engine,
one after the other, through :func:`~tpsl_flwr.experiments.run.run_experiment`:

- ``deployment+executor``: a fresh ``DeploymentRuntime`` whose SuperNodes run
  with ``--isolation process`` and a warm executor each (``tpsl-flwr
  executor``: one long-lived process per SuperNode serves its tasks, the
  ClientApp and the party loaded once), ``flwr run`` there;
- ``deployment+executor+pipeline``: the same with ``pipeline-depth = 1``
  (the label party sends message ``k + 1`` before it reads reply ``k``, so a
  SuperNode that sends a reply finds its next message waiting instead of
  sleeping; the bottom models embed one step stale);
- ``deployment``: a fresh ``DeploymentRuntime`` without executors
  (``--no-executor``: ``flower-superlink`` and 2 ``flower-supernode`` on
  loopback, every message in a fresh ``flwr-clientapp`` process that imports
  torch and rebuilds the party from the state carried in its context);
- ``ray``: ``flwr run`` on Flower's Ray simulation;
- ``in-process``: the in-process Grid, in this process.

``--poll-interval S ...`` adds ``deployment`` runs with
``FLWR_SUPEREXEC_TASK_POLL_INTERVAL=S`` in the SuperNodes' environment (the
SuperExec's wait between two task polls, 1 s by default; Flower reads it).

Columns: ``s/round trip`` is ``round_trip_seconds``: the label party's epoch
training seconds over the epoch's round trips (``ceil(batches / steps per
message)`` train messages + 1 test query, + the gradient-only messages of a
pipelined run), i.e. a MEAN per message, the same formula for every engine
(pipelined messages overlap: there it is seconds per message, not latency);
``node median`` is, for the deployment, the median time between two
consecutive train messages arriving at SuperNode 0, from its log lines
timestamped as they were written. ``samples/s`` is the results'
``samples_per_second``. ``deployment/ray`` divides the deployment's samples/s
by Ray's. Targets (the issue's): deployment round trip <= 1.5 s at 1 step per
message; deployment/Ray samples/s >= 0.2 at batch 1024 (``--batch-size 64
1024`` adds that row; breast-cancer has 456 training rows, so batch 1024 is
one batch of 456).

Part 2 splits one warm executor round trip (SuperNode 0's log lines and its
executor's own times, one clock; :func:`executor_breakdown`) into: SuperNode
receive -> task acquired, the task's input pulled, the ClientApp called, the
call, the reply pushed, pushed -> the SuperNode sends, and the SuperNode idle
after. Part 3 measures, here, each component of one deployment round trip
without an executor:
the SuperNode's idle poll sleep (its constant read from flwr's
``supernode/start_client_internal.py``, and the gap measured in the
SuperNode log between a reply sent and the next message received), the time a
SuperNode holds a message (received -> reply sent), Flower's other poll
constants on that path, and the cost of the fresh ``flwr-clientapp`` process
per message: each import and the data reload (``builtin_party``) and state
decode, each in a fresh Python process, median of ``--repeats`` (3).

Usage: ``python bench/deployment.py [--steps-per-message 1] [--batch-size 64 1024]
[--engines ...] [--poll-interval 0.05] [--repeats 3]``. About 10 minutes on 2
cores.

The K x d table (steps per message x pipeline depth, issue 22) is
``bench/deployment_kd.py``, built on this module's runner and log timer.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import itertools
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from cpu_window import CpuSampler

from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run import DEPLOYMENT_LOGS, run_experiment

ENGINES = (
    "deployment+executor",
    "deployment+executor+pipeline",
    "deployment",
    "ray",
    "in-process",
)
PIPELINED = "+pipeline"
"""An engine with this in its name runs with ``pipeline-depth = 1``."""
POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
SUPERNODE_WAIT = "+supernode-wait="
"""An engine named ``...+supernode-wait=S`` runs its SuperNodes with Flower's
0.5 s reply wait shortened to ``S`` (a what-if: ``bench/whatif/``)."""
WHATIF_ENV = "TPSL_WHATIF_SUPERNODE_POLL"
WHATIF_DIR = Path(__file__).resolve().parent / "whatif"
_EXECUTOR = re.compile(
    r"executor \d+ (\S+) acquired ([0-9.]+) pulled ([0-9.]+) called ([0-9.]+) "
    r"answered ([0-9.]+) pushed ([0-9.]+)"
)
ROUND_TRIP_TARGET = 1.5
RATIO_TARGET = 0.2
_EVENT = re.compile(r"(Receiving|Sending): (\S+) message|Start `flwr-clientapp`")


class LogTimer(threading.Thread):
    """Timestamps the SuperNode log's message lines as they are written.

    Flower's log lines have no time; the file is polled every 5 ms and each
    new ``Receiving:``/``Sending:``/``Start `flwr-clientapp``` line gets the
    time it was first seen.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.events: list[tuple[float, str, str]] = []
        self.done = threading.Event()

    def run(self) -> None:
        pending, handle = "", None
        while True:
            finished = self.done.is_set()
            if handle is None and self.path.exists():
                handle = self.path.open("r", encoding="utf-8", errors="replace")
            if handle is not None:
                now = time.time()  # the executor logs time.time() too
                pending += handle.read()
                *lines, pending = pending.split("\n")
                for line in lines:
                    match = _EVENT.search(line)
                    if match is None:
                        continue
                    kind = match.group(1) or "start"
                    self.events.append((now, kind, match.group(2) or ""))
            if finished:
                if handle is not None:
                    handle.close()
                return
            time.sleep(0.005)

    def train_gaps(self) -> dict[str, list[float]]:
        """Per train message: round trip, held (received -> sent), idle gaps."""
        received = [t for t, k, m in self.events if k == "Receiving" and m == "train"]
        sent = [t for t, k, m in self.events if k == "Sending" and m == "train"]
        starts = [t for t, k, _ in self.events if k == "start"]
        every_received = [t for t, k, _ in self.events if k == "Receiving"]
        held = [s - r for r, s in zip(received, sent, strict=False)]
        to_process = []
        for r in received:
            later = [s for s in starts if s >= r]
            if later:
                to_process.append(later[0] - r)
        idle = []
        for s in sent:  # reply sent -> the next message (train or query) received
            later = [r for r in every_received if r > s]
            if later:
                idle.append(later[0] - s)
        # train messages and the test query after them
        trips = [t for t in every_received if received and t >= received[0]]
        return {
            "round_trip": [b - a for a, b in itertools.pairwise(trips)],
            "held": held,
            "to_process": to_process,
            "idle": idle,
        }


def config(batch: int, spm: int, out_dir: Path) -> ExperimentConfig:
    """The bench's experiment."""
    return ExperimentConfig(
        dataset="breast-cancer",
        mechanism="laplace",
        epsilon=1.0,
        num_parties=2,
        epochs=1,
        batch_size=batch,
        steps_per_message=spm,
        noise_seed=0,
        audit=False,
        out_dir=str(out_dir),
    )


def executor_breakdown(
    events: list[tuple[float, str, str]], executor_log: Path
) -> dict[str, list[float]]:
    """Per train message served warm by executor 0: where its round trip went.

    Matches each executor line with the SuperNode's last ``Receiving: train``
    before it was acquired and its first ``Sending: train`` after it was
    pushed: SuperNode receive -> task acquired (the SuperNode pulls the
    message's objects, the executor's poll), acquired -> input pulled, pulled
    -> the ClientApp called, the call, the reply and status pushed, pushed ->
    the SuperNode sends (its reply-wait poll), and the SuperNode idle after.
    """
    served = [
        [float(v) for v in m.groups()[1:]]
        for m in map(_EXECUTOR.search, executor_log.read_text().splitlines())
        if m is not None and m.group(1) == "train"
    ]
    received = [t for t, k, m in events if k == "Receiving" and m == "train"]
    sent = [t for t, k, m in events if k == "Sending" and m == "train"]
    every_received = [t for t, k, _ in events if k == "Receiving"]
    names = ("to acquire", "pull", "checks", "call", "push", "to send", "idle")
    parts: dict[str, list[float]] = {name: [] for name in names}
    for acquired, pulled, called, answered, pushed in served:
        before = [t for t in received if t <= acquired]
        after = [t for t in sent if t >= pushed]
        if not (before and after):
            continue
        nxt = [t for t in every_received if t > after[0]]
        values = (
            acquired - before[-1],
            pulled - acquired,
            called - pulled,
            answered - called,
            pushed - answered,
            after[0] - pushed,
            (nxt[0] - after[0]) if nxt else float("nan"),
        )
        for name, value in zip(names, values, strict=True):
            if value == value:  # not NaN
                parts[name].append(value)
    return parts


def cpu_per_message(
    events: list[tuple[float, str, str]], sampler: CpuSampler
) -> dict[str, float]:
    """CPU seconds per train message by kind of process, in the steady state.

    The window runs from SuperNode 0's first ``Receiving: train`` to its last:
    the epoch's train messages without the start and the test query.
    ``window s`` and ``messages`` are in the result too.
    """
    received = [t for t, k, m in events if k == "Receiving" and m == "train"]
    if len(received) < 3:
        return {}
    seconds, used = sampler.window(received[0], received[-1])
    count = len(received) - 1
    per = {kind: cpu / count for kind, cpu in used.items()}
    per["window s"], per["messages"] = seconds, float(count)
    return per


def run_engine(engine: str, cfg: ExperimentConfig) -> dict[str, Any]:
    """Run ``cfg`` on ``engine``; the results plus wall s (and node log timings)."""
    started = time.perf_counter()
    timer = None
    if PIPELINED in engine:
        cfg = dataclasses.replace(cfg, pipeline_depth=1)
    logs = Path(cfg.out_dir).resolve() / DEPLOYMENT_LOGS
    deployed = engine.startswith("deployment")
    poll = engine.partition("poll=")[2]
    saved = os.environ.get(POLL_ENV)
    if poll:
        os.environ[POLL_ENV] = poll  # the SuperNodes inherit it
    wait = engine.partition(SUPERNODE_WAIT)[2]
    saved_whatif = {name: os.environ.get(name) for name in (WHATIF_ENV, "PYTHONPATH")}
    if wait:  # every process the deployment starts inherits both
        os.environ[WHATIF_ENV] = wait
        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join([str(WHATIF_DIR), *[path or ""]])
    sampler = None
    if deployed:
        timer = LogTimer(logs / "supernode-0.log")
        timer.start()
        sampler = CpuSampler()
        sampler.start()
    try:
        results = run_experiment(
            cfg,
            "deployment" if deployed else engine.replace("in-process", "local"),
            timeout=900,
            overwrite=True,
            executor="+executor" in engine,
        )
    finally:
        if timer is not None:
            timer.done.set()
            timer.join(timeout=5)
        if sampler is not None:
            sampler.stop()
        if poll:
            os.environ.pop(POLL_ENV)
            if saved is not None:
                os.environ[POLL_ENV] = saved
        for name, value in saved_whatif.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value
    results["wall_seconds"] = time.perf_counter() - started
    if timer is not None:
        results["node_gaps"] = timer.train_gaps()
        if sampler is not None:
            results["cpu_per_message"] = cpu_per_message(timer.events, sampler)
        if "+executor" in engine:
            results["executor_parts"] = executor_breakdown(
                timer.events, logs / "executor-0.log"
            )
    if "round_trip_seconds" not in results:
        from tpsl_flwr.experiments.run import round_trip_seconds

        results["round_trip_seconds"] = round_trip_seconds(results)
    return results


# ------------------------------------------------------------ part 2: parts
_PARTY = """
import time
t0 = time.perf_counter()
import tpsl_flwr.simulations.node_app as ca
t1 = time.perf_counter()
import numpy as np, torch
from flwr.app import Context, RecordDict
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.wire.state_codec import decode_state, encode_state
cfg = ExperimentConfig(dataset="breast-cancer", batch_size=64, noise_seed=-1)
ctx = Context(1, 1, {"partition-id": 0, "num-partitions": 2}, RecordDict(),
              cfg.to_run_config())
t2 = time.perf_counter()
party = ca.builtin_party(ctx)
t3 = time.perf_counter()
ids = np.arange(64)
emb = party.embed(ids, keep_graph=True)
party.apply_gradient(ids, np.zeros(tuple(emb.shape), dtype=np.float32))
t4 = time.perf_counter()
header, blob = encode_state(party.state_dict())
t5 = time.perf_counter()
fresh = ca.builtin_party(ctx)
t6 = time.perf_counter()
fresh.load_state_dict(decode_state(header, blob))
t7 = time.perf_counter()
print(t1 - t0, t3 - t2, t4 - t3, t7 - t6, len(blob))
"""

_SNIPPETS = {
    "python start (no import)": ("pass", None),
    "import flwr.clientapp": ("import flwr.clientapp", None),
    "import torch": ("import torch", None),
    "torch.optim.Adam over a small model (after import torch)": (
        "import torch",
        "torch.optim.Adam(torch.nn.Linear(30, 64).parameters(), lr=1e-3)",
    ),
    "import tpsl_flwr.simulations.client_app (the FAB's ClientApp: flwr, no torch)": (
        "import tpsl_flwr.simulations.client_app",
        None,
    ),
    "import tpsl_flwr.simulations.node_app (flwr + torch + project)": (
        "import tpsl_flwr.simulations.node_app",
        None,
    ),
}


def fresh_seconds(setup: str, timed: str | None) -> float:
    """Seconds of ``timed`` (or of all of ``setup``) in a fresh process."""
    if timed is None:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", setup], check=True)
        return time.perf_counter() - started
    code = (
        f"{setup}\nimport time\nt = time.perf_counter()\n{timed}\n"
        "print(time.perf_counter() - t)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    )
    return float(out.stdout.split()[-1])


def process_costs(repeats: int) -> dict[str, float]:
    """Median seconds of each per-message process cost, each in a fresh process."""
    costs = {
        name: statistics.median(fresh_seconds(*snippet) for _ in range(repeats))
        for name, snippet in _SNIPPETS.items()
    }
    party = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", _PARTY], check=True, capture_output=True, text=True
        )
        party.append([float(x) for x in out.stdout.split()])
    columns = list(zip(*party, strict=True))
    costs["builtin_party(context) cold: data reload + models + Adam"] = (
        statistics.median(columns[1])
    )
    costs["first step cold (embed + apply_gradient)"] = statistics.median(columns[2])
    costs["state decode + load_state_dict (warm party)"] = statistics.median(columns[3])
    costs["state size (bytes)"] = columns[4][0]
    return costs


def idle_sleep_constant() -> float:
    """The SuperNode's sleep after an empty pull, read from flwr's source."""
    from flwr.supernode import start_client_internal

    source = inspect.getsource(start_client_internal)
    match = re.search(r"if run_id is None:.*?time\.sleep\(([0-9.]+)\)", source, re.S)
    return float(match.group(1)) if match else float("nan")


def reply_wait_constant() -> float:
    """The SuperNode's sleep while waiting for the ClientApp's reply."""
    from flwr.supernode import start_client_internal

    source = inspect.getsource(start_client_internal._push_messages)
    match = re.search(r"time\.sleep\(([0-9.]+)\)", source)
    return float(match.group(1)) if match else float("nan")


def task_poll_constant() -> float:
    """SuperExec's default wait between two task polls (launching ClientApps)."""
    from flwr.supercore.superexec import run_superexec

    return float(run_superexec._DEFAULT_TASK_POLL_INTERVAL_SECONDS)


def _med(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "n/a"


def print_executor_parts(
    rows: dict[tuple[str, int, int], dict[str, Any]],
    engines: list[str],
    settings: list[tuple[int, int]],
) -> None:
    """Part 2: where one warm executor round trip goes, per executor run."""
    print()
    print(
        "Where one deployment+executor round trip goes (train messages at "
        "SuperNode 0 and its executor, medians, seconds):"
    )
    print()
    names = ("to acquire", "pull", "checks", "call", "push", "to send", "idle")
    print("| run | round trip | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for batch, spm in settings:
        for engine in engines:
            r = rows.get((engine, batch, spm), {})
            if "executor_parts" not in r:
                continue
            gaps, parts = r["node_gaps"], r["executor_parts"]
            cells = " | ".join(_med(parts[name]) for name in names)
            print(
                f"| {engine}, batch {batch}, {spm} step(s)/msg "
                f"| {_med(gaps['round_trip'])} | {cells} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps-per-message", type=int, nargs="+", default=[1], dest="spms"
    )
    parser.add_argument(
        "--batch-size", type=int, nargs="+", default=[64, 1024], dest="batches"
    )
    parser.add_argument("--engines", nargs="+", default=list(ENGINES))
    parser.add_argument(
        "--poll-interval",
        nargs="*",
        default=[],
        help=f"also deployment (no executor) with {POLL_ENV}=S (seconds)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes each")
    parser.add_argument("--out", type=Path, default=None, help="keep outputs here")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    tmp = None
    if args.out is None:
        tmp = tempfile.TemporaryDirectory(prefix="tpsl-bench-deployment-")
        args.out = Path(tmp.name)
    out = args.out.resolve()
    began = time.perf_counter()
    load_before = os.getloadavg()
    rows: dict[tuple[str, int, int], dict[str, Any]] = {}
    settings = [(b, s) for b in args.batches for s in args.spms if b == 64 or s == 1]
    engines = list(args.engines)
    engines += [f"deployment poll={p}" for p in args.poll_interval]
    for batch, spm in settings:
        for engine in engines:
            tag = f"{engine.replace(' ', '-')}-b{batch}-spm{spm}"
            results = run_engine(engine, config(batch, spm, out / tag))
            rows[(engine, batch, spm)] = results
            print(
                f"  {tag}: {results['round_trip_seconds']:.3f} s/round trip, "
                f"{results['samples_per_second']:.1f} samples/s, "
                f"{results['wall_seconds']:.1f} s wall",
                file=sys.stderr,
                flush=True,
            )
    costs = process_costs(args.repeats)
    load_after = os.getloadavg()

    first = next(iter(rows.values()))
    print(
        f"Deployment round trip: breast-cancer, {first['train_rows']} training rows, "
        "laplace eps 1, 1 epoch, 2 parties, seeded key, audit off; "
        f"OMP_NUM_THREADS {os.environ['OMP_NUM_THREADS']}; {os.cpu_count()} CPUs, "
        f"load avg {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )
    print()
    print(
        "| engine | batch | steps/msg | round trips | s/round trip (mean) "
        "| node median s | samples/s | wall s | test_auc |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (engine, batch, spm), r in rows.items():
        train = math.ceil(math.ceil(r["train_rows"] / batch) / spm)
        depth = int(r["config"].get("pipeline-depth", 0))
        trips = train + min(depth, train - 1) + 1
        node = _med(r["node_gaps"]["round_trip"]) if "node_gaps" in r else "-"
        print(
            f"| {engine} | {batch} | {spm} | {trips} | {r['round_trip_seconds']:.3f} "
            f"| {node} | {r['samples_per_second']:.1f} | {r['wall_seconds']:.1f} "
            f"| {r.get('test_auc', float('nan')):.4f} |"
        )
    print()
    print("| check | measured | target |")
    print("|---|---|---|")
    deployed = [e for e in engines if e.startswith("deployment")]
    for batch, spm in settings:
        ray = rows.get(("ray", batch, spm))
        for engine in deployed:
            dep = rows[(engine, batch, spm)]
            if spm == 1:
                print(
                    f"| {engine} round trip s, batch {batch}, 1 step/message "
                    f"| {dep['round_trip_seconds']:.3f} | <= {ROUND_TRIP_TARGET} |"
                )
            if ray is None:
                continue
            ratio = dep["samples_per_second"] / ray["samples_per_second"]
            target = f">= {RATIO_TARGET}" if batch == 1024 else "-"
            print(
                f"| {engine}/ray samples/s, batch {batch}, {spm} steps/message "
                f"| {ratio:.4f} | {target} |"
            )
    print_executor_parts(rows, engines, settings)

    spm = min(args.spms)
    if ("deployment", args.batches[0], spm) not in rows:
        if tmp is not None:
            tmp.cleanup()
        return
    gaps = rows[("deployment", args.batches[0], spm)]["node_gaps"]
    idle_const, reply_const, task_const = (
        idle_sleep_constant(),
        reply_wait_constant(),
        task_poll_constant(),
    )
    print()
    print(
        "Where one deployment round trip without an executor goes (batch "
        f"{args.batches[0]}, {spm} step(s) per message; SuperNode 0's log, train "
        f"messages; fresh-process costs median of {args.repeats}):"
    )
    print()
    print("| component | seconds | measured how |")
    print("|---|---|---|")
    lines = [
        (
            "round trip (node: message received -> next received), median",
            _med(gaps["round_trip"]),
            "SuperNode 0 log lines, timed as written",
        ),
        (
            "round trip (label party: epoch s / round trips), mean",
            f"{rows[('deployment', args.batches[0], spm)]['round_trip_seconds']:.2f}",
            "results.json",
        ),
        (
            "SuperNode idle: reply sent -> next message received, median",
            _med(gaps["idle"]),
            "SuperNode 0 log lines",
        ),
        (
            "  SuperNode sleep after an empty pull (flwr constant)",
            f"{idle_const:.2f}",
            "flwr/supernode/start_client_internal.py",
        ),
        (
            "SuperNode holds the message: received -> reply sent, median",
            _med(gaps["held"]),
            "SuperNode 0 log lines",
        ),
        (
            "  received -> `flwr-clientapp` process logs its start, median",
            _med(gaps["to_process"]),
            "SuperNode 0 log lines",
        ),
        (
            "  SuperExec task poll (flwr default; mean wait half)",
            f"{task_const:.2f}",
            "flwr/supercore/superexec/run_superexec.py",
        ),
        (
            "  SuperNode reply-wait poll (flwr constant; mean wait half)",
            f"{reply_const:.2f}",
            "start_client_internal._push_messages",
        ),
    ]
    for name, value in costs.items():
        if name == "state size (bytes)":
            continue
        lines.append((f"  fresh process: {name}", f"{value:.3f}", "fresh python -c"))
    for name, shown, how in lines:
        print(f"| {name} | {shown} | {how} |")
    print()
    print(
        f"State carried in context.state per node: {costs['state size (bytes)']:.0f} "
        f"bytes. Bench wall time {time.perf_counter() - began:.0f} s."
    )
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
