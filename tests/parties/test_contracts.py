"""Contracts checked at the edge: each fails on the first call, in one line.

Every message names the argument (or node) and what was expected; none of
these faults may surface deep inside a round.
"""

import numpy as np
import pytest
import torch
from torch import nn

from tests.conftest import ToyBottom
from tpsl_flwr import ConfigError, NoiseKey, ProtocolError, make_mechanism
from tpsl_flwr.models import TopModel
from tpsl_flwr.parties import LabelParty, NonLabelParty, adam
from tpsl_flwr.privacy.accounting import privacy_spent
from tpsl_flwr.release.store import LabelRecords, LabelStore, NoiseBinding
from tpsl_flwr.strategies import TPSLStrategy
from tpsl_flwr.testing import run_strategy
from tpsl_flwr.wire.node_side import make_client_app

ROWS, TEST_ROWS, COLS, WIDTH = 16, 8, 2, 3
X = np.random.default_rng(0).normal(size=(ROWS + TEST_ROWS, 2 * COLS))
X = X.astype(np.float32)
Y = (X[:, 0] > 0).astype(np.int64)


def node(train_rows=ROWS, test_rows=TEST_ROWS, only=None):
    """A node factory; ``only`` limits the odd sizes to that partition."""

    def factory(context):
        part = int(context.node_config["partition-id"])
        cols = slice(COLS * part, COLS * part + COLS)
        odd = only is None or part == only
        n_train = train_rows if odd else ROWS
        n_test = test_rows if odd else TEST_ROWS
        features = {"train": (X[:n_train, cols], None)}
        if n_test:
            features["test"] = (X[ROWS : ROWS + n_test, cols], None)
        torch.manual_seed(part)
        return NonLabelParty(features, ToyBottom(COLS, WIDTH), adam(0.05))

    return factory


def strategy_for(top=None, labels=Y[:ROWS], mechanism=None, **options):
    torch.manual_seed(0)
    party = LabelParty(
        top if top is not None else TopModel(2 * WIDTH, hidden=(), num_outputs=1),
        labels,
        mechanism or make_mechanism("laplace", epsilon=1.0),
        options.pop("key", None) or NoiseKey.from_seed(0),
    )
    settings = {"batch_size": 8, "epochs": 1, "num_nodes": 2, "node_wait": 1.0}
    return TPSLStrategy(party, **{**settings, **options})


def one_line(err):
    message = str(err.value)
    assert "\n" not in message, message
    return message


# --------------------------------------------------------------- NonLabelParty
@pytest.mark.parametrize(
    ("features", "named"),
    [
        ([X[:4], None], "features must be a dict split -> (numeric, categorical)"),
        ({"test": (X[:4], None)}, "features must have a 'train' split"),
        ({"train": (X[:4], None, None)}, "features['train'] must be a (numeric,"),
        ({"train": (X[:4, 0], None)}, "numeric must be 2-D (n, columns)"),
        ({"train": (X[:4], np.zeros(4, int))}, "categorical must be 2-D"),
        ({"train": (X[:4], np.zeros((3, 1), int))}, "numeric (4 rows) and"),
        ({"train": (X[:4], np.ones((4, 1)) / 2)}, "must hold integer codes"),
    ],
)
def test_features_must_be_a_dict_of_numeric_categorical_pairs(features, named):
    with pytest.raises(ConfigError) as err:
        NonLabelParty(features, ToyBottom(COLS, WIDTH))
    assert named in one_line(err)


@pytest.mark.parametrize("split", [(X[:5, :COLS], None), X[:5, :COLS]])
def test_no_categorical_columns_is_an_empty_int64_array(split):
    party = NonLabelParty({"train": split}, ToyBottom(COLS, WIDTH))
    _, categorical = party.features["train"]
    assert categorical.shape == (5, 0) and categorical.dtype == torch.int64
    assert party.embed([0, 4]).shape == (2, WIDTH)


