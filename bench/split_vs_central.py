"""Split-learning throughput (in-process engine) / the same network trained centrally.

``split``: one epoch of an in-process TPSL run (``run_inprocess_experiment``,
the engine of ``tpsl-flwr simulate``), no protection, audit and checkpoints
off; samples/s is the run's ``samples_per_second`` (training samples over the
epoch's seconds, the test-embedding query included); its nodes run one after
another (the default). ``split, nodes side by side`` is the same run with each
node on a thread of its own (``concurrent_nodes=True``), as on separate
machines: it uses a core per node.
``central``: the very same network (each party's bottom model over the same
column slices, with the same initial weights, and the top model, as
:mod:`tpsl_flwr.experiments.architecture` builds them for the run config's
``model``) trained as one torch model in a plain loop over the same batches,
Adam on every part, then one forward pass over the test set and its metrics
(``classification_metrics``, as the split run's evaluation); samples/s =
training rows / those seconds. Ratios are against the central run at the same
``--threads`` torch threads (like for like); the central run is also timed with
one torch thread per party, the cores the side-by-side split uses.
``split, state encoded every step``: the same split run with every node
writing its bottom model and optimizer state into ``context.state`` after each
step, as Ray's and the deployment runtime's stateless ClientApps must (the
local engine keeps it in the ClientApp object, ``app_keeps_state``).
``--mechanism laplace`` adds a split row with GradPerturb on. The two are run
alternately ``--repeats`` times and each cell is the best run (other load on a
shared machine only slows runs down). Target: split / central >= 0.8.

Usage: ``python bench/split_vs_central.py [--dataset NAME [--data-path FILE]]
[--rows 50000] [--repeats 3]
[--settings 64:16:256 64:16:1024 1024:64:1024]``: one block of rows per setting
(hidden width of the bottom and top models : embedding width per party : batch
size). The default model (64 / 16) is so small that even the central step is
mostly per-op overhead; the 1024 / 64 model shows the compute-bound case.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time

import numpy as np
import torch

from tpsl_flwr.data import partition_columns, party_features
from tpsl_flwr.experiments.architecture import build_bottom, build_top
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run import run_inprocess_experiment
from tpsl_flwr.experiments.training_settings import training_of
from tpsl_flwr.metrics.evaluation import classification_metrics
from tpsl_flwr.models import num_outputs_for
from tpsl_flwr.parties.optim import adam

TARGET = 0.8


def _setting(text: str) -> tuple[int, int, int]:
    """``HIDDEN:EMBEDDING:BATCH`` -> three ints."""
    try:
        hidden, embedding, batch = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected HIDDEN:EMBEDDING:BATCH, e.g. 64:16:256, got {text!r}"
        ) from None
    return hidden, embedding, batch


def _config(
    args: argparse.Namespace,
    setting: tuple[int, int, int],
    mechanism: str,
    out: str,
) -> ExperimentConfig:
    hidden, embedding, batch = setting
    return ExperimentConfig(
        dataset=args.dataset,
        data_path=args.data_path,
        rows=args.rows,
        mechanism=mechanism,
        epsilon=1.0,
        epochs=1,
        batch_size=batch,
        bottom_hidden=hidden,
        top_hidden=hidden,
        embedding_dim=embedding,
        wide=args.wide,
        num_parties=args.parties,
        noise_seed=0,
        new_release=True,  # repeats over one label set, seeded: a rehearsal
        audit=False,
        checkpoint=False,
        out_dir=out,
    )


def split_rate(
    cfg: ExperimentConfig, app_keeps_state: bool = True, concurrent: bool = False
) -> float:
    """Samples/s of one in-process TPSL epoch (at this bench's torch threads).

    ``app_keeps_state=False``: every node encodes its state into
    ``context.state`` after every step, as on Ray and the deployment runtime.
    ``concurrent=True``: each node on a thread of its own.
    """
    results, _ = run_inprocess_experiment(
        cfg, app_keeps_state=app_keeps_state, concurrent_nodes=concurrent
    )
    return float(results["history"][0]["samples_per_second"])


def central_rate(cfg: ExperimentConfig, threads: int) -> float:
    """Samples/s of the same network trained as one torch model."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _central_rate(cfg)
    finally:
        torch.set_num_threads(before)


def _central_rate(cfg: ExperimentConfig) -> float:
    data = cfg.load_data()
    columns = partition_columns(
        data.train.numeric_names, data.train.categorical_names, cfg.num_parties
    )
    parts = []
    for i, cols in enumerate(columns):
        train = party_features(data.train, cols)
        test = party_features(data.test, cols)
        bottom = build_bottom(cfg, train.numeric.shape[1], train.cardinalities, i)
        parts.append((bottom, train, test))
    top = build_top(cfg, num_outputs_for(data.num_classes))
    params = [p for b, _, _ in parts for p in b.parameters()] + list(top.parameters())
    # The rule of the split run (batch-size / lr = 0: from the training rows).
    training = training_of(cfg, len(data.train.labels))
    optimizer = adam(training.lr, cfg.weight_decay)(params)  # the split run's
    tensors = [
        (
            torch.as_tensor(tr.numeric, dtype=torch.float32),
            torch.as_tensor(tr.categorical, dtype=torch.long),
            torch.as_tensor(te.numeric, dtype=torch.float32),
            torch.as_tensor(te.categorical, dtype=torch.long),
        )
        for _, tr, te in parts
    ]
    labels = torch.as_tensor(data.train.labels, dtype=torch.float32)
    order = np.random.default_rng(cfg.seed).permutation(len(labels))
    loss_fn = torch.nn.BCEWithLogitsLoss()
    started = time.perf_counter()
    for begin in range(0, len(order), training.batch_size):
        ids = torch.as_tensor(order[begin : begin + training.batch_size])
        emb = torch.cat(
            [
                b(t[0][ids], t[1][ids])
                for (b, _, _), t in zip(parts, tensors, strict=True)
            ],
            dim=1,
        )
        optimizer.zero_grad()
        loss_fn(top(emb)[:, 0], labels[ids]).backward()
        optimizer.step()
    with torch.no_grad():
        emb = torch.cat(
            [b(t[2], t[3]) for (b, _, _), t in zip(parts, tensors, strict=True)], dim=1
        )
        positive = torch.sigmoid(top(emb)[:, 0])
        probs = torch.stack([1 - positive, positive], dim=1).numpy()
    classification_metrics(data.test.labels, probs)  # as the split run's query
    return len(order) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="synthetic-ctr")
    parser.add_argument("--data-path", default="", help="the file (criteo, avazu)")
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument(
        "--settings",
        type=_setting,
        nargs="+",
        default=[(64, 16, 256), (64, 16, 1024), (1024, 64, 1024)],
        metavar="HIDDEN:EMBEDDING:BATCH",
        help="hidden width (bottom and top), embedding width per party, batch",
    )
    parser.add_argument("--parties", type=int, default=2)
    parser.add_argument(
        "--wide",
        default="off",
        choices=("off", "on"),
        help="the wide part of Criteo/Avazu's model (on: FTRL in the split run "
        "but Adam in the central loop, so off compares like with like)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mechanism", default="laplace", help="extra split row")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from flwr.common.logger import FLOWER_LOGGER

    FLOWER_LOGGER.setLevel(logging.WARNING)
    best: dict[tuple[tuple[int, int, int], str], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for setting in args.settings:
            plain = _config(args, setting, "none", os.path.join(tmp, "none"))
            guarded = _config(args, setting, args.mechanism, os.path.join(tmp, "dp"))
            plain.load_data()  # cached: loading is outside every timed region
            rates: dict[str, list[float]] = {
                "split": [],
                "concurrent": [],
                "encoded": [],
                "protected": [],
                "central": [],
                "central-parties": [],
            }
            for _ in range(args.repeats):
                rates["split"].append(split_rate(plain))
                rates["concurrent"].append(split_rate(plain, concurrent=True))
                rates["encoded"].append(split_rate(plain, app_keeps_state=False))
                rates["central"].append(central_rate(plain, args.threads))
                if args.parties != args.threads:
                    rates["central-parties"].append(central_rate(plain, args.parties))
                if args.mechanism != "none":
                    rates["protected"].append(split_rate(guarded))
            best.update({(setting, k): max(v) for k, v in rates.items() if v})
    print(
        f"split vs central: {args.dataset}, {args.rows} rows, {args.parties} parties, "
        f"1 epoch, best of {args.repeats} alternating runs, {args.threads} torch "
        f"thread(s), {os.cpu_count()} cores; model = hidden width of bottom and "
        "top models / embedding width per party"
    )
    print()
    print("| run | model, batch | samples/s | ratio vs central | target |")
    print("|---|---|---|---|---|")
    for setting in args.settings:
        hidden, embedding, batch = setting
        model = f"{hidden} / {embedding}, batch {batch}"
        central = best[(setting, "central")]
        many = best.get((setting, "central-parties"), 0.0)
        split = best[(setting, "split")]
        print(
            f"| central (one torch model), {args.threads} torch thread(s) | {model} "
            f"| {central:.0f} | 1.000 | - |"
        )
        if many:
            print(
                f"| central (one torch model), {args.parties} torch threads | "
                f"{model} | {many:.0f} | {many / central:.3f} | - |"
            )
        print(
            f"| split, in-process, none | {model} | {split:.0f} "
            f"| {split / central:.3f} | >= {TARGET} |"
        )
        concurrent = best[(setting, "concurrent")]
        print(
            f"| split, in-process, none, nodes side by side ({args.parties} "
            f"threads) | {model} | {concurrent:.0f} | {concurrent / central:.3f} | - |"
        )
        encoded = best[(setting, "encoded")]
        print(
            f"| split, in-process, none, state encoded every step | {model} | "
            f"{encoded:.0f} | {encoded / central:.3f} | - |"
        )
        if (setting, "protected") in best:
            rate = best[(setting, "protected")]
            print(
                f"| split, in-process, {args.mechanism} eps 1 | {model} | "
                f"{rate:.0f} | {rate / central:.3f} | - |"
            )
    print()
    print(
        f"Ratios are against the central run at {args.threads} torch thread(s). Each "
        "split step is a message round trip per party, with the top model's and the "
        "bottom models' backward passes and optimizer steps run separately: a "
        "fixed per-step cost that dominates small models (where the central step is "
        "itself mostly per-op overhead) and fades as compute grows."
    )


if __name__ == "__main__":
    main()
