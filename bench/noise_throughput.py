"""Keyed noise derivation throughput, beside a training step it must not slow down.

Prints samples/s of deriving each mechanism's per-sample noise from the secret key
(AES-256 keyed PRF) and, in the same run, the samples/s of a forward + backward pass
of a small top model on the same batch size, so the ratio shows whether noise
derivation could ever be the bottleneck.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import make_mechanism
from tpsl_flwr.privacy.noisy_labels import draw_noisy_labels

BATCH = 1024
REPEATS = 200


def _rate(fn) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(REPEATS):
        fn()
    return BATCH * REPEATS / (time.perf_counter() - start)


def main() -> None:
    key = NoiseKey.from_os()
    rng = np.random.default_rng(0)
    ids = np.arange(BATCH, dtype=np.int64) * 7919
    labels2 = rng.integers(0, 2, size=BATCH)
    labels10 = rng.integers(0, 10, size=BATCH)
    top = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
    )
    emb = torch.randn(BATCH, 32)

    def train_step() -> None:
        top.zero_grad()
        top(emb).sum().backward()

    step_rate = _rate(train_step)
    rows = [("top-model forward+backward (reference)", step_rate)]
    cases = [
        ("laplace", 2, labels2, {"epsilon": 1.0}),
        ("discrete", 2, labels2, {"epsilon": 1.0}),
        ("laplace", 10, labels10, {"epsilon": 1.0}),
        ("discrete", 10, labels10, {"epsilon": 1.0}),
        ("gaussian", 2, labels2, {"sigma": 1.0}),
    ]
    for name, k, labels, params in cases:
        mech = make_mechanism(name, num_classes=k, **params)
        rate = _rate(lambda m=mech, y=labels: draw_noisy_labels(m, y, ids, key))
        rows.append((f"noise: {name}, k={k}", rate))
    print(f"batch {BATCH}, {REPEATS} repeats")
    print(f"{'what':42s} {'samples/s':>12s} {'/ train step':>13s}")
    for what, rate in rows:
        print(f"{what:42s} {rate:12.0f} {rate / step_rate:13.2f}")


if __name__ == "__main__":
    main()
