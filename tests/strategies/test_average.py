"""Every party returns the tail average of its weights; the transcript stays."""

import numpy as np
import pytest
import torch
from torch import nn

from tpsl_flwr import NoiseKey, make_mechanism
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.parties import LabelParty, NonLabelParty, adam
from tpsl_flwr.strategies import TPSLStrategy
from tpsl_flwr.testing.harness import run_strategy
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.node_side import make_client_app

ROWS, EPOCHS = 64, 4
X = np.random.default_rng(0).normal(size=(ROWS, 4)).astype(np.float32)
LABELS = (X[:, 0] + X[:, 2] > 0).astype(np.int64)


class Bottom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 3)

    def forward(self, numeric, categorical):
        return self.layer(numeric)


def _run(average, wrap=None, seen=None):
    """A 4-epoch run; each party's weights after every epoch, and the end.

    ``wrap``: a function of the ClientApp serving the nodes instead of it;
    ``seen`` (a dict): gets the strategy before the run (which may raise).
    """
    torch.manual_seed(0)
    nodes: dict[int, NonLabelParty] = {}

    def node(context):
        partition = int(context.node_config["partition-id"])
        cols = slice(2 * partition, 2 * partition + 2)
        torch.manual_seed(10 + partition)
        party = NonLabelParty(
            {"train": (X[:, cols], None)}, Bottom(), optimizer=adam(0.05)
        )
        nodes[partition] = party
        return party

    label_party = LabelParty(
        nn.Linear(6, 1),
        LABELS,
        make_mechanism("laplace", epsilon=1.0),
        NoiseKey.from_seed(0),
        optimizer=adam(0.05),
    )
    snapshots: dict[str, list[dict[str, torch.Tensor]]] = {"top": [], 0: [], 1: []}

    def on_epoch_end(epoch, entry):
        snapshots["top"].append(_copy(label_party.top.state_dict()))
        for partition, party in nodes.items():
            snapshots[partition].append(_copy(party.bottom.state_dict()))

    strategy = TPSLStrategy(
        label_party,
        batch_size=16,
        epochs=EPOCHS,
        num_nodes=2,
        on_epoch_end=on_epoch_end,
        average=average,
    )
    if seen is not None:
        seen["strategy"] = strategy
    app = make_client_app(node)
    report = run_strategy(strategy, wrap(app) if wrap else app, num_nodes=2, seed=0)
    final = {"top": _copy(label_party.top.state_dict())}
    final.update({p: _copy(party.bottom.state_dict()) for p, party in nodes.items()})
    return strategy, report, snapshots, final


def _copy(state):
    return {k: v.detach().clone() for k, v in state.items()}


def _mean(states):
    return {k: torch.stack([s[k] for s in states]).mean(0) for k in states[0]}


def test_every_party_returns_the_mean_of_its_last_epochs_and_the_transcript_stays():
    # Execute: the same run averaged and not
    averaged, report, snapshots, final = _run("on")
    plain, plain_report, plain_snapshots, plain_final = _run("off")
    # Assert: each party's returned weights are the mean of its own snapshots
    # of epochs 2 to 4 (all after the first), the label party's and the nodes'
    start = 1
    for who in ("top", 0, 1):
        want = _mean(snapshots[who][start:])
        for name, value in final[who].items():
            torch.testing.assert_close(value, want[name], rtol=0, atol=1e-6)
        # and not the last epoch's (the average is a different model)
        assert any(not torch.equal(final[who][k], snapshots[who][-1][k]) for k in want)
        # Off: the last epoch's weights, as before
        for name, value in plain_final[who].items():
            assert torch.equal(value, plain_snapshots[who][-1][name])
    # The training itself and what every node received are unchanged
    for who in ("top", 0, 1):
        for mine, theirs in zip(snapshots[who], plain_snapshots[who], strict=True):
            for name in mine:
                assert torch.equal(mine[name], theirs[name])
    for partition in (0, 1):
        sent = report.dispatched[partition]
        before = plain_report.dispatched[partition]
        assert len(sent) == len(before) == EPOCHS * ROWS // 16
        for a, b in zip(sent, before, strict=True):
            assert np.array_equal(a.ids, b.ids)
            assert np.array_equal(a.gradient, b.gradient)
    # Only allow-listed keys went out, and the averaged model was evaluated
    for msg in report.messages:
        assert set(msg.content.config_records[P.CONFIG]) <= P.ALLOWED_CONFIG_KEYS
    folds = [
        m for m in report.messages if P.AVERAGE_IN in m.content.config_records[P.CONFIG]
    ]
    assert len(folds) == 2 * (EPOCHS - start)  # each node, each averaged epoch
    assert averaged.averaged is not None and averaged.averaged["epochs"] == 3
    assert plain.averaged is None
    # What the run reports is the returned model's: the average's, or the last
    assert averaged.final_metrics == averaged.averaged
    assert plain.final_metrics == plain.history[-1]


