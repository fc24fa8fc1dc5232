"""The label party in one call: TPSLStrategy.for_labels (issue #36, item 1).

An embedded 3-party app's label party is built in one call and run in
process; every inconsistent statement is refused before the first step,
naming the argument and its value, with nothing written; a resume needs its
store and says where it resumes.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tpsl_flwr import (
    ConfigError,
    NoiseKey,
    NonLabelParty,
    PrivacyError,
    ProtocolError,
    TPSLStrategy,
    adam,
    make_client_app,
)
from tpsl_flwr.release.ledger import PrivacyLedger
from tpsl_flwr.testing import run_strategy

TRAIN, TEST, COLS = 48, 16, 2
WIDTHS = (3, 2, 4)  # three nodes, each its own embedding width
RNG = np.random.default_rng(0)
X = RNG.normal(size=(TRAIN + TEST, COLS * len(WIDTHS))).astype(np.float32)
Y = (X[:, 0] + X[:, 2] > 0).astype(np.int64)
RECORD_IDS = RNG.permutation(1000)[: TRAIN + TEST]  # stable ids, any order
ROOT = Path(__file__).resolve().parents[2]


class Bottom(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.layer = nn.Linear(COLS, width)

    def forward(self, numeric, categorical):
        return self.layer(numeric)


def node_party(context):
    """A non-label party: its own columns of both splits, its own bottom model."""
    part = int(context.node_config["partition-id"])
    cols = slice(COLS * part, COLS * (part + 1))
    torch.manual_seed(part)
    features = {"train": (X[:TRAIN, cols], None), "test": (X[TRAIN:, cols], None)}
    return NonLabelParty(features, Bottom(WIDTHS[part]), adam(0.01))


def one_call(tmp_path, **stated):
    """The label party, built as an embedder's ServerApp builds it."""
    torch.manual_seed(0)
    settings = {
        "train_labels": Y[:TRAIN],
        "test_labels": Y[TRAIN:],
        "record_ids": RECORD_IDS,
        "mechanism": "laplace",
        "epsilon": 1.0,
        "epochs": 2,
        "batch_size": 16,
        "num_nodes": 3,
        "node_wait": 1.0,
        "label_dir": tmp_path / "label-party",
        "ledger": PrivacyLedger(tmp_path / "ledger"),
    }
    settings.update(stated)
    top = nn.Sequential(nn.Linear(sum(WIDTHS), 8), nn.ReLU(), nn.Linear(8, 1))
    return TPSLStrategy.for_labels(top, **settings)


def client_app(tmp_path):
    return make_client_app(node_party, checkpoint_dir=tmp_path / "nodes")


def test_an_embedded_three_party_app_is_built_in_one_call_and_runs(tmp_path):
    # Prepare
    strategy = one_call(tmp_path)
    # Execute
    report = run_strategy(strategy, client_app(tmp_path), num_nodes=3)
    # Assert: trained, spent its epsilon, recorded as a release before a step
    assert report.epsilon_spent == 1.0
    assert len(report.history) == 2
    assert "test_auc" in report.history[-1]
    assert sorted(report.dispatched) == [0, 1, 2]
    widths = [report.dispatched[p][0].gradient.shape[1] for p in range(3)]
    assert widths == list(WIDTHS)
    release = strategy.release
    assert release is not None and release.kind == "release"
    assert release.ledger is not None and release.ledger.total.epsilon == 1.0
    assert strategy.store is not None  # checkpoints every epoch, can resume
    assert sorted(p.name for p in (tmp_path / "label-party").iterdir()) == [
        "checkpoint.pt",
        "noise-key.json",
    ]
    assert sorted(p.name for p in (tmp_path / "nodes").iterdir()) == [
        f"party-{i}{kind}.pt" for i in range(3) for kind in (".previous", "")
    ]


def test_the_defaults_are_the_ones_simulate_resolves(tmp_path):
    strategy = one_call(tmp_path, batch_size=0, epochs=3)
    # batch 32 for 48 rows (resolve_training), cosine, no hold-out, posterior;
    # Laplace labels on 48 rows: the 2-epoch rate 1e-2 times 2 / 3 epochs
    assert strategy.batch_size == 32
    assert strategy.lr_schedule == "cosine"
    assert strategy.validation.fraction == 0.0
    assert strategy.party.denoise == "posterior"
    group = strategy.party.optimizer.param_groups[0]
    assert (group["lr"], group["weight_decay"]) == (0.00667, 0.3)


def test_auto_averages_unless_the_budget_leaves_the_model_still_learning(tmp_path):
    # 48 rows of Laplace labels, 8 epochs: the epoch budget's rate leaves the
    # model still learning (2 steps an epoch): no tail average, as simulate
    budgeted = one_call(tmp_path / "a", batch_size=0, epochs=8)
    assert budgeted.average_from is None
    # An optimizer of the embedder's own: no budget applies, the average stays
    own = one_call(
        tmp_path / "b",
        batch_size=0,
        epochs=8,
        optimizer=lambda params: torch.optim.Adam(params, lr=1e-3),
    )
    assert own.average_from == 1


