"""Deployment throughput by steps per message K and pipeline depth d; our share.

Part 1 runs the SAME experiment (synthetic-ctr, ``--rows`` rows (20000),
batch 1024, Laplace eps 1, 2 non-label parties, 1 epoch, seeded noise key,
audit, validation and checkpoints off) on a local Flower deployment
(``flower-superlink`` + 2 ``flower-supernode`` on loopback, the engines of
``bench/deployment.py``) for every K
(``--steps``, default 1 8), pipeline depth d (``--depth``, default 1 2) and
wire dtype (``--wire-dtype``, default float32), and on Flower's Ray
simulation (d = 0, float32) for each K. Columns: samples/s (the results'),
``s/message``: the label party's epoch seconds over the epoch's messages (a
mean, ``round_trip_seconds``: train messages, the gradient-only ones of a
pipelined run and the test query), ``node median``: the median gap between
two messages arriving at SuperNode 0 (its log lines, timed as written: the
steady-state message time, free of the epoch's fill and drain), test AUC,
and deployment/Ray samples/s. Then where a train message goes without the
executor (SuperNode 0, medians): SuperNode idle, the SuperNode holding the
message, and within that its SuperExec's poll and spawn of the per-message
``flwr-clientapp``. Then the CPU seconds per train message of each kind
of process on the machine (``bench/cpu_window.py``: ``/proc`` sampled every
0.2 s, SuperNode 0's first to last train message), the cores busy, and the
floor they set: the machine's CPU seconds per message over its CPU count, the
least wall time a message can take however messages overlap.

Part 2 times OUR code's share of one train message in this process, K = 1
vs each K, for each wire dtype (median of ``--repeats``): the label party
building the message, Flower's protobuf encoding of it (what crosses between
the label party's and the node's processes) and decoding, the node's handler
(K embeds and K gradient steps + the state save), the reply's encoding and
decoding, the label party reading the embeddings, and the bytes each way.

Each deployment engine of ``--engines`` runs every (K, d, wire):
``deployment+executor`` (default: ``--isolation process`` and a warm executor
per SuperNode, ``tpsl-flwr executor``) and ``deployment`` (``--no-executor``:
Flower's ``flwr-clientapp`` per message, the node's state carried in its
context). For the
executor, where a train message goes is read from its log: SuperNode receive
-> task acquired, pull of the task input, our checks, the ClientApp call, the
push, pushed -> the SuperNode sends (its reply-wait poll), SuperNode idle.
The in-process engine runs each (K, d) too, for the test AUC to compare with.

Targets (issue 37): deployment round trip at K = 1, d = 1 <= 0.5 s;
deployment/Ray samples/s at K = 8 >= 0.3; CPU seconds per K = 8 message,
whole machine, <= 1.0; test AUC deployment vs in-process within 0.002.
Earlier (issue 22): message time K = 8 vs K = 1 at d = 1 <= 1.25.

Usage: ``python bench/deployment_kd.py [--rows 20000] [--steps 1 8]
[--depth 1 2] [--wire-dtype float32 float16] [--engines deployment+executor
deployment] [--repeats 5] [--no-ray]``. About 12 minutes on a loaded
2-core machine (each deployment run 1-4 min).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cpu_window import KINDS
from deployment import SUPERNODE_WAIT, _med, run_engine

from tpsl_flwr.experiments.config import ExperimentConfig

BATCH = 1024
MESSAGE_RATIO_TARGET = 1.25
ROUND_TRIP_TARGET = 0.5
RAY_RATIO_TARGET = 0.3
CPU_TARGET = 1.0
AUC_TOLERANCE = 0.002
DEPLOYMENTS = ("deployment+executor", "deployment")


def config(rows: int, k: int, depth: int, wire: str, out: Path) -> ExperimentConfig:
    """The bench's experiment at K steps per message, depth d, wire dtype."""
    return ExperimentConfig(
        dataset="synthetic-ctr",
        rows=rows,
        mechanism="laplace",
        epsilon=1.0,
        num_parties=2,
        epochs=1,
        batch_size=BATCH,
        steps_per_message=k,
        pipeline_depth=depth,
        wire_dtype=wire,
        noise_seed=0,
        audit=False,
        validation_fraction=0.0,
        checkpoint=False,
        out_dir=str(out),
    )


def messages(results: dict[str, Any], k: int, depth: int) -> int:
    """Messages of the epoch: train, gradient-only (pipelined) and the test query."""
    train = math.ceil(math.ceil(results["train_rows"] / BATCH) / k)
    return train + min(depth, train - 1) + 1


