"""Memory that does not grow with the rows: mapped views, the audit's sample, progress.

A Criteo/Avazu party view gathers each batch from the memory-mapped cache
instead of holding a copy of its table; the transcript audit scores a bounded
uniform sample of an epoch's batches; the label party logs its progress within
an epoch. Where no sampling is involved, results are those of the in-memory
path, bitwise.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from tpsl_flwr.attacks.report import BatchRecord, attack_report
from tpsl_flwr.attacks.reservoir import BatchReservoir
from tpsl_flwr.attacks.transcript_audit import TranscriptAudit
from tpsl_flwr.data import views as view_module
from tpsl_flwr.data.mapped import MappedColumns, column_stats
from tpsl_flwr.data.preprocess import standardize
from tpsl_flwr.data.spec import DataSpec
from tpsl_flwr.data.tabular import PartyFeatures
from tpsl_flwr.data.views import load_party_view
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run import run_experiment
from tpsl_flwr.parties import NonLabelParty
from tpsl_flwr.strategies.progress import EpochProgress
from tpsl_flwr.testing import write_criteo

# ---------------------------------------------------------------- mapped views


def test_mapped_columns_equal_standardize_bitwise():
    # Prepare: a raw table and a train/test split of its rows.
    rng = np.random.default_rng(0)
    table = rng.lognormal(size=(500, 4)).astype(np.float32)
    train, test = (
        np.arange(0, 500, 3),
        np.setdiff1d(np.arange(500), np.arange(0, 500, 3)),
    )

    # Execute
    want_train, want_test, want_mean, want_std = standardize(table[train], table[test])
    mean, std = column_stats(table, train)
    got_train = MappedColumns(table, train, np.float32, mean, std)
    got_test = MappedColumns(table, test, np.float32, mean, std)

    # Assert: same statistics and same rows, bit for bit, whole or gathered.
    assert mean.tobytes() == want_mean.tobytes() and std.tobytes() == want_std.tobytes()
    assert np.asarray(got_train).tobytes() == want_train.tobytes()
    assert np.asarray(got_test).tobytes() == want_test.tobytes()
    ids = np.array([7, 0, 41, 7])
    assert got_train[ids].tobytes() == want_train[ids].tobytes()


def test_column_stats_in_chunks_agree_with_one_pass():
    # Prepare
    rng = np.random.default_rng(1)
    table = (rng.standard_normal((10_001, 3)) * [1.0, 50.0, 1e-3] + 7).astype(
        np.float32
    )
    rows = np.arange(0, 10_001, 2)

    # Execute
    one_mean, one_std = column_stats(table, rows)
    mean, std = column_stats(table, rows, chunk_rows=777)

    # Assert: float64 sums in another order agree to ~1e-12 relative.
    np.testing.assert_allclose(mean, one_mean, rtol=1e-12)
    np.testing.assert_allclose(std, one_std, rtol=1e-10)


@pytest.fixture(scope="module")
def criteo_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("criteo") / "train.txt"
    write_criteo(path, 3000, seed=4, positive_rate=0.2)
    return path


def test_a_ctr_party_view_keeps_its_columns_mapped(criteo_file, tmp_path):
    # Execute
    spec = DataSpec("criteo", data_path=str(criteo_file))
    view = load_party_view(spec, ["I1", "I2", "C1", "C3"], cache_dir=tmp_path)

    # Assert: no copy of the table, the cache's compact codes underneath, and
    # the record ids are the map's rows (shared, not copied).
    for side, ids in ((view.train, view.train_ids), (view.test, view.test_ids)):
        assert isinstance(side.numeric, MappedColumns)
        assert isinstance(side.categorical, MappedColumns)
        assert isinstance(side.numeric.table, np.memmap)
        assert side.numeric.table.dtype == np.float32
        assert side.categorical.table.dtype == np.int32
        assert side.numeric.rows is ids and side.categorical.rows is ids
        assert len(side) == ids.size


def test_a_party_on_mapped_columns_trains_like_one_in_memory(criteo_file, tmp_path):
    # Prepare: the same view, mapped and materialized.
    spec = DataSpec("criteo", data_path=str(criteo_file))
    view = load_party_view(spec, ["I1", "I5", "C2", "C7"], cache_dir=tmp_path)
    mapped = (view.train.numeric, view.train.categorical)
    plain = (np.asarray(view.train.numeric), np.asarray(view.train.categorical))
    parties = []
    for features in (mapped, plain):
        torch.manual_seed(0)
        bottom = _Bottom(view.train.cardinalities)
        parties.append(NonLabelParty({"train": features}, bottom))

    # Execute: three steps with the same ids and gradients.
    rng = np.random.default_rng(0)
    outs: list[list[np.ndarray]] = [[], []]
    for _ in range(3):
        ids = rng.choice(len(view.train), size=64, replace=False)
        grad = rng.standard_normal((64, 4)).astype(np.float32)
        for out, party in zip(outs, parties, strict=True):
            out.append(party.embed(ids, keep_graph=True).numpy())
            party.apply_gradient(ids, grad)

    # Assert: bitwise the same embeddings at every step.
    for a, b in zip(*outs, strict=True):
        assert a.tobytes() == b.tobytes()


class _Bottom(nn.Module):
    def __init__(self, cards):
        super().__init__()
        self.emb = nn.ModuleList(nn.Embedding(c, 4) for c in cards)
        self.lin = nn.Linear(2, 4)

    def forward(self, numeric, categorical):
        out = self.lin(numeric)
        for j, emb in enumerate(self.emb):
            out = out + emb(categorical[:, j])
        return out


def _in_memory_view(original):
    """``_ctr_party_view`` with every column copied into memory (the old path)."""

    def build(*args):
        view = original(*args)

        def plain(side: PartyFeatures) -> PartyFeatures:
            return dataclasses.replace(
                side,
                numeric=np.asarray(side.numeric),
                categorical=np.asarray(side.categorical),
            )

        return dataclasses.replace(view, train=plain(view.train), test=plain(view.test))

    return build


def test_a_run_on_mapped_views_matches_in_memory_views(
    criteo_file, tmp_path, monkeypatch
):
    # Prepare: a seeded key, the audit on; its sample holds every row here.
    def run(name):
        view_module._party_view.cache_clear()
        cfg = ExperimentConfig(
            dataset="criteo", data_path=str(criteo_file), epochs=1, batch_size=256,
            noise_seed=0, audit=True, checkpoint=False, out_dir=str(tmp_path / name),
        )  # fmt: skip
        return run_experiment(cfg)

    # Execute
    mapped = run("mapped")
    monkeypatch.setattr(
        view_module, "_ctr_party_view", _in_memory_view(view_module._ctr_party_view)
    )
    plain = run("plain")
    view_module._party_view.cache_clear()

    # Assert: same AUC and the same attack numbers, from a complete sample.
    assert mapped["test_auc"] == plain["test_auc"]
    attacks = mapped["history"][0]["attack_auc"]
    assert attacks["sample"]["complete"] is True
    assert attacks["sample"]["scored_rows"] == attacks["sample"]["rows"]
    for name in ("norm", "cosine", "spectral", "sda"):
        assert attacks[name] == plain["history"][0]["attack_auc"][name]


# ------------------------------------------------------------ audit sample


def test_the_reservoir_keeps_every_batch_in_order_when_they_fit():
    # Execute
    r: BatchReservoir[int] = BatchReservoir(capacity_rows=1000)
    for step in range(9):
        slot = r.offer(100)
        assert slot is not None
        r.put(slot, step)

    # Assert
    assert r.complete and r.items() == list(range(9)) and r.slots == 10


def test_the_reservoir_is_bounded_and_uniform():
    # Prepare: 40 batches, 5 slots; each batch is kept with probability 1/8.
    trials, batches, kept = 4000, 40, np.zeros(40)

    # Execute
    for seed in range(trials):
        r: BatchReservoir[int] = BatchReservoir(capacity_rows=5 * 128, seed=seed)
        for step in range(batches):
            slot = r.offer(128)
            if slot is not None:
                r.put(slot, step)
        items = r.items()
        assert len(items) == 5 and items == sorted(items)
        kept[items] += 1

    # Assert: each inclusion rate within 5 binomial standard errors of 1/8
    # (trials = 4000: se = sqrt(p (1 - p) / 4000) = 0.0052).
    rate, p = kept / trials, 5 / batches
    se = np.sqrt(p * (1 - p) / trials)
    assert np.all(np.abs(rate - p) < 5 * se), rate


def _epoch(batches: int, size: int, seed: int = 0) -> list[BatchRecord]:
    """A leaky transcript: the gradient's sign and size follow the label."""
    rng = np.random.default_rng(seed)
    records = []
    for b in range(batches):
        y = rng.integers(0, 2, size=size)
        z = rng.standard_normal((size, 1))
        cand = np.stack([np.c_[z + 1, z], np.c_[z - 1, -z]], axis=1)  # (n, 2, 2)
        sent = np.where(rng.random(size) < 0.73, y, 1 - y)
        grad = cand[np.arange(size), sent] / size
        records.append(BatchRecord(np.arange(b * size, (b + 1) * size), grad, y, cand))
    return records