def test_the_strategy_resolves_auto_from_its_epochs_and_refuses_on_with_a_hold_out():
    labels = np.random.default_rng(0).integers(0, 2, size=30_000)

    def party():
        return LabelParty(
            nn.Linear(4, 1),
            labels,
            make_mechanism("laplace", epsilon=1.0),
            NoiseKey.from_seed(1),
        )

    assert TPSLStrategy(party(), epochs=8, average="auto").average_from == 1
    assert TPSLStrategy(party(), epochs=2, average="auto").average_from is None
    assert TPSLStrategy(party(), epochs=4, average="auto").average_from is None
    held = TPSLStrategy(party(), epochs=3, average="auto", validation_fraction="auto")
    assert held.validation.active and held.average_from is None
    with pytest.raises(ConfigError, match="validation-fraction = 0"):
        TPSLStrategy(party(), epochs=3, average="on", validation_fraction=0.1)


def _resumable(folder, *, resume, stop_after=None, average="on", batch_size=16):
    """A 4-epoch run with a store; stopped after ``stop_after``, or resumed."""
    from tpsl_flwr.privacy.accounting import privacy_spent
    from tpsl_flwr.release.store import LabelRecords, LabelStore, NoiseBinding

    mechanism = make_mechanism("laplace", epsilon=1.0)
    binding = NoiseBinding.of(
        mechanism=mechanism, placement="logits", reuse_noise=True, id_space={}
    )
    records = LabelRecords(np.arange(ROWS), LABELS)
    store = LabelStore(folder / "label")
    if not resume:  # every fresh run draws the same noise
        store.provide_key(NoiseKey.from_seed(7), origin="seed")
    release = store.open_release(
        binding,
        resume=resume,
        labels=records,
        privacy=privacy_spent(mechanism=mechanism, epochs=EPOCHS),
        rehearsal=True,
    )
    nodes: dict[int, NonLabelParty] = {}

    def node(context):
        partition = int(context.node_config["partition-id"])
        torch.manual_seed(10 + partition)
        cols = slice(2 * partition, 2 * partition + 2)
        nodes[partition] = NonLabelParty(
            {"train": (X[:, cols], None)}, Bottom(), optimizer=adam(0.05)
        )
        return nodes[partition]

    torch.manual_seed(0)
    party = LabelParty(
        nn.Linear(6, 1), LABELS, mechanism, release.key, optimizer=adam(0.05)
    )

    def on_epoch_end(epoch, entry):
        if epoch == stop_after:
            raise KeyboardInterrupt("stopped")

    strategy = TPSLStrategy(
        party,
        batch_size=batch_size,
        epochs=EPOCHS,
        num_nodes=2,
        store=store,
        release=release,
        on_epoch_end=on_epoch_end,
        lr_schedule="constant",
        average=average,
    )
    app = make_client_app(node, checkpoint_dir=folder / "nodes")
    run_strategy(strategy, app, num_nodes=2, seed=0)
    weights = {"top": _copy(party.top.state_dict())}
    weights.update({p: _copy(n.bottom.state_dict()) for p, n in nodes.items()})
    return strategy, weights


def test_a_resumed_run_returns_the_average_of_an_uninterrupted_one(tmp_path):
    """The average is checkpointed on both sides with the epoch it belongs to."""
    # Execute: stopped after epoch 3 (two epochs averaged), then resumed
    with pytest.raises(KeyboardInterrupt):
        _resumable(tmp_path / "a", resume=False, stop_after=2)
    resumed, weights = _resumable(tmp_path / "a", resume=True)
    _, expected = _resumable(tmp_path / "b", resume=False)
    # Assert: the same three epochs averaged, the same weights on every side
    assert resumed.start_epoch == 3
    assert resumed.averaged is not None and resumed.averaged["epochs"] == 3
    for who in ("top", 0, 1):
        for name, value in expected[who].items():
            torch.testing.assert_close(weights[who][name], value, rtol=0, atol=1e-6)


def test_a_node_refuses_to_load_an_average_of_another_count(monkeypatch):
    """A label party asking for 4 epochs' average where the nodes hold 3 stops."""
    from tpsl_flwr.errors import TPSLError
    from tpsl_flwr.strategies.epoch_loop import EpochLoop

    original = EpochLoop.send_to_all

    def miscounting(self, grid, nodes, settings, timeout, echo=None):
        if P.RESTORE_AVERAGE in settings:
            settings = {**settings, P.RESTORE_AVERAGE: settings[P.RESTORE_AVERAGE] + 1}
        return original(self, grid, nodes, settings, timeout, echo)

    monkeypatch.setattr(EpochLoop, "send_to_all", miscounting)
    with pytest.raises(TPSLError, match=r"restore the average of 4 .* averaged 3"):
        _run("on")