# ------------------------------------------------------ part 2: our share
def our_share(rows: int, k: int, wire: str, repeats: int) -> dict[str, float]:
    """Median seconds of each part of one train message that is our code."""
    import numpy as np
    from flwr.app import Context, RecordDict

    from tpsl_flwr.engines.virtual_nodes import task_identity
    from tpsl_flwr.simulations import node_app
    from tpsl_flwr.wire.label_side import Node

    cfg = config(rows, k, 0, wire, Path(tempfile.gettempdir()))
    node_config: dict[str, bool | float | int | str] = {
        "partition-id": 0,
        "num-partitions": 2,
    }
    context = Context(1, 1, node_config, RecordDict(), cfg.to_run_config())
    app = node_app.make_node_app(node_app.builtin_party)
    party = node_app.builtin_party(context)
    width = int(party.embed(np.array([0]), "train").shape[1])
    node = Node(1, 0, width, 0)
    rng = np.random.default_rng(0)
    with task_identity(1, 1, 0):
        runs = [
            _one_message(app, context, node, party.num_samples("train"), k, wire, rng)
            for _ in range(repeats + 1)  # the first one warms up
        ]
    return {name: statistics.median(r[name] for r in runs[1:]) for name in runs[1]}


def _one_message(
    app: Any, context: Any, node: Any, n_train: int, k: int, wire: str, rng: Any
) -> dict[str, float]:
    """Each part of one train message, timed: seconds (and bytes)."""
    import torch
    from flwr.app import Message, RecordDict
    from flwr.common import serde
    from flwr.proto.message_pb2 import Message as ProtoMessage
    from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

    from tpsl_flwr.engines.message_copy import copy_context
    from tpsl_flwr.wire import protocol as P
    from tpsl_flwr.wire.label_side import gather_embeddings, step_message

    times: dict[str, float] = {}

    def timed(name: str, f: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        out = f()
        times[name] = time.perf_counter() - started
        return out

    ids = [rng.choice(n_train, BATCH, replace=False) for _ in range(k)]
    pending = [
        (rng.choice(n_train, BATCH, replace=False), torch.randn(BATCH, node.width))
        for _ in range(k)
    ]
    msg = timed(
        "label party builds the message",
        lambda: step_message(node, P.MSG_TRAIN, {P.EPOCH: 0}, ids, pending, wire),
    )
    raw = timed(
        "message -> protobuf bytes",
        lambda: serde.message_to_proto(msg).SerializeToString(),
    )

    def decode_message() -> Message:
        proto = ProtoMessage()
        proto.ParseFromString(raw)
        return serde.message_from_proto(proto)

    got = timed("protobuf bytes -> message", decode_message)
    trial = copy_context(context)
    reply = timed(
        "node handler: K embeds + K gradient steps + state save",
        lambda: app(got, trial),
    )
    context.state = trial.state
    body = timed(
        "reply -> protobuf bytes",
        lambda: serde.recorddict_to_proto(reply.content).SerializeToString(),
    )

    def decode_reply() -> RecordDict:
        proto = ProtoRecordDict()
        proto.ParseFromString(body)
        return serde.recorddict_from_proto(proto)

    answer = Message(timed("protobuf bytes -> reply", decode_reply), reply_to=got)
    timed(
        "label party reads the embeddings",
        lambda: gather_embeddings([node], {node.node_id: answer}, ids),
    )
    times["bytes sent"], times["bytes back"] = len(raw), len(body)
    return times


def print_share(shares: dict[tuple[int, str], dict[str, float]]) -> None:
    """Part 2's table: one column per (K, wire dtype)."""
    keys = list(shares)
    print()
    print(
        "Our code's share of one train message (this process, batch "
        f"{BATCH}, one node; ms, median):"
    )
    print()
    print("| part | " + " | ".join(f"K={k}, {w}" for k, w in keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name in shares[keys[0]]:
        if name.startswith("bytes"):
            cells = [f"{shares[key][name]:,.0f}" for key in keys]
        else:
            cells = [f"{1000 * shares[key][name]:.1f}" for key in keys]
        print(f"| {name} | " + " | ".join(cells) + " |")
    total = [
        1000 * sum(v for n, v in shares[key].items() if not n.startswith("bytes"))
        for key in keys
    ]
    print("| total (ms) | " + " | ".join(f"{t:.1f}" for t in total) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--depth", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--wire-dtype", nargs="+", default=["float32"], dest="wires")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument(
        "--engines", nargs="+", default=list(DEPLOYMENTS), choices=DEPLOYMENTS
    )
    parser.add_argument("--no-inprocess", action="store_true")
    parser.add_argument(
        "--supernode-wait",
        type=float,
        default=None,
        metavar="S",
        help="what-if: also run each deployment with Flower's 0.5 s SuperNode "
        "reply wait shortened to S seconds (bench/whatif/sitecustomize.py)",
    )
    parser.add_argument("--out", type=Path, default=None, help="keep outputs here")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    tmp = None
    if args.out is None:
        tmp = tempfile.TemporaryDirectory(prefix="tpsl-bench-kd-")
        args.out = Path(tmp.name)
    out = args.out.resolve()
    began, load_before = time.perf_counter(), os.getloadavg()
    rows: dict[tuple[str, int, int, str], dict[str, Any]] = {}
    runs = [("ray", k, 0, "float32") for k in args.steps if not args.no_ray]
    if not args.no_inprocess:
        runs += [
            ("in-process", k, d, "float32") for d in args.depth for k in args.steps
        ]
    engines = list(args.engines)
    if args.supernode_wait is not None:
        engines += [f"{e}{SUPERNODE_WAIT}{args.supernode_wait:g}" for e in args.engines]
    runs += [
        (engine, k, d, w)
        for engine in engines
        for w in args.wires
        for d in args.depth
        for k in args.steps
    ]
    for engine, k, d, wire in runs:
        tag = f"{engine}-k{k}-d{d}-{wire}"
        results = run_engine(engine, config(args.rows, k, d, wire, out / tag))
        rows[(engine, k, d, wire)] = results
        print(
            f"  {tag}: {results['round_trip_seconds']:.3f} s/message, "
            f"{results['samples_per_second']:.1f} samples/s, "
            f"{results['wall_seconds']:.1f} s wall",
            file=sys.stderr,
            flush=True,
        )
    shares = {
        (k, w): our_share(args.rows, k, w, args.repeats)
        for w in args.wires
        for k in args.steps
    }
    load_after = os.getloadavg()
    first = next(iter(rows.values()))
    print(
        f"Deployment K x d: synthetic-ctr, {first['train_rows']} training rows, "
        f"batch {BATCH}, laplace eps 1, 1 epoch, 2 parties, seeded key, audit "
        f"and validation off; OMP_NUM_THREADS {os.environ['OMP_NUM_THREADS']}; "
        f"{os.cpu_count()} CPUs, load avg {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after"
    )
    print()
    print(
        "| engine | K | d | wire | messages | s/message (mean) | node median s "
        "| samples/s | test_auc | deployment/ray |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (engine, k, d, wire), r in rows.items():
        ray = rows.get(("ray", k, 0, "float32"))
        ratio = (
            f"{r['samples_per_second'] / ray['samples_per_second']:.4f}"
            if ray is not None and engine != "ray"
            else "-"
        )
        node = _med(r["node_gaps"]["round_trip"]) if "node_gaps" in r else "-"
        print(
            f"| {engine} | {k} | {d} | {wire} | {messages(r, k, d)} "
            f"| {r['round_trip_seconds']:.3f} | {node} "
            f"| {r['samples_per_second']:.1f} | {r.get('test_auc', float('nan')):.4f} "
            f"| {ratio} |"
        )
    print_checks(rows, args.steps, args.wires, engines)
    print_parts(rows)
    print_executor_parts(rows)
    print_cpu(rows)
    print_share(shares)
    print()
    print(f"Bench wall time {time.perf_counter() - began:.0f} s.")
    if tmp is not None:
        tmp.cleanup()


def print_checks(
    rows: dict[tuple[str, int, int, str], dict[str, Any]],
    steps: list[int],
    wires: list[str],
    engines: list[str],
) -> None:
    """The issues' targets, for each deployment engine and wire dtype measured."""
    lo, hi = min(steps), max(steps)
    print()
    print("| check | measured | target |")
    print("|---|---|---|")
    for engine in engines:
        for wire in wires:
            _checks(rows, engine, lo, hi, wire)


def _checks(
    rows: dict[tuple[str, int, int, str], dict[str, Any]],
    engine: str,
    lo: int,
    hi: int,
    wire: str,
) -> None:
    """One engine's rows of the checks table (issue 37's, then issue 22's)."""
    for (name, k, d, w), r in rows.items():
        if name != engine or w != wire:
            continue
        if k == 1 and d == 1:
            print(
                f"| {engine}: round trip, K=1, d=1, {wire} (mean s/message) "
                f"| {r['round_trip_seconds']:.3f} | <= {ROUND_TRIP_TARGET} |"
            )
            gaps = r.get("node_gaps", {}).get("round_trip")
            if gaps:
                print(
                    f"| {engine}: round trip, K=1, d=1, {wire} (node median) "
                    f"| {statistics.median(gaps):.3f} | <= {ROUND_TRIP_TARGET} |"
                )
        ray = rows.get(("ray", k, 0, "float32"))
        if k == hi and ray is not None:
            ratio = r["samples_per_second"] / ray["samples_per_second"]
            print(
                f"| {engine}: deployment/ray samples/s, K={k}, d={d}, {wire} "
                f"| {ratio:.4f} | >= {RAY_RATIO_TARGET} |"
            )
        cpu = r.get("cpu_per_message") or {}
        if k == hi and cpu:
            print(
                f"| {engine}: CPU s per K={k} message, d={d}, whole machine "
                f"| {cpu['machine']:.2f} | <= {CPU_TARGET} |"
            )
        local = rows.get(("in-process", k, d, "float32"))
        if local is not None:
            gap = abs(r.get("test_auc", math.nan) - local.get("test_auc", math.nan))
            print(
                f"| {engine}: test AUC vs in-process, K={k}, d={d}, {wire} "
                f"| {gap:.4f} | <= {AUC_TOLERANCE} |"
            )
    a = rows.get((engine, lo, 1, wire))
    b = rows.get((engine, hi, 1, wire))
    if a is None or b is None or lo == hi:
        return
    mean = b["round_trip_seconds"] / a["round_trip_seconds"]
    print(
        f"| {engine}: message time K={hi} / K={lo}, d=1, {wire} (mean s/message) "
        f"| {mean:.2f} | <= {MESSAGE_RATIO_TARGET} |"
    )


def print_parts(rows: dict[tuple[str, int, int, str], dict[str, Any]]) -> None:
    """Where a train message goes without the executor (SuperNode 0, medians, s)."""
    runs = {
        key: r["node_gaps"]
        for key, r in rows.items()
        if key[0] == "deployment" and "node_gaps" in r
    }
    if not runs:
        return
    print()
    print(
        "Where a deployment train message goes without the executor (SuperNode 0, s):"
    )
    print()
    print(
        "| run | node median | SuperNode idle | SuperNode holds the message "
        "| received -> `flwr-clientapp` starts |"
    )
    print("|---|---|---|---|---|")
    for (_engine, k, d, wire), gaps in runs.items():
        print(
            f"| K={k}, d={d}, {wire} | {_med(gaps['round_trip'])} "
            f"| {_med(gaps['idle'])} | {_med(gaps['held'])} "
            f"| {_med(gaps['to_process'])} |"
        )


def print_executor_parts(
    rows: dict[tuple[str, int, int, str], dict[str, Any]],
) -> None:
    """Where a warm executor's train message goes (SuperNode 0, medians, s)."""
    runs = {
        key: r["executor_parts"] for key, r in rows.items() if "executor_parts" in r
    }
    if not runs:
        return
    names = list(next(iter(runs.values())))
    print()
    print("Where a train message goes with the warm executor (SuperNode 0, s):")
    print()
    print("| run | node median | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for (_engine, k, d, wire), parts in runs.items():
        gaps = rows[(_engine, k, d, wire)]["node_gaps"]["round_trip"]
        cells = [_med(parts[name]) for name in names]
        print(
            f"| {_engine} K={k}, d={d}, {wire} | {_med(gaps)} | "
            + " | ".join(cells)
            + " |"
        )


def print_cpu(rows: dict[tuple[str, int, int, str], dict[str, Any]]) -> None:
    """CPU seconds per train message by process, and the floor they set.

    ``floor`` is the machine's CPU seconds per message over its CPU count: no
    overlap of messages can make a message take less wall time than that.
    """
    runs = {
        key: r["cpu_per_message"] for key, r in rows.items() if r.get("cpu_per_message")
    }
    if not runs:
        return
    cpus = os.cpu_count() or 1
    kinds = [*dict.fromkeys(k for _, k in KINDS), "other", "machine"]
    print()
    print(
        "CPU seconds per train message in the steady state (SuperNode 0's first "
        "to last train message; every process on this machine):"
    )
    print()
    print(
        "| run | messages | s/message | "
        + " | ".join(kinds)
        + " | cores busy | floor s/message |"
    )
    print("|---|---|---|" + "---|" * (len(kinds) + 2))
    for (engine, k, d, wire), cpu in runs.items():
        wall = cpu["window s"] / cpu["messages"]
        cells = [f"{cpu.get(kind, 0.0):.2f}" for kind in kinds]
        busy, floor = cpu["machine"] / wall, cpu["machine"] / cpus
        print(
            f"| {engine} K={k}, d={d}, {wire} | {cpu['messages']:.0f} | {wall:.2f} | "
            + " | ".join(cells)
            + f" | {busy:.2f} of {cpus} | {floor:.2f} |"
        )


if __name__ == "__main__":
    main()