def test_an_audit_that_fits_scores_the_whole_transcript():
    # Prepare
    records = _epoch(12, 64)
    audit = TranscriptAudit([(0, 2)], capacity_rows=12 * 64)

    # Execute
    for record in records:
        assert audit.add_batch([record])
    report = audit.epoch_report(0.7311)

    # Assert: exactly the full-transcript report.
    full = attack_report(records, auc_bound=0.7311)
    for name in ("norm", "cosine", "spectral", "sda"):
        assert report[name] == full[name]
    assert report["sample"] == {
        "rows": 768, "batches": 12, "scored_rows": 768, "scored_batches": 12,
        "capacity_rows": 768, "complete": True,
    }  # fmt: skip


def test_a_sampled_audit_is_bounded_and_within_its_standard_error():
    # Prepare: 200 batches of 64 rows, a sample of 2,048 rows (32 batches).
    records = _epoch(200, 64, seed=3)
    audit = TranscriptAudit([(0, 2)], capacity_rows=2048, seed=1)

    # Execute
    for record in records:
        audit.add_batch([record])
    report = audit.epoch_report(0.7311)
    full = attack_report(records)

    # Assert: bounded, and the sampled SDA AUC within 4 of its standard errors
    # of the whole transcript's.
    assert report["sample"]["scored_rows"] == 2048
    assert report["sample"]["rows"] == 12_800 and not report["sample"]["complete"]
    se = report["standard_error"]["sda"]
    assert 0 < se < 0.02
    assert abs(report["sda"] - full["sda"]) < 4 * se