def test_a_bottom_model_with_the_wrong_signature_fails_at_construction():
    with pytest.raises(ConfigError) as err:
        NonLabelParty({"train": (X[:4, :3], None)}, nn.Linear(3, 2))
    message = one_line(err)
    assert message.startswith(
        "bottom model must be called as f(numeric, categorical) -> (n, d); calling "
        "it with a (1, 3) float32 and a (1, 0) int64 tensor raised TypeError: "
    )
    assert "positional argument" in message


def test_a_bottom_model_must_return_a_2d_embedding():
    flat = ToyBottom(COLS, WIDTH, flat=True)
    with pytest.raises(ConfigError) as err:
        NonLabelParty({"train": (X[:4, :COLS], None)}, flat)
    assert one_line(err).endswith(
        "calling it with a (1, 2) float32 and a (1, 0) int64 tensor returned shape (3,)"
    )


def test_the_signature_check_leaves_training_mode_and_the_rng_alone():
    class Dropping(ToyBottom):
        def __init__(self):
            super().__init__(COLS, WIDTH)
            self.drop = nn.Dropout(0.5)

        def forward(self, numeric, categorical):
            return self.drop(self.layer(numeric))

    bottom = Dropping()
    torch.manual_seed(5)
    before = torch.get_rng_state()
    NonLabelParty({"train": (X[:4, :COLS], None)}, bottom)
    assert bottom.training
    assert torch.equal(torch.get_rng_state(), before)


# -------------------------------------------------------- connect: sample ids
SHORT = "(its train partition is 4 rows short"


@pytest.mark.parametrize(("rows", "ids"), [(12, SHORT), (20, "")])
def test_a_node_whose_train_split_is_not_the_labels_ids_is_refused(rows, ids):
    strategy = strategy_for()
    with pytest.raises(ProtocolError) as err:
        run_strategy(strategy, make_client_app(node(train_rows=rows, only=1)))
    message = one_line(err)
    assert "(partition 1) holds" in message
    assert f"holds {rows} train samples but the label party holds 16" in message
    assert "sample ids must be 0..n-1 at every node" in message
    if ids:
        assert ids in message
    else:  # more rows than labels: nothing is missing
        assert "rows short" not in message
    assert strategy.party.steps == 0  # refused before any step


def test_test_labels_with_a_node_lacking_a_test_split_are_refused_at_connect():
    strategy = strategy_for(test_labels=Y[ROWS:])
    with pytest.raises(ProtocolError) as err:
        run_strategy(strategy, make_client_app(node(test_rows=0, only=0)))
    message = one_line(err)
    assert "(partition 0) holds no 'test' split but test_labels holds 8" in message
    assert strategy.party.steps == 0


def test_test_labels_with_another_test_count_are_refused_at_connect():
    strategy = strategy_for(test_labels=Y[ROWS:])
    with pytest.raises(ProtocolError) as err:
        run_strategy(strategy, make_client_app(node(test_rows=5, only=1)))
    assert "(partition 1) holds 5 test samples but test_labels holds 8" in one_line(err)


def test_without_test_labels_nodes_need_no_test_split():
    strategy = strategy_for()
    report = run_strategy(strategy, make_client_app(node(test_rows=0)))
    assert len(report.history) == 1


# ------------------------------------------------------ connect: the top model
def test_a_top_model_that_cannot_take_the_nodes_width_is_one_config_error():
    top = nn.Sequential(nn.Linear(5, 1))  # no in_dim: read from its first layer
    strategy = strategy_for(top=top)
    with pytest.raises(ConfigError) as err:
        run_strategy(strategy, make_client_app(node()))
    message = one_line(err)
    assert message.startswith(
        "the top model takes 5 inputs but the 2 nodes' embeddings add up to 6: "
        "a no-grad forward of a zeros (1, 6) tensor raised RuntimeError"
    )


