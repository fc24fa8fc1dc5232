"""The evaluation query in chunks: same metrics, gradients first, checkpoint last."""

import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord

from tpsl_flwr.engines.inprocess import InProcessGrid
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.experiment import build_strategy
from tpsl_flwr.experiments.run import run_inprocess_experiment
from tpsl_flwr.parties import label_party, non_label_party
from tpsl_flwr.simulations.client_app import app
from tpsl_flwr.strategies import evaluation_query
from tpsl_flwr.strategies.evaluation_query import query_chunks
from tpsl_flwr.strategies.exchange import exchange
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.batch_pack import id_batches

METRICS = ("test_auc", "test_logloss", "test_accuracy", "validation_loss")


def run(tmp_path, name, **overrides):
    """Breast cancer, 3 epochs, a seeded key; the results and the grid."""
    options = dict(
        dataset="breast-cancer",
        mechanism="laplace",
        epsilon=1.0,
        epochs=3,
        batch_size=64,
        validation_fraction=0.2,
        noise_seed=0,
        checkpoint=False,
        out_dir=str(tmp_path / name),
    )
    options.update(overrides)
    return run_inprocess_experiment(ExperimentConfig(**options), record_messages=True)


def queries(grid, partition):
    """A partition's query messages that ask for ids, in the order sent."""
    return [
        msg
        for msg in grid.sent_messages
        if grid.partition_of(msg.metadata.dst_node_id) == partition
        and msg.metadata.message_type == P.MSG_EMBED_TEST
        and len(id_batches(msg.content))
    ]


def rows_asked(msg):
    return sum(ids.size for ids in id_batches(msg.content))


def assert_same_metrics(a, b):
    assert a["best_epoch"] == b["best_epoch"]
    for one, other in zip(a["history"], b["history"], strict=True):
        for name in METRICS:
            assert one[name] == other[name], name  # bitwise


def test_query_chunks_cut_each_split_at_multiples_and_never_overfill():
    # Prepare
    ids = [np.arange(10, 23), np.arange(5)]

    # Execute
    chunks = query_chunks(ids, ["train", "test"], 7)

    # Assert: 18 ids in 3 chunks of <= 7, in order; each split cut at 7, 14...
    assert [[b.size for b in batches] for batches, _ in chunks] == [[7], [6], [5]]
    assert [names for _, names in chunks] == [["train"], ["train"], ["test"]]
    flat = np.concatenate([b for batches, _ in chunks for b in batches])
    np.testing.assert_array_equal(flat, np.concatenate(ids))
    assert query_chunks([], [], 7) == [([], [])]  # still one message
    whole = query_chunks(ids, ["train", "test"], 18)
    assert [len(batches) for batches, _ in whole] == [2]  # the single query


def test_the_default_chunk_is_a_multiple_of_the_nodes_embedding_blocks():
    assert evaluation_query.EVAL_CHUNK_ROWS % non_label_party.EMBED_CHUNK_ROWS == 0
    assert evaluation_query.EVAL_CHUNK_ROWS % label_party.PREDICT_CHUNK_ROWS == 0


def test_chunked_queries_give_the_single_query_metrics_bitwise(tmp_path, monkeypatch):
    # Prepare: the nodes embed in blocks of 7 rows, as a chunk of 7 asks them
    # to (by default: 65,536-row chunks, 8,192-row blocks); the default chunk
    # holds every evaluation id in one message.
    monkeypatch.setattr(non_label_party, "EMBED_CHUNK_ROWS", 7)
    whole, whole_grid = run(tmp_path, "whole")
    monkeypatch.setattr(evaluation_query, "EVAL_CHUNK_ROWS", 7)

    # Execute
    chunked, grid = run(tmp_path, "chunked")

    # Assert: the same metrics and best epoch; messages of <= 7 ids, as many
    # as the ids need, and the pending gradients only in each epoch's first.
    assert_same_metrics(whole, chunked)
    for partition in (0, 1):
        one = queries(whole_grid, partition)
        assert len(one) == 3  # one query an epoch
        sizes = [ids.size for ids in id_batches(one[0].content)]
        many = queries(grid, partition)
        per_epoch = sum(math.ceil(size / 7) for size in sizes)
        assert len(many) == 3 * per_epoch
        assert all(rows_asked(m) <= 7 for m in many)
        for i, msg in enumerate(many):
            grads = msg.content.array_records[P.GRADS]
            first = i % per_epoch == 0
            assert bool(len(grads)) == first
            assert (P.LR_SCALE in msg.content.config_records[P.CONFIG]) <= first


