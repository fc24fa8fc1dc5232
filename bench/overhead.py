"""GradPerturb overhead: protected / unprotected LabelParty.train_step time, same batch.

For each placement (``logits``, ``cut``) it builds one label party per mechanism
(``none``, ``laplace``, ``discrete``) over identical copies of the same top model
and the same labels, then times blocks of ``--steps`` calls of
``LabelParty.train_step`` on the same pre-drawn embedding batches, interleaving
the mechanisms block by block (so load on a shared machine hits all of them
alike) and taking the median block time of ``--repeats`` blocks. The ratio is
the median over rounds of the protected block's time over the ``none`` block's
of the same round and placement (paired, so load that changes between rounds
cancels): the cost of indexing the batch's keyed noise plus the
coefficient-weighted loss. ``LabelParty`` derives each noise stream for all
training samples on first use; that one-time cost is measured apart and
printed below the table, also spread over one epoch's steps. Target: <= 1.05
at the logits placement.

Usage: ``python bench/overhead.py [--batch 256] [--steps 20] [--repeats 15]``.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import numpy as np
import torch

from tpsl_flwr.models import TopModel
from tpsl_flwr.parties import LabelParty, adam
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import make_mechanism

TARGET_LOGITS = 1.05
MECHANISMS = ("none", "laplace", "discrete")
PLACEMENTS = ("logits", "cut")


def _party(top: TopModel, labels: np.ndarray, mechanism: str, placement: str):
    epsilon = None if mechanism == "none" else 1.0
    return LabelParty(
        copy.deepcopy(top),
        labels,
        make_mechanism(mechanism, epsilon=epsilon),
        NoiseKey.from_seed(0),
        placement=placement,
        optimizer=adam(1e-2),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20, help="steps per block")
    parser.add_argument("--repeats", type=int, default=15, help="blocks per config")
    parser.add_argument("--width", type=int, default=32, help="cut-layer width")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    rng = np.random.default_rng(0)
    labels = (rng.random(args.rows) < 0.1).astype(np.int64)
    top = TopModel(
        args.width,
        hidden=(args.hidden,),
        num_outputs=1,
        generator=torch.Generator().manual_seed(0),
    )
    batches = [
        (
            rng.choice(args.rows, size=args.batch, replace=False),
            torch.randn(
                args.batch, args.width, generator=torch.Generator().manual_seed(i)
            ),
        )
        for i in range(args.steps)
    ]
    parties = {
        (p, m): _party(top, labels, m, p) for p in PLACEMENTS for m in MECHANISMS
    }
    # LabelParty derives each noise stream for all samples on first use: a
    # one-time cost per run (per epoch without noise reuse), timed here apart.
    derive: dict[str, float] = {}
    for mechanism in MECHANISMS:
        fresh = _party(top, labels, mechanism, "logits")
        start = time.perf_counter()
        fresh.train_step(*batches[0])
        first = time.perf_counter() - start
        start = time.perf_counter()
        fresh.train_step(*batches[0])
        derive[mechanism] = first - (time.perf_counter() - start)
    times: dict[tuple[str, str], list[float]] = {key: [] for key in parties}
    for party in parties.values():  # warm-up
        for ids, emb in batches[:3]:
            party.train_step(ids, emb)
    for repeat in range(args.repeats):
        order = list(parties)
        if repeat % 2:
            order.reverse()
        for key in order:
            party = parties[key]
            start = time.perf_counter()
            for ids, emb in batches:
                party.train_step(ids, emb)
            times[key].append(time.perf_counter() - start)

    print(
        f"GradPerturb overhead: batch {args.batch}, top {args.width}-{args.hidden}-1, "
        f"median of {args.repeats} interleaved blocks of {args.steps} steps, "
        f"{args.threads} torch thread(s), {os.cpu_count()} cores"
    )
    print()
    print("| placement | mechanism | ms/step | ratio vs none | target |")
    print("|---|---|---|---|---|")
    for placement in PLACEMENTS:
        base = times[(placement, "none")]
        for mechanism in MECHANISMS:
            median = statistics.median(times[(placement, mechanism)])
            # Paired: each block against the `none` block of the same round.
            ratio = statistics.median(
                t / b for t, b in zip(times[(placement, mechanism)], base, strict=True)
            )
            target = (
                f"<= {TARGET_LOGITS}"
                if placement == "logits" and mechanism != "none"
                else "-"
            )
            print(
                f"| {placement} | {mechanism} | {1000 * median / args.steps:.3f} | "
                f"{ratio:.3f} | {target} |"
            )
    steps = -(-args.rows // args.batch)
    print()
    print(
        "One-time derivation of a noise stream for all "
        f"{args.rows} samples (first step minus second, logits; an upper bound: "
        "it includes other first-step costs): "
        + ", ".join(
            f"{m} {1000 * derive[m]:.1f} ms ({1000 * derive[m] / steps:.3f} ms/step "
            f"over one epoch of {steps} steps)"
            for m in MECHANISMS
        )
        + "; with noise reuse it is paid once per run."
    )


if __name__ == "__main__":
    main()