def test_a_seeded_noise_key_is_reproducible(tmp_path):
    first = one_call(tmp_path / "a", noise_key=NoiseKey.from_seed(3))
    again = one_call(tmp_path / "b", noise_key=NoiseKey.from_seed(3), new_release=True)
    assert first.party.key == again.party.key
    assert not first.party.key.secure


def test_the_testing_guide_example_runs_with_run_and_node_configs(tmp_path):
    # Prepare: nodes that read their run config and their own node config
    seen = []

    def configured_party(context):
        seen.append((context.run_config["table"], context.node_config["shard"]))
        return node_party(context)

    strategy = one_call(
        tmp_path, noise_key=NoiseKey.from_seed(0), rehearsal=True, epochs=1
    )
    # Execute
    report = run_strategy(
        strategy,
        make_client_app(configured_party, checkpoint_dir=tmp_path / "nodes"),
        num_nodes=3,
        run_config={"table": "mine-v1"},
        node_configs=[{"shard": "eu"}, {"shard": "us"}, {"shard": "ap"}],
    )
    # Assert: every node saw both; the run was a rehearsal under a seeded key
    assert set(seen) == {("mine-v1", "eu"), ("mine-v1", "us"), ("mine-v1", "ap")}
    assert strategy.release is not None and strategy.release.kind == "rehearsal"
    assert report.epsilon_spent == 1.0 and not strategy.party.key.secure


LABELS_OUT = np.where(Y[:TRAIN] == 1, 2, 0)
REFUSED = [
    ({"mechanism": "gaussian"}, "mechanism 'gaussian' takes sigma, not epsilon"),
    ({"mechanism": "none"}, "mechanism 'none' takes no epsilon (got epsilon=1.0)"),
    ({"sigma": 2.0}, "mechanism 'laplace' takes epsilon, not sigma"),
    ({"mechanism": "lapalce"}, "lapalce"),
    ({"epsilon": 0.0}, "epsilon must be > 0 and finite, got 0.0"),
    ({"train_labels": LABELS_OUT}, "train_labels: labels must lie in [0, 2), got 2"),
    ({"test_labels": Y[TRAIN:] + 1}, "test_labels: labels must lie in [0, 2)"),
    ({"record_ids": RECORD_IDS[:-1]}, "record_ids must hold one id per label"),
    ({"record_ids": np.zeros(TRAIN + TEST, int)}, "record_ids must be distinct"),
    ({"record_ids": RECORD_IDS * 1.0}, "record_ids must be a 1-D integer array"),
    ({"num_classes": 1}, "classes must be an integer >= 2, got 1"),
    ({"placement": "middle"}, "unknown placement 'middle'"),
    ({"epochs": 0}, "epochs must be an integer >= 1, got 0"),
    ({"batch_size": -1}, "batch_size must be an integer >= 0, got -1"),
    ({"lr": -0.1}, "lr must be >= 0 (0: auto) and finite, got -0.1"),
    ({"weight_decay": float("nan")}, "weight_decay must be >= 0 and finite, got nan"),
    ({"lr": 0.1, "optimizer": adam(0.1)}, "lr stated beside it (lr=0.1)"),
    ({"lr_schedule": "linear"}, "lr schedule must be one of constant, cosine"),
    ({"validation_fraction": 0.7}, "validation-fraction must be 'auto' or in"),
    (
        {"mechanism": "gaussian", "epsilon": None, "validation_fraction": 0.1},
        "validation scores noisy labels, but mechanism 'gaussian'",
    ),
    (
        {"mechanism": "gaussian", "epsilon": None, "denoise": "posterior"},
        "denoise = 'posterior' needs a mechanism that releases noisy labels",
    ),
    ({"denoise": "maybe"}, "denoise must be one of auto, none, posterior"),
    ({"denoise_prior": "uniform"}, "denoise_prior must be one of model, frequency"),
    ({"steps_per_message": 0}, "steps_per_message must be an integer >= 1, got 0"),
    ({"pipeline_depth": -1}, "pipeline_depth must be an integer >= 0, got -1"),
    ({"wire_dtype": "bfloat16"}, "got 'bfloat16'"),
    ({"num_nodes": 0}, "num_nodes must be an integer >= 1, got 0"),
    ({"order_seed": -1}, "order_seed must be an integer >= 0, got -1"),
    ({"id_space": {"epsilon": 4}}, "id_space may not name 'epsilon'"),
    ({"id_space": {"table": [1]}}, "id_space['table'] must be text"),
    ({"resume": "yes"}, "resume must be True or False, got 'yes'"),
    ({"resume": True, "new_release": True}, "new_release is for a fresh release"),
    ({"resume": True, "budget": 3.0}, "budget is for a fresh release"),
    (
        {"resume": True, "noise_key": NoiseKey.from_seed(0)},
        "noise_key is for a fresh release",
    ),
    ({"budget": 0.0}, "budget must be > 0 and finite, got 0.0"),
    ({"noise_key": 7}, "noise_key must be a NoiseKey, got 7"),
    ({"unprotected_release": True}, "unprotected_release=True is for mechanism"),
    ({"label_dir": ""}, "label_dir must be a folder path, got ''"),
    ({"node_wait": 0}, "node_wait must be > 0 and finite, got 0"),
]


