"""End-to-end TPSL on the in-process engine: training, transcript, faults, resume."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tpsl_flwr.engines.inprocess import InProcessGrid
from tpsl_flwr.errors import ConfigError, ProtocolError
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.experiment import build_strategy
from tpsl_flwr.experiments.run import run_inprocess_experiment
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.noisy_labels import draw_noisy_labels
from tpsl_flwr.privacy.perturb import candidate_gradients
from tpsl_flwr.simulations.client_app import app as client_app
from tpsl_flwr.simulations.client_app import builtin_party
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.batch_pack import gradient_batches, id_batches
from tpsl_flwr.wire.node_side import make_client_app


def test_breast_cancer_trains_to_high_auc_without_protection(tmp_path):
    cfg = ExperimentConfig(
        dataset="breast-cancer",
        mechanism="none",
        epochs=5,
        noise_seed=0,
        out_dir=str(tmp_path),
    )
    results, _ = run_inprocess_experiment(cfg)
    assert results["test_auc"] >= 0.97
    assert results["epsilon_spent"] == "inf"
    assert len(results["history"]) == 5
    assert (tmp_path / "results.json").exists()


def test_digits_trains_ten_classes_with_multiclass_discrete(tmp_path):
    cfg = ExperimentConfig(
        dataset="digits",
        mechanism="discrete",
        epsilon=4.0,
        epochs=3,
        noise_seed=0,
        out_dir=str(tmp_path),
        num_parties=3,
    )
    results, _ = run_inprocess_experiment(cfg)
    assert results["num_classes"] == 10
    assert results["epsilon_spent"] == 4.0
    # k-RR at eps=4 keeps 86% of labels: far above chance (0.1) after 3 epochs.
    assert results["test_accuracy"] > 0.5
    assert "test_auc" not in results


def test_transcript_holds_only_ids_perturbed_gradients_and_public_config(tmp_path):
    # Prepare: capture, at every step, the top model and inputs the label party used.
    cfg = ExperimentConfig(
        dataset="breast-cancer",
        mechanism="laplace",
        epsilon=1.0,
        epochs=2,
        batch_size=128,
        noise_seed=7,
        out_dir=str(tmp_path),
        denoise="none",  # the paper's GradPerturb, recomputed below
    )
    strategy, _ = build_strategy(cfg)
    party = strategy.party
    steps = []
    original = party.train_step

    def spy(ids, emb, epoch=0):
        top_before = {k: v.clone() for k, v in party.top.state_dict().items()}
        grad = original(ids, emb, epoch)
        steps.append((np.asarray(ids).copy(), emb.clone(), top_before, grad.clone()))
        return grad

    party.train_step = spy
    grid = InProcessGrid(
        client_app, 2, run_config=cfg.to_run_config(), record_messages=True
    )
    # Execute
    grid.run_server(lambda g, _c: strategy.start(grid=g))
    # Assert 1: nothing but ids, gradients and public config left the label party.
    dispatched = {}
    for msg in grid.sent_messages:
        content = msg.content
        assert not content.metric_records
        for name, record in content.config_records.items():
            assert name == P.CONFIG
            assert set(record) <= P.ALLOWED_CONFIG_KEYS
        for name, record in content.array_records.items():
            assert name in P.ALLOWED_ARRAY_KEYS
            assert set(record) <= P.ALLOWED_ARRAY_KEYS[name]
        for ids, grad in gradient_batches(content):
            dispatched.setdefault(ids.tobytes(), []).append(
                (msg.metadata.dst_node_id, grad)
            )
    # Assert 2: each dispatched gradient is GradPerturb's output for those ids
    # under this key: sum_j c_j g_j, recomputed from the top model of that step.
    # (The run's key is derived from seed 7, the binding and the labels.)
    key = party.key
    assert not key.secure and key != NoiseKey.from_seed(7)
    widths = {n.node_id: (n.offset, n.width) for n in strategy.nodes}
    twin = build_strategy(cfg)[0].party.top
    checked = 0
    for ids, emb, top_before, _grad in steps:
        twin.load_state_dict(top_before)
        noisy = draw_noisy_labels(party.mechanism, party.labels[ids], ids, key)
        g = candidate_gradients(twin, emb).numpy()
        expected = np.einsum("nk,nkd->nd", noisy.coefficients, g) / ids.size
        for node_id, piece in dispatched.get(ids.tobytes(), []):
            off, width = widths[node_id]
            np.testing.assert_allclose(
                piece, expected[:, off : off + width], rtol=1e-4, atol=1e-7
            )
            checked += 1
    assert checked == 2 * len(steps)


def test_a_node_error_stops_the_run_naming_the_node(tmp_path):
    def flaky(context):
        if int(context.node_config["partition-id"]) == 1:
            raise RuntimeError("disk on fire")
        return builtin_party(context)

    cfg = ExperimentConfig(
        dataset="breast-cancer", epochs=1, noise_seed=0, out_dir=str(tmp_path)
    )
    with pytest.raises(ProtocolError, match=r"partition 1|node \d+"):
        run_inprocess_experiment(cfg, client_app=make_client_app(flaky))


def test_resume_continues_after_the_last_checkpoint_with_the_same_key(tmp_path):
    cfg = ExperimentConfig(
        dataset="breast-cancer",
        mechanism="laplace",
        epochs=2,
        batch_size=64,
        out_dir=str(tmp_path),
        lr_schedule="constant",  # a cosine schedule spans the configured epochs
        validation_fraction=0.0,  # every training id trained on
    )
    first, _ = run_inprocess_experiment(cfg)
    resumed = dict(
        dataset="breast-cancer",
        mechanism="laplace",
        epochs=3,
        batch_size=64,
        out_dir=str(tmp_path),
        resume=True,
        lr_schedule="constant",
        validation_fraction=0.0,
    )
    # lr = auto resolves another rate over 3 epochs than over 2: the optimizer
    # would go on at the stopped rate while results.json reported the new one.
    stopped_lr = first["training"]["lr"]
    with pytest.raises(ConfigError) as refused:
        run_inprocess_experiment(ExperimentConfig(**resumed))
    assert f"trained with lr = {stopped_lr!r} and this one resolves lr = " in str(
        refused.value
    )
    assert f"resume with lr = {stopped_lr!r} (they resolve" in str(refused.value)
    resumed_cfg = ExperimentConfig(**resumed, lr=stopped_lr)
    second, grid = run_inprocess_experiment(resumed_cfg, record_messages=True)
    assert second["training"]["lr"] == stopped_lr
    assert [h["epoch"] for h in second["history"]] == [1, 2, 3]
    assert second["history"][:2] == first["history"]
    # The OS key of the first run was restored from the label party's checkpoint.
    assert second["noise_key"]["fingerprint"] == first["noise_key"]["fingerprint"]
    # Only epoch 3 was trained: ceil(n_train / 64) batches, to each of 2 nodes.
    trained = sum(
        len(id_batches(m.content))
        for m in grid.sent_messages
        if m.metadata.message_type == P.MSG_TRAIN
    )
    assert trained == 2 * -(-second["train_rows"] // 64)
    checkpoint = tmp_path / "label-party" / "checkpoint.pt"
    assert torch.load(checkpoint, weights_only=True)["epoch"] == 2


def _files(*folders):
    """Every file under ``folders``, by path: its bytes."""
    return {
        path: path.read_bytes()
        for folder in folders
        for path in sorted(Path(folder).rglob("*"))
        if path.is_file()
    }


def test_a_refused_resume_writes_nothing_and_the_rate_it_names_resumes(tmp_path):
    # Prepare: 2 epochs under a fresh draw each epoch (the release count grows
    # with the epochs), checkpointed; then a resume to 3 epochs, lr = auto.
    from tpsl_flwr.experiments.run import run_experiment
    from tpsl_flwr.release.ledger import default_ledger_dir

    common = dict(
        dataset="breast-cancer",
        mechanism="laplace",
        batch_size=64,
        out_dir=str(tmp_path / "run"),
        lr_schedule="constant",
        validation_fraction=0.0,
        reuse_noise=False,
        checkpoint=True,
    )
    first = run_experiment(ExperimentConfig(epochs=2, **common), "local")
    before = _files(tmp_path / "run", default_ledger_dir())
    # Act: auto resolves another rate over 3 epochs than the stopped run's.
    with pytest.raises(ConfigError, match=r"^cannot resume: ") as refused:
        run_experiment(ExperimentConfig(epochs=3, resume=True, **common), "local")
    # Assert: refused before anything was written: no ledger entry for a run
    # that never trained, results.json, the key and the decisions as they were.
    assert _files(tmp_path / "run", default_ledger_dir()) == before
    stopped_lr = first["training"]["lr"]
    assert f"resume with lr = {stopped_lr!r} (they resolve" in str(refused.value)
    # The exact rate the message names resumes (no rounding in the message).
    again = run_experiment(
        ExperimentConfig(epochs=3, resume=True, lr=stopped_lr, **common), "local"
    )
    assert [h["epoch"] for h in again["history"]] == [1, 2, 3]
    assert again["training"]["lr"] == stopped_lr


def test_a_team_embeds_the_strategy_in_its_own_server_app_and_client_app():
    # Prepare: the team's own data, top model, bottom models and ServerApp,
    # as in the README's "Embedding the strategy" example.
    from flwr.serverapp import ServerApp
    from torch import nn

    from tpsl_flwr import make_mechanism
    from tpsl_flwr.parties import LabelParty, NonLabelParty, adam
    from tpsl_flwr.strategies import TPSLStrategy

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 3] > 0).astype(np.int64)
    train, test = slice(0, 240), slice(240, 300)

    class OwnBottom(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(3, 4)

        def forward(self, numeric, categorical):
            return torch.relu(self.layer(numeric))

    def own_party(context):
        part = int(context.node_config["partition-id"])
        cols = slice(3 * part, 3 * part + 3)
        empty = np.zeros((300, 0), dtype=np.int64)
        torch.manual_seed(part)
        return NonLabelParty(
            {
                "train": (x[train, cols], empty[train]),
                "test": (x[test, cols], empty[test]),
            },
            OwnBottom(),
            adam(0.05),
        )

    server = ServerApp()
    outcome = {}

    @server.main()
    def main(grid, context):
        torch.manual_seed(0)
        party = LabelParty(
            nn.Sequential(nn.Linear(8, 1)),
            y[train],
            make_mechanism("laplace", epsilon=2.0),
            NoiseKey.from_os(),
            optimizer=adam(0.05),
        )
        strategy = TPSLStrategy(
            party, test_labels=y[test], batch_size=32, epochs=4, num_nodes=2
        )
        outcome["result"] = strategy.start(grid=grid)

    # Execute
    grid = InProcessGrid(make_client_app(own_party), 2)
    grid.run_server(server)
    # Assert: a Flower Result with per-epoch test metrics computed at the label party.
    result = outcome["result"]
    assert sorted(result.evaluate_metrics_serverapp) == [1, 2, 3, 4]
    assert result.evaluate_metrics_serverapp[4]["test_auc"] > 0.8
    assert result.train_metrics_clientapp[4]["samples"] == 240
    assert "0.weight" in result.arrays


def test_simulate_cli_writes_one_results_object(tmp_path, capsys):
    from tpsl_flwr.cli.main import main

    code = main(
        [
            "simulate",
            "--dataset",
            "breast-cancer",
            "--epochs",
            "1",
            "--mechanism",
            "discrete",
            "--epsilon",
            "2",
            "--noise-seed",
            "3",
            "--out-dir",
            str(tmp_path),
            "--json",
            "-",
        ]
    )
    record = json.loads(capsys.readouterr().out)
    assert code == 0
    for key in (
        "test_auc",
        "epsilon_spent",
        "mechanism",
        "epochs",
        "samples_per_second",
        "history",
    ):
        assert key in record
    assert record["epsilon_spent"] == 2.0 and record["engine"] == "local"
    assert record["noise_key"]["secure"] is False
    assert (
        json.loads((tmp_path / "results.json").read_text())["mechanism"] == "discrete"
    )


def test_simulate_cli_rejects_bad_values_in_one_line(capsys):
    from tpsl_flwr.cli.main import main

    assert main(["simulate", "--placement", "cut", "--epsilon", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "tpsl-flwr simulate: error: epsilon must be > 0 and finite, got -1.0"


def test_a_run_killed_mid_epoch_resumes_exactly_where_it_left(tmp_path):
    # Prepare: a reference run, uninterrupted, and a run whose node dies in epoch 3.
    settings = {
        "dataset": "breast-cancer",
        "mechanism": "laplace",
        "epochs": 3,
        "batch_size": 64,
        "noise_seed": 5,
    }
    reference, _ = run_inprocess_experiment(
        ExperimentConfig(out_dir=str(tmp_path / "ref"), **settings)
    )
    calls = {"n": 0}

    def dies_in_epoch_3(message, context):
        calls["n"] += 1  # 2 nodes x (hello + 2 epochs x (8 steps + 1 query)) = 38
        if calls["n"] > 38 + 6:
            raise RuntimeError("killed")
        return client_app(message, context)

    crashed = ExperimentConfig(out_dir=str(tmp_path / "run"), **settings)
    with pytest.raises(ProtocolError, match="killed"):
        run_inprocess_experiment(crashed, client_app=dies_in_epoch_3)
    # Execute: resume with healthy nodes.
    resumed, _ = run_inprocess_experiment(
        ExperimentConfig(out_dir=str(tmp_path / "run"), resume=True, **settings)
    )
    # Assert: identical to never having crashed (nothing lost, nothing twice).
    for got, want in zip(resumed["history"], reference["history"], strict=True):
        assert got["test_auc"] == want["test_auc"]
        assert got["test_logloss"] == want["test_logloss"]
        assert got["steps"] == want["steps"]


def test_rows_missing_from_a_partition_stop_the_run_naming_node_and_count(tmp_path):
    def short_partition(context):
        party = builtin_party(context)
        if int(context.node_config["partition-id"]) == 1:
            num, cat = party.features["train"]
            party.features["train"] = (num[:100], cat[:100])
        return party

    cfg = ExperimentConfig(
        dataset="breast-cancer", epochs=1, noise_seed=0, out_dir=str(tmp_path)
    )
    with pytest.raises(
        ProtocolError,
        match=r"partition 1\) holds 100 train samples.*train partition is "
        r"\d+ rows short.*cannot tell which records are missing",
    ):
        app = make_client_app(short_partition, checkpoint_dir=tmp_path / "nodes")
        run_inprocess_experiment(cfg, client_app=app)


def test_the_flower_app_config_and_the_python_defaults_agree():
    from pathlib import Path

    from tpsl_flwr.experiments.ray_run import app_config

    app = app_config(Path(__file__).parents[2])
    # `flwr run .` is the main job: more rows (synthetic-ctr's default 20000
    # cannot reach AUC 0.70 at eps 1) and 4 steps per Ray round trip.
    app_only = {"rows": 100000, "steps-per-message": 4}
    assert app == {**ExperimentConfig().to_run_config(), **app_only}