@pytest.mark.parametrize(
    ("stopped", "resumed", "said"),
    [
        (
            "on",
            "off",
            "the stopped run averages the weights of every epoch from epoch 2 on "
            "but this one (average = off, 4 epochs) averages no weights",
        ),
        (
            "off",
            "on",
            "the stopped run averages no weights but this one (average = on, 4 "
            "epochs) averages the weights of every epoch from epoch 2 on",
        ),
        (
            "on",
            "auto",  # auto resolves to no average at 4 epochs
            "the stopped run averages the weights of every epoch from epoch 2 on "
            "but this one (average = auto, 4 epochs) averages no weights",
        ),
    ],
    ids=["on-then-off", "off-then-on", "on-then-auto"],
)
def test_a_resume_under_another_average_is_refused_naming_both(
    tmp_path, stopped, resumed, said
):
    # Arrange: stopped after epoch 3 under one average
    with pytest.raises(KeyboardInterrupt):
        _resumable(tmp_path, resume=False, stop_after=2, average=stopped)
    # Act / Assert: the resume under another is refused before anything is sent
    with pytest.raises(ConfigError, match=r"^cannot resume: ") as refused:
        _resumable(tmp_path, resume=True, average=resumed)
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_a_resume_with_another_batch_size_is_refused_naming_both(tmp_path):
    # Arrange: stopped after epoch 3 with batches of 16 ids
    with pytest.raises(KeyboardInterrupt):
        _resumable(tmp_path, resume=False, stop_after=2)
    # Act / Assert: batches of 8 would misplace the schedule's steps: refused
    with pytest.raises(ConfigError, match=r"^cannot resume: ") as refused:
        _resumable(tmp_path, resume=True, batch_size=8)
    assert str(refused.value) == (
        "cannot resume: the stopped run took batches of 16 ids and this one takes "
        "8 (batch-size): its steps and learning-rate schedule count batches of 16; "
        "resume with batch-size = 16"
    )
    # The same batches resume (the refusal changed nothing)
    resumed, _ = _resumable(tmp_path, resume=True)
    assert resumed.start_epoch == 3


def test_a_checkpoint_with_an_average_but_not_its_first_epoch_is_refused():
    from tpsl_flwr.parties.weight_average import stopped_average

    assert stopped_average({"average_from": 1}) == 1
    assert stopped_average({"average_from": None}) is None
    assert stopped_average({}) is None  # written before the tail average
    with pytest.raises(ConfigError, match="not the epoch it began at"):
        stopped_average({"average": {"weights": {}, "count": 2}})


def _old_node(app, drops, partition=1):
    """``app`` as a node that ignores ``drops`` (an older tpsl-flwr drops keys
    it does not know) at ``partition``."""

    def serve(msg, context):
        config = msg.content.config_records.get(P.CONFIG)
        if int(context.node_config["partition-id"]) == partition and config:
            for key in drops:
                config.pop(key, None)
        return app(msg, context)

    return serve


def _miscounting_node(app, partition=1):
    """``app`` as a node whose echo says one epoch more than it averaged."""

    def serve(msg, context):
        reply = app(msg, context)
        echo = reply.content.config_records.get(P.ECHO)
        if int(context.node_config["partition-id"]) == partition and echo:
            if P.AVERAGED in echo:
                echo[P.AVERAGED] = int(echo[P.AVERAGED]) + 1
        return reply

    return serve


@pytest.mark.parametrize(
    ("wrap", "said"),
    [
        (
            lambda app: _old_node(app, (P.AVERAGE_IN, P.RESTORE_AVERAGE)),
            "did not confirm average-in = 1: its reply echoes average-in = nothing",
        ),
        (
            lambda app: _old_node(app, (P.RESTORE_AVERAGE,)),
            "did not confirm restore-average = 3: its reply echoes "
            "restore-average = nothing",
        ),
        (
            _miscounting_node,
            "did not confirm averaged = 1: its reply echoes averaged = 2",
        ),
    ],
    ids=["ignores-both", "ignores-restore", "miscounts"],
)
def test_a_node_that_does_not_confirm_the_average_stops_the_run(wrap, said):
    """No label-party average is ever reported over a node's last epoch."""
    from tpsl_flwr.errors import ProtocolError

    seen: dict = {}
    with pytest.raises(ProtocolError, match=r"node \d+ \(partition 1\) ") as err:
        _run("on", wrap=wrap, seen=seen)
    assert said in str(err.value)
    assert seen["strategy"].averaged is None  # no averaged metric reported