@pytest.mark.parametrize(("stated", "named"), REFUSED)
def test_an_inconsistent_setting_is_refused_naming_it_with_nothing_written(
    tmp_path, stated, named
):
    # Execute
    with pytest.raises(ConfigError) as err:
        one_call(tmp_path, **stated)
    # Assert: one line, named; no key, no ledger line, no folder
    message = str(err.value)
    assert named in message and "\n" not in message, message
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_top_model_that_is_not_a_module_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"top must be a torch nn\.Module, got dict"):
        TPSLStrategy.for_labels(
            {}, train_labels=Y, record_ids=RECORD_IDS, label_dir=tmp_path / "lp"
        )


def test_a_node_without_checkpoint_dir_is_refused_before_the_first_step(tmp_path):
    strategy = one_call(tmp_path)
    with pytest.raises(ProtocolError, match="save a checkpoint after every epoch"):
        run_strategy(strategy, make_client_app(node_party), num_nodes=3)
    assert strategy.party.steps == 0
    assert not strategy.released_gradients


def test_a_resumed_release_without_its_store_is_refused(tmp_path):
    # Prepare: a finished first run, then its release resumed
    run_strategy(one_call(tmp_path, epochs=1), client_app(tmp_path), num_nodes=3)
    resumed = one_call(tmp_path, epochs=2, resume=True)
    assert resumed.release is not None and resumed.release.resumed
    # Execute / Assert: the same release and party, but no store
    with pytest.raises(ConfigError, match="resumes a run: pass the store"):
        TPSLStrategy(resumed.party, epochs=2, num_nodes=3, release=resumed.release)


def test_a_resume_logs_where_it_resumes_and_trains_only_what_is_left(tmp_path, caplog):
    # Prepare: one epoch of two
    first = one_call(tmp_path, epochs=1)
    run_strategy(first, client_app(tmp_path), num_nodes=3)
    # Execute
    with caplog.at_level(logging.INFO, logger="flwr"):
        resumed = one_call(tmp_path, epochs=2, resume=True)
    report = run_strategy(resumed, client_app(tmp_path), num_nodes=3)
    # Assert
    assert "resuming after epoch 1 of 2" in caplog.text
    assert resumed.party.key == first.party.key
    assert [h["epoch"] for h in report.history] == [1, 2]
    assert report.history[0] == first.history[0]
    assert {step.epoch for step in report.computed} == {1}


def test_a_resume_with_a_changed_setting_is_refused_naming_it(tmp_path):
    run_strategy(one_call(tmp_path, epochs=1), client_app(tmp_path), num_nodes=3)
    with pytest.raises(PrivacyError, match=r"epsilon \(1.0 -> 2.0\)"):
        one_call(tmp_path, epochs=2, resume=True, epsilon=2.0)


def test_a_second_release_of_the_same_labels_needs_new_release(tmp_path):
    one_call(tmp_path / "a", ledger=PrivacyLedger(tmp_path / "ledger"))
    with pytest.raises(PrivacyError, match=r"Acknowledge it: --new-release"):
        one_call(tmp_path / "b", ledger=PrivacyLedger(tmp_path / "ledger"))
    again = one_call(
        tmp_path / "b", ledger=PrivacyLedger(tmp_path / "ledger"), new_release=True
    )
    assert again.release is not None and again.release.ledger is not None
    assert again.release.ledger.total.epsilon == 2.0


def tpsl_modules(paths: list[Path]) -> set[str]:
    """The tpsl_flwr modules the files import from."""
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.split(".")[0] == "tpsl_flwr":
                    found.add(node.module)
    return found


@pytest.mark.parametrize(
    "package",
    ["binary_tabular", "multiclass_tabular", "three_party_categorical"],
)
def test_an_example_server_side_imports_from_at_most_two_tpsl_modules(package):
    folder = next((ROOT / "examples").glob(f"*/{package}"))
    server_side = [folder / "server_app.py", folder / "task.py"]
    modules = tpsl_modules(server_side)
    assert "tpsl_flwr" in modules
    assert len(modules) <= 2, modules


# ------------------------------------------------------------- the client side
@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"factory": "node_party"}, "factory must be a function (context) ->"),
        ({"checkpoint_dir": ""}, "checkpoint_dir must be a folder, a function"),
        ({"checkpoint_dir": 3}, "got 3"),
        ({"mods": "record"}, "mods must be a list of Flower mods, got 'record'"),
    ],
)
def test_make_client_app_refuses_a_bad_argument_at_once(arguments, named):
    stated = {"factory": node_party, **arguments}
    factory = stated.pop("factory")
    with pytest.raises(ConfigError) as err:
        make_client_app(factory, **stated)
    assert named in str(err.value)