# --------------------------------------------------------------- progress


def test_progress_logs_every_few_seconds_and_not_at_the_end():
    # Prepare: a clock the test moves.
    now = [0.0]
    progress = EpochProgress(1, 3, 10_000, every_s=5.0, clock=lambda: now[0])

    # Execute
    lines = []
    for done, t in (
        (1000, 2.0),
        (2000, 5.0),
        (3000, 7.0),
        (6000, 10.0),
        (10_000, 20.0),
    ):
        now[0] = t
        lines.append(progress.update(done))

    # Assert: at 5 s and 10 s only; rate over the epoch so far and the time left.
    assert lines[0] is None and lines[2] is None and lines[4] is None
    assert lines[1] == "epoch 2/3  2,000/10,000 samples (20.0%)  400 samples/s  ETA 20s"
    assert lines[3] == "epoch 2/3  6,000/10,000 samples (60.0%)  600 samples/s  ETA 7s"


# ---------------------------------------------------------- evaluation chunks


def test_predict_and_embed_in_chunks_equal_one_pass(monkeypatch):
    # Prepare: a label party and a node, and 50 evaluation rows.
    from tpsl_flwr.models import TopModel
    from tpsl_flwr.parties import label_party, non_label_party
    from tpsl_flwr.parties.label_party import LabelParty
    from tpsl_flwr.privacy.keyed_noise import NoiseKey
    from tpsl_flwr.privacy.mechanisms import make_mechanism

    top = TopModel(6, (8,), num_outputs=1, generator=torch.Generator().manual_seed(0))
    labels = np.random.default_rng(0).integers(0, 2, 50)
    party = LabelParty(
        top, labels, make_mechanism("laplace", epsilon=1.0), NoiseKey.from_seed(0)
    )
    torch.manual_seed(0)
    node = NonLabelParty({"train": np.random.default_rng(1).normal(size=(50, 3))},
                         _NumericBottom())  # fmt: skip
    ids = np.arange(50)

    # Execute
    with torch.no_grad():
        emb = node.embed(ids)
        whole = party.predict(emb)
        monkeypatch.setattr(label_party, "PREDICT_CHUNK_ROWS", 7)
        monkeypatch.setattr(non_label_party, "EMBED_CHUNK_ROWS", 7)
        chunked_emb = node.embed(ids)
        chunked = party.predict(chunked_emb)

    # Assert: row-wise the same numbers (float32 rounding of other BLAS shapes).
    np.testing.assert_allclose(chunked_emb.numpy(), emb.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(chunked, whole, rtol=1e-6, atol=1e-7)
    assert chunked.shape == (50, 2)


class _NumericBottom(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 6)

    def forward(self, numeric, categorical):
        return self.lin(numeric)