def test_the_in_dim_check_keeps_its_message():
    strategy = strategy_for(top=TopModel(7, hidden=(), num_outputs=1))
    with pytest.raises(ConfigError) as err:
        run_strategy(strategy, make_client_app(node()))
    assert one_line(err) == (
        "the top model takes 7 inputs but the 2 nodes' embeddings add up to 6"
    )


def test_a_two_logit_head_for_binary_labels_is_refused():
    strategy = strategy_for(top=TopModel(2 * WIDTH, hidden=(), num_outputs=2))
    with pytest.raises(ConfigError) as err:
        run_strategy(strategy, make_client_app(node()))
    assert one_line(err) == (
        "the top model maps a (1, 6) input to shape (1, 2); binary labels need "
        "1 logit (sigmoid + BCE): shape (1, 1)"
    )


def test_a_one_logit_head_for_three_classes_is_refused():
    strategy = strategy_for(
        top=TopModel(2 * WIDTH, hidden=(), num_outputs=1),
        labels=np.arange(ROWS) % 3,
        mechanism=make_mechanism("discrete", epsilon=2.0, num_classes=3),
    )
    with pytest.raises(ConfigError) as err:
        run_strategy(strategy, make_client_app(node()))
    assert "3 classes need 3 logits (softmax + CE): shape (1, 3)" in one_line(err)


def test_the_top_model_probe_leaves_training_mode_on():
    strategy = strategy_for()
    run_strategy(strategy, make_client_app(node()))
    assert strategy.party.top.training


# ------------------------------------------------- no silent writes at a node
def _stored(tmp_path, resume=False):
    mechanism = make_mechanism("laplace", epsilon=1.0)
    store = LabelStore(tmp_path / "label-party")
    binding = NoiseBinding.of(
        mechanism=mechanism, placement="logits", reuse_noise=True, id_space={"v": 1}
    )
    release = store.open_release(
        binding,
        resume=resume,
        labels=LabelRecords(np.arange(40), np.arange(40) % 2),
        privacy=privacy_spent(mechanism=mechanism),
    )
    return strategy_for(key=release.key, store=store, release=release)


def test_a_node_without_checkpoint_dir_refuses_to_checkpoint(tmp_path, monkeypatch):
    # Refused at connect time, before the first step: the label party's hello
    # says it will ask for a checkpoint after every epoch.
    monkeypatch.chdir(tmp_path)
    strategy = _stored(tmp_path)
    with pytest.raises(ProtocolError) as err:
        run_strategy(strategy, make_client_app(node()))
    message = one_line(err)
    assert "asked this node to save a checkpoint after every epoch" in message
    assert "built without checkpoint_dir" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["label-party"]
    assert strategy.party.steps == 0 and not strategy.released_gradients


def test_a_node_checkpoints_only_into_the_folder_it_was_given(tmp_path, monkeypatch):
    # Prepare: a working directory that must stay empty.
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    folder = tmp_path / "node-checkpoints"
    # Execute
    run_strategy(_stored(tmp_path), make_client_app(node(), checkpoint_dir=folder))
    # Assert
    assert sorted(p.name for p in folder.iterdir()) == ["party-0.pt", "party-1.pt"]
    assert list(cwd.iterdir()) == []


def test_without_a_store_a_node_with_checkpoint_dir_writes_nothing(tmp_path):
    folder = tmp_path / "node-checkpoints"
    run_strategy(strategy_for(), make_client_app(node(), checkpoint_dir=folder))
    assert not folder.exists()


def test_a_resume_without_checkpoint_dir_is_refused_at_connect(tmp_path):
    folder = tmp_path / "node-checkpoints"
    run_strategy(_stored(tmp_path), make_client_app(node(), checkpoint_dir=folder))
    resumed = _stored(tmp_path, resume=True)
    with pytest.raises(ProtocolError) as err:
        run_strategy(resumed, make_client_app(node()))
    assert "asked this node to resume from its checkpoint" in one_line(err)
    assert resumed.party.steps == 2  # restored, and no step taken since
