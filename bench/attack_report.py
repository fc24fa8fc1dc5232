"""Cost of the per-epoch attack report beside the epoch it audits.

The transcript audit scores every epoch with the norm, cosine, spectral and
white-box SDA attacks (``tpsl_flwr.attacks.report.attack_report``). This prints
the best of three timings of the report on 16,384 samples of 16-dimensional
cut-layer gradients in batches of 256 (an epoch of the default synthetic data),
so its share of an epoch can be read beside the epoch's own time.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from tpsl_flwr.attacks.report import BatchRecord, attack_report


def logistic_batches(n: int, d: int, size: int, seed: int = 16) -> list[BatchRecord]:
    """Cut-layer gradients of a logistic top layer, in batches as sent."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.1).astype(np.int64)
    w = rng.normal(size=d)
    p = 1.0 / (1.0 + np.exp(-(rng.normal(size=n) - 1.0)))
    candidates = np.stack([np.outer(p, w), np.outer(p - 1.0, w)], axis=1)
    gradients = candidates[np.arange(n), y]
    out = []
    for start in range(0, n, size):
        part = slice(start, start + size)
        m = y[part].size
        out.append(
            BatchRecord(
                np.arange(n)[part], gradients[part] / m, y[part], candidates[part]
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16_384)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    batches = logistic_batches(args.samples, args.dim, args.batch)
    attack_report(batches)  # warm up imports and caches
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        attack_report(batches)
        best = min(best, time.perf_counter() - start)
    print(
        f"attack report, {args.samples} samples x {args.dim} dims, batch {args.batch}"
    )
    print(f"best of 3: {best:.3f} s ({args.samples / best:,.0f} samples/s)")


if __name__ == "__main__":
    main()