def test_unaligned_chunks_move_the_metrics_by_rounding_only(tmp_path, monkeypatch):
    # Prepare: chunks of 7 against the nodes' default blocks (one per split).
    whole, _ = run(tmp_path, "whole", epochs=2)
    monkeypatch.setattr(evaluation_query, "EVAL_CHUNK_ROWS", 7)

    # Execute
    chunked, _ = run(tmp_path, "chunked", epochs=2)

    # Assert: float32 rounding of the bottom models' forwards only.
    assert whole["best_epoch"] == chunked["best_epoch"]
    for one, other in zip(whole["history"], chunked["history"], strict=True):
        for name in METRICS:
            assert one[name] == pytest.approx(other[name], rel=1e-6), name


def test_the_top_model_blocks_do_not_depend_on_the_chunks(tmp_path, monkeypatch):
    # Prepare: blocks of 5 rows, so chunks of 7 cut across them.
    monkeypatch.setattr(non_label_party, "EMBED_CHUNK_ROWS", 7)
    for module in (evaluation_query, label_party):
        monkeypatch.setattr(module, "PREDICT_CHUNK_ROWS", 5)
    whole, _ = run(tmp_path, "whole", epochs=2)
    monkeypatch.setattr(evaluation_query, "EVAL_CHUNK_ROWS", 7)

    # Execute
    chunked, _ = run(tmp_path, "chunked", epochs=2)

    # Assert
    assert_same_metrics(whole, chunked)


def test_the_checkpoint_goes_with_the_last_chunk_only(tmp_path, monkeypatch):
    # Prepare: no validation, so the query itself carries the checkpoint.
    monkeypatch.setattr(non_label_party, "EMBED_CHUNK_ROWS", 7)
    common = dict(validation_fraction=0.0, checkpoint=True, epochs=2)
    whole, _ = run(tmp_path, "whole", **common)
    monkeypatch.setattr(evaluation_query, "EVAL_CHUNK_ROWS", 7)

    # Execute
    chunked, grid = run(tmp_path, "chunked", **common)

    # Assert: every epoch's last query, and only it, checkpoints that epoch.
    for name in METRICS[:3]:
        assert [h[name] for h in whole["history"]] == [
            h[name] for h in chunked["history"]
        ]
    for partition in (0, 1):
        many = queries(grid, partition)
        per_epoch = len(many) // 2
        assert per_epoch > 1
        marks = [
            m.content.config_records[P.CONFIG].get(P.CHECKPOINT_EPOCH) for m in many
        ]
        want = [None] * (per_epoch - 1) + [0] + [None] * (per_epoch - 1) + [1]
        assert marks == want


@pytest.mark.parametrize("rows", [1, 3])
def test_query_chunks_keep_every_id_once(rows):
    ids = [np.arange(4), np.arange(2)]
    chunks = query_chunks(ids, ["train", "test"], rows)
    assert all(sum(b.size for b in batches) <= rows for batches, _ in chunks)
    assert sum(b.size for batches, _ in chunks for b in batches) == 6


def test_configure_and_aggregate_evaluate_still_query_in_one_message(
    tmp_path, monkeypatch
):
    # Prepare: a trained strategy, its nodes still up.
    monkeypatch.setattr(non_label_party, "EMBED_CHUNK_ROWS", 7)
    cfg = ExperimentConfig(
        dataset="breast-cancer", epochs=1, batch_size=64, validation_fraction=0.2,
        noise_seed=0, checkpoint=False, out_dir=str(tmp_path),
    )  # fmt: skip
    strategy, _ = build_strategy(cfg)
    grid = InProcessGrid(app, cfg.num_parties, run_config=cfg.to_run_config())

    def server(g, _ctx):
        strategy.start(grid=g, timeout=10)
        sent = list(strategy.configure_evaluate(9, ArrayRecord(), ConfigRecord(), g))
        replies = exchange(g, sent, 10, strategy.poll_interval)
        direct = strategy.aggregate_evaluate(9, replies)
        monkeypatch.setattr(evaluation_query, "EVAL_CHUNK_ROWS", 7)
        loop = strategy.loop
        chunked = loop.query.run(loop.state, g, strategy.nodes, 9, {}, 10)
        return sent, direct, chunked

    # Execute
    sent, direct, chunked = grid.run_server(server)

    # Assert: one message a node with both splits; the chunked metrics equal.
    assert len(sent) == 2
    assert all(len(id_batches(m.content)) == 2 for m in sent)
    assert set(direct) == set(METRICS)
    assert dict(direct) == dict(chunked)
