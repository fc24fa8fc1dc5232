"""Validation by id, noisy-label scores, best-epoch restore and the lr schedule."""

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from tpsl_flwr import ConfigError, NoiseKey, PrivacyError, make_mechanism
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run import run_inprocess_experiment
from tpsl_flwr.models import TopModel
from tpsl_flwr.parties import LabelParty, NonLabelParty, adam, noise_stream
from tpsl_flwr.parties.optim import lr_scale, set_lr_scale
from tpsl_flwr.privacy.noisy_labels import STREAM_TRANSCRIPT, draw_noisy_labels
from tpsl_flwr.privacy.perturb import per_class_losses
from tpsl_flwr.privacy.posterior import unbiased_coefficients
from tpsl_flwr.strategies import TPSLStrategy
from tpsl_flwr.testing import run_strategy
from tpsl_flwr.validation.best_epoch import BestEpoch, clearly_better
from tpsl_flwr.validation.holdout import Validation, validation_ids
from tpsl_flwr.validation.scores import (
    noisy_validation_loss,
    noisy_validation_losses,
    unbiased_targets,
)
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.node_side import make_client_app

ROWS, TEST_ROWS, COLS, WIDTH = 400, 100, 2, 3
RNG = np.random.default_rng(0)
X = RNG.normal(size=(ROWS + TEST_ROWS, 2 * COLS)).astype(np.float32)
Y = (X[:, 0] + X[:, 2] + 0.5 * RNG.normal(size=ROWS + TEST_ROWS) > 0).astype(np.int64)


def party_for(labels, mechanism, top=None, reuse_noise=True):
    torch.manual_seed(0)
    return LabelParty(
        top or TopModel(2 * WIDTH, hidden=(4,), num_outputs=1),
        labels,
        mechanism,
        NoiseKey.from_seed(3),
        optimizer=adam(0.05),
        reuse_noise=reuse_noise,
    )


@pytest.mark.parametrize("reuse_noise", [True, False])
def test_a_held_out_label_is_drawn_as_its_first_training_epoch_draws_it(reuse_noise):
    """So two runs differing only in the hold-out release the same noisy labels.

    Without reuse, training draws a fresh stream per epoch; scoring on another
    stream would be an extra draw the ledger never counts.
    """
    labels = np.random.default_rng(4).integers(0, 2, size=500)
    mechanism = make_mechanism("laplace", epsilon=1.0)
    party = party_for(labels, mechanism, reuse_noise=reuse_noise)
    ids = np.arange(0, 500, 7)
    first_epoch = noise_stream(STREAM_TRANSCRIPT, 0, reuse_noise)
    trained = draw_noisy_labels(mechanism, labels[ids], ids, party.key, first_epoch)
    expected = unbiased_coefficients(
        mechanism=mechanism, coefficients=trained.coefficients
    )
    np.testing.assert_array_equal(unbiased_targets(party, ids), expected)
    assert (first_epoch == STREAM_TRANSCRIPT) == reuse_noise


class Nodes:
    """A node factory that remembers each partition's party."""

    def __init__(self):
        self.parties = {}

    def __call__(self, context):
        part = int(context.node_config["partition-id"])
        cols = slice(COLS * part, COLS * part + COLS)
        torch.manual_seed(10 + part)
        party = NonLabelParty(
            {"train": (X[:ROWS, cols], None), "test": (X[ROWS:, cols], None)},
            Bottom(nn.Linear(COLS, WIDTH)),
            adam(0.05),
        )
        self.parties[part] = party
        return party


class Bottom(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, numeric, categorical):
        return self.inner(numeric)


def test_validation_ids_are_a_hash_of_the_id_alone():
    n, fraction = 100_000, 0.1
    ids = validation_ids(n, fraction, seed=7)
    sd = math.sqrt(n * fraction * (1 - fraction))
    assert abs(ids.size - n * fraction) < 4 * sd
    assert np.array_equal(ids, validation_ids(n, fraction, seed=7))
    assert not np.array_equal(ids[:100], validation_ids(n, fraction, seed=8)[:100])
    # Membership of an id does not depend on how many ids there are.
    assert np.array_equal(validation_ids(50_000, fraction, 7), ids[ids < 50_000])
    assert validation_ids(n, 0.0, 7).size == 0
    with pytest.raises(ConfigError, match=r"0\.5"):
        validation_ids(n, 0.5, 7)


@pytest.mark.parametrize(
    "mechanism",
    [
        make_mechanism("laplace", epsilon=1.0),
        make_mechanism("discrete", epsilon=1.0),
        make_mechanism("discrete", epsilon=0.5, num_classes=3),
        make_mechanism("laplace", epsilon=2.0, num_classes=3),
    ],
    ids=["laplace", "rr", "rr-k3", "laplace-k3"],
)
def test_debiased_noisy_targets_average_to_the_clean_one_hot(mechanism):
    """E[target | y] = one_hot(y), each class within 4 standard errors (200k ids)."""
    n, k = 200_000, mechanism.num_classes
    labels = np.random.default_rng(1).integers(0, k, size=n)
    party = party_for(labels, mechanism, top=nn.Linear(2, 1 if k == 2 else k))
    targets = unbiased_targets(party, np.arange(n))
    assert targets.shape == (n, k)
    for j in range(k):
        rows = targets[labels == j]
        se = rows.std(axis=0) / math.sqrt(rows.shape[0])
        expected = np.eye(k)[j]
        assert np.all(np.abs(rows.mean(axis=0) - expected) < 4 * se + 1e-12)


def test_noisy_validation_loss_estimates_the_clean_loss():
    """Within 4 standard errors of the clean log loss, for a fixed model (100k ids)."""
    n = 100_000
    rng = np.random.default_rng(2)
    emb = rng.normal(size=(n, 2)).astype(np.float32)
    labels = (emb[:, 0] + rng.normal(size=n) > 0).astype(np.int64)
    torch.manual_seed(0)
    top = nn.Linear(2, 1)
    party = party_for(labels, make_mechanism("laplace", epsilon=1.0), top=top)
    targets = unbiased_targets(party, np.arange(n))
    noisy = noisy_validation_loss(party, targets, emb)
    with torch.no_grad():
        losses = per_class_losses(top(torch.as_tensor(emb))).double().numpy()
    clean = losses[np.arange(n), labels].mean()
    per_sample = (losses * targets).sum(axis=1)
    assert abs(noisy - clean) < 4 * per_sample.std() / math.sqrt(n)


def test_validation_is_refused_for_a_mechanism_that_leaves_labels_clean():
    gaussian = make_mechanism("gaussian", sigma=1.0)
    party = party_for(Y[:ROWS], gaussian)
    with pytest.raises(ConfigError, match="gaussian"):
        unbiased_targets(party, np.arange(10))
    with pytest.raises(ConfigError, match="validation-fraction"):
        ExperimentConfig(mechanism="gaussian", validation_fraction=0.1)
    # an embedder's strategy is refused when built, before any gradient leaves
    with pytest.raises(ConfigError, match="leaves the labels clean"):
        TPSLStrategy(party_for(Y[:ROWS], gaussian), validation_fraction=0.1)


def paired(mean, sd, n, seed):
    """A candidate whose paired differences have exactly this mean and sd."""
    base = np.random.default_rng(seed).uniform(0.1, 2.0, size=n)
    d = np.random.default_rng(seed + 1).normal(size=n)
    d = (d - d.mean()) / d.std(ddof=1) * sd + mean
    return base + d, base


@pytest.mark.parametrize(
    ("margin", "expected"), [(1.01, True), (0.99, False)], ids=["beyond", "within"]
)
def test_clearly_better_needs_the_mean_difference_beyond_one_standard_error(
    margin, expected
):
    # Prepare: n = 400 paired differences of sd 2, so se = 0.1.
    n, sd = 400, 2.0
    se = sd / math.sqrt(n)
    candidate, incumbent = paired(-margin * se, sd, n, seed=0)

    # Execute / Assert: the same mean with the margin 0 always wins.
    assert clearly_better(candidate=candidate, incumbent=incumbent) is expected
    assert clearly_better(candidate=candidate, incumbent=incumbent, num_se=0.0)
    assert not clearly_better(candidate=incumbent, incumbent=candidate, num_se=0.0)


def test_clearly_better_refuses_unpaired_losses_and_a_bad_margin():
    with pytest.raises(ConfigError, match=r"\(3,\) and \(4,\)"):
        clearly_better(candidate=np.zeros(3), incumbent=np.zeros(4))
    with pytest.raises(ConfigError, match="-1"):
        clearly_better(candidate=np.zeros(3), incumbent=np.zeros(3), num_se=-1.0)
    # Equal losses (no difference at all) keep the incumbent.
    assert not clearly_better(candidate=np.ones(5), incumbent=np.ones(5))


def test_best_epoch_keeps_the_earlier_epoch_unless_a_later_one_is_clearly_better():
    """A lower mean within noise does not switch; one beyond it does."""
    # Prepare: four epochs' per-id losses on the same 400 ids.
    n = 400
    first = np.random.default_rng(5).uniform(0.2, 1.0, size=n)
    noise = np.random.default_rng(6).normal(size=n)
    noise = (noise - noise.mean()) / noise.std(ddof=1)
    within = first - 0.05 + 3.0 * noise  # mean -0.05, se 0.15
    clear = first - 0.05 + 0.1 * noise  # mean -0.05, se 0.005
    heavy = clear - 0.3 + 20.0 * noise  # lowest mean of all, se 1.0
    party = party_for(Y[:ROWS], make_mechanism("laplace", epsilon=1.0))
    best = BestEpoch()

    # Execute
    kept = []
    for epoch, losses in enumerate([first, within, clear, heavy]):
        with torch.no_grad():
            for param in party.top.parameters():
                param.fill_(float(epoch))
        kept.append(best.update(epoch, float(losses.mean()), party, losses))

    # Assert: the plain lowest mean would have taken epoch 3 (and epoch 1).
    assert kept == [True, False, True, False]
    assert best.epoch == 2 and best.score == pytest.approx(clear.mean())
    assert int(np.argmin([x.mean() for x in (first, within, clear, heavy)])) == 3
    np.testing.assert_array_equal(best.losses, clear)
    assert best.top_state is not None
    assert all(bool((v == 2.0).all()) for v in best.top_state.values())
    # A non-finite score is never kept.
    assert not best.update(4, float("nan"), party, clear - 1.0)


def test_best_epoch_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    """The kept losses travel as a tensor; the next decision is the same."""
    party = party_for(Y[:ROWS], make_mechanism("laplace", epsilon=1.0))
    losses = np.random.default_rng(7).uniform(size=50)
    best = BestEpoch()
    best.update(0, float(losses.mean()), party, losses)
    path = tmp_path / "best.pt"
    torch.save(best.state_dict(), path)
    loaded = BestEpoch()
    loaded.load_state_dict(torch.load(path, weights_only=True))
    assert loaded.epoch == 0 and loaded.score == best.score
    np.testing.assert_array_equal(loaded.losses, losses)
    for candidate in (losses - 0.001, losses - 0.2):
        assert loaded.update(1, float(candidate.mean()), party, candidate) == (
            best.update(1, float(candidate.mean()), party, candidate)
        )
    # With per-class losses: they travel too, and the label-noise margin
    # decides alike after the round trip.
    classes = np.random.default_rng(8).uniform(size=(50, 2))
    targets = np.stack([1.0 - Y[:50], Y[:50]], axis=1).astype(np.float64)
    best = BestEpoch()
    best.update(0, 0.0, party, (classes * targets).sum(axis=1), classes)
    torch.save(best.state_dict(), path)
    loaded = BestEpoch()
    loaded.load_state_dict(torch.load(path, weights_only=True))
    np.testing.assert_array_equal(loaded.class_losses, classes)
    outcomes = []
    for shift in (0.01, 0.5):  # lower on the true class, within / beyond noise
        later = classes - shift * targets + 0.3 * (1.0 - targets)
        per_id = (later * targets).sum(axis=1)
        outcome = loaded.update(1, float(per_id.mean()), party, per_id, later)
        assert outcome == best.update(1, float(per_id.mean()), party, per_id, later)
        outcomes.append(outcome)
    assert outcomes == [False, True]
    # A checkpoint without per-id losses: the lower mean decides.
    old = BestEpoch()
    old.load_state_dict({"epoch": 0, "score": 0.5, "top": None})
    assert not old.update(1, 0.6, party, losses) and old.update(1, 0.4, party)


def test_the_decision_reads_no_clean_label_after_the_noisy_release():
    """Validation draws the noisy targets once; then labels may be anything.

    Scores and kept epochs from a party whose held-out labels are flipped
    after the draw equal those of the unchanged party: every decision is a
    function of the noisy release (and the models) alone.
    """
    # Prepare: three "epochs" of a linear top model on fixed embeddings.
    n = 3000
    rng = np.random.default_rng(8)
    emb = rng.normal(size=(n, 2)).astype(np.float32)
    labels = (emb[:, 0] + rng.normal(size=n) > 0).astype(np.int64)
    weights = [(0.3, 0.0), (1.0, 0.0), (1.0, 0.1), (6.0, 3.0)]
    runs = []
    for flip in (False, True):
        top = nn.Linear(2, 1)
        party = party_for(labels, make_mechanism("laplace", epsilon=1.0), top=top)
        validation = Validation(n, 0.4, seed=0)
        scores, kept = [], []

        # Execute
        for epoch, (w0, w1) in enumerate(weights):
            with torch.no_grad():
                top.weight.copy_(torch.tensor([[w0, w1]]))
                top.bias.zero_()
            score = validation.score(party, emb[validation.ids])
            if flip and epoch == 0:
                flipped = party.labels.copy()
                flipped[validation.ids] = 1 - flipped[validation.ids]
                party.labels = flipped
            scores.append(score)
            kept.append(validation.best.update(epoch, score, party))
        runs.append((scores, kept, validation.best.epoch))

    # Assert
    assert runs[0] == runs[1]
    assert runs[0][1][0] and runs[0][2] is not None


def test_the_score_is_the_mean_of_the_per_id_losses():
    n = 500
    rng = np.random.default_rng(9)
    emb = rng.normal(size=(n, 2)).astype(np.float32)
    labels = rng.integers(0, 2, size=n)
    party = party_for(
        labels, make_mechanism("discrete", epsilon=1.0), top=nn.Linear(2, 1)
    )
    targets = unbiased_targets(party, np.arange(n))
    per_id = noisy_validation_losses(party, targets, emb)
    assert per_id.shape == (n,)
    assert noisy_validation_loss(party, targets, emb) == pytest.approx(per_id.mean())


def test_the_best_epoch_is_restored_at_the_label_party_and_at_every_node():
    nodes = Nodes()
    party = party_for(Y[:ROWS], make_mechanism("laplace", epsilon=1.0))
    tops, bottoms, per_id = [], [], []

    def snapshot(epoch, entry):
        tops.append(copy.deepcopy(party.top.state_dict()))
        bottoms.append(
            {p: copy.deepcopy(n.bottom.state_dict()) for p, n in nodes.parties.items()}
        )

    strategy = TPSLStrategy(
        party,
        test_labels=Y[ROWS:],
        batch_size=32,
        epochs=4,
        num_nodes=2,
        on_epoch_end=snapshot,
        validation_fraction=0.25,
    )
    score = strategy.validation.score_class_losses

    def recording_score(label_party, class_losses):
        value = score(label_party, class_losses)
        per_id.append(strategy.validation.best.pending)
        return value

    strategy.validation.score_class_losses = recording_score  # type: ignore[method-assign]
    report = run_strategy(strategy, make_client_app(nodes), num_nodes=2, seed=0)
    losses = [h["validation_loss"] for h in report.history]
    # The paired one-standard-error rule, replayed on the recorded losses.
    replay = BestEpoch()
    for epoch, values in enumerate(per_id):
        assert float(values.mean()) == pytest.approx(losses[epoch])
        replay.update(epoch, float(values.mean()), party, values)
    best = replay.epoch
    assert best is not None and strategy.best is not None
    assert strategy.best.epoch == best
    for name, value in party.top.state_dict().items():
        assert torch.equal(value, tops[best][name])
    for part, node in nodes.parties.items():
        for name, value in node.bottom.state_dict().items():
            assert torch.equal(value, bottoms[best][part][name])
    # The held-out ids are never trained on, nor sent with a gradient.
    held_out = set(strategy.validation.ids.tolist())
    assert 0 < len(held_out) < ROWS
    assert not held_out & {int(i) for s in report.computed for i in s.ids}
    for steps in report.dispatched.values():
        assert not held_out & {int(i) for s in steps for i in s.ids}
    # Only public keys leave: the decision travels as an epoch number.
    keeps = [
        m.content.config_records[P.CONFIG][P.KEEP_BEST]
        for m in report.messages
        if P.KEEP_BEST in m.content.config_records[P.CONFIG]
    ]
    assert keeps and keeps[-1] == best


def _sent_scales(report, to=None):
    """The learning-rate scales the messages carried (to node ``to``, else all)."""
    return [
        float(m.content.config_records[P.CONFIG][P.LR_SCALE])
        for m in report.messages
        if P.LR_SCALE in m.content.config_records[P.CONFIG]
        and (to is None or m.metadata.dst_node_id == to)
    ]


def test_the_nodes_follow_the_label_partys_cosine_schedule():
    nodes = Nodes()
    party = party_for(Y[:ROWS], make_mechanism("none"))
    strategy = TPSLStrategy(
        party, batch_size=100, epochs=2, num_nodes=2, lr_schedule="cosine"
    )
    report = run_strategy(strategy, make_client_app(nodes), num_nodes=2, seed=0)
    total = 2 * 4
    sent = _sent_scales(report)
    # Each gradient goes with the scale its step was taken at: 0..T-1, per node.
    expected = [lr_scale("cosine", t, total) for t in range(total)]
    assert sorted(set(sent), reverse=True) == pytest.approx(expected)
    last = 0.05 * expected[-1]
    assert party.optimizer.param_groups[0]["lr"] == pytest.approx(last)
    for node in nodes.parties.values():
        assert node.optimizer.param_groups[0]["lr"] == pytest.approx(last)


def test_under_restarts_every_node_follows_a_cosine_cycle_of_two_epochs():
    # Prepare: 4 epochs of 4 steps each: two cycles of 8 steps
    nodes = Nodes()
    party = party_for(Y[:ROWS], make_mechanism("none"))
    strategy = TPSLStrategy(
        party, batch_size=100, epochs=4, num_nodes=2, lr_schedule="restarts"
    )

    # Execute
    report = run_strategy(strategy, make_client_app(nodes), num_nodes=2, seed=0)

    # Assert: the scales sent are the first cycle's twice over; each cycle ends
    # near 0 (step 7 and step 15), as the end of a 2-epoch cosine run does
    sent = _sent_scales(report, to=report.messages[0].metadata.dst_node_id)
    cycle = [lr_scale("cosine", t, 8) for t in range(8)]
    assert sent[:16] == pytest.approx(cycle + cycle)
    assert sent[7] == pytest.approx(sent[15]) and sent[7] < 0.05
    last = 0.05 * cycle[-1]
    for node in nodes.parties.values():
        assert node.optimizer.param_groups[0]["lr"] == pytest.approx(last)


@pytest.mark.parametrize(
    ("schedule", "offered"),
    [("restarts", [1, 3, 4]), ("cosine", [0, 1, 2, 3, 4])],
)
def test_under_restarts_only_the_ends_of_cycles_may_be_kept(
    schedule, offered, monkeypatch
):
    # Prepare: 5 epochs with a hold-out; record the epochs offered to be kept
    seen: list[int] = []
    update = BestEpoch.update

    def recording(self, epoch, *args, **kwargs):
        seen.append(epoch)
        return update(self, epoch, *args, **kwargs)

    monkeypatch.setattr(BestEpoch, "update", recording)
    nodes = Nodes()
    party = party_for(Y[:ROWS], make_mechanism("laplace", epsilon=1.0))
    strategy = TPSLStrategy(
        party,
        batch_size=100,
        epochs=5,
        num_nodes=2,
        validation_fraction=0.25,
        lr_schedule=schedule,
    )

    # Execute
    report = run_strategy(strategy, make_client_app(nodes), num_nodes=2, seed=0)

    # Assert: under restarts epochs 2 and 4 (each ends its 2-epoch cycle) and
    # the last; the nodes are told to keep only such an epoch; every epoch's
    # validation loss is still reported
    assert seen == offered
    keeps = {
        int(m.content.config_records[P.CONFIG][P.KEEP_BEST])
        for m in report.messages
        if P.KEEP_BEST in m.content.config_records[P.CONFIG]
    }
    assert keeps and keeps <= set(offered)
    assert strategy.best is not None and strategy.best.epoch in offered
    assert len([h for h in report.history if "validation_loss" in h]) == 5


def test_a_restart_cycle_as_long_as_the_run_is_the_cosine():
    cosine = [lr_scale("cosine", t, 12) for t in range(12)]
    for cycle in (0, 12, 50):
        restarts = [lr_scale("restarts", t, 12, cycle_steps=cycle) for t in range(12)]
        assert restarts == cosine
    # 5 epochs of 2 steps, cycles of 4: the last cycle spans the 2 steps left
    odd = [lr_scale("restarts", t, 10, cycle_steps=4) for t in range(10)]
    assert odd[8:] == pytest.approx([1.0, 0.5])
    with pytest.raises(ConfigError, match="cycle_steps must be >= 0, got -1"):
        lr_scale("restarts", 0, 10, cycle_steps=-1)


def test_lr_scales_do_not_compound():
    optimizer = torch.optim.Adam(nn.Linear(2, 1).parameters(), lr=0.1)
    set_lr_scale(optimizer, 0.5)
    set_lr_scale(optimizer, 0.5)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    with pytest.raises(ConfigError, match=r"1\.5"):
        set_lr_scale(optimizer, 1.5)
    with pytest.raises(ConfigError, match="warm"):
        lr_scale("warm", 0, 10)


def test_a_resumed_run_keeps_the_best_epoch_of_the_first(tmp_path):
    """2 epochs, then resumed to 3: the best epoch and test AUC of 3 at once."""
    common = dict(
        dataset="breast-cancer",
        batch_size=64,
        validation_fraction=0.2,
        weight_decay=0.01,
        lr_schedule="constant",
        lr=0.01,
        noise_seed=5,
    )
    # An explicit rate: lr = 0 resolves from the epochs (past 2, Laplace labels
    # on small data share two epochs' budget), so it would differ here too.
    once, _ = run_inprocess_experiment(
        ExperimentConfig(epochs=3, out_dir=str(tmp_path / "once"), **common)
    )
    out = str(tmp_path / "twice")
    run_inprocess_experiment(ExperimentConfig(epochs=2, out_dir=out, **common))
    # (A cosine schedule spans the epochs of the run as configured, so it
    # would differ here: 2 epochs, then 3.)
    resumed, _ = run_inprocess_experiment(
        ExperimentConfig(epochs=3, out_dir=out, resume=True, **common)
    )
    assert resumed["best_epoch"] == once["best_epoch"]
    assert resumed["test_auc"] == pytest.approx(once["test_auc"], abs=1e-6)


def test_held_out_labels_are_never_trained_on_nor_in_the_frequency_prior():
    """With fresh noise per epoch, a held-out label leaves only through validation.

    The frequency prior of every epoch's stream is the same whatever the
    held-out labels are (flipped here), and a step on a held-out id is refused.
    """
    n = 2000
    labels = np.random.default_rng(4).integers(0, 2, size=n)
    held = validation_ids(n, 0.2, seed=0)
    flipped = labels.copy()
    flipped[held] = 1 - flipped[held]
    priors = []
    for y in (labels, flipped):
        party = LabelParty(
            nn.Linear(2, 1),
            y,
            make_mechanism("laplace", epsilon=1.0),
            NoiseKey.from_seed(3),
            reuse_noise=False,
            denoise="posterior",
            denoise_prior="frequency",
        )
        party.hold_out(held)
        priors.append([party._frequency_prior(stream) for stream in (5, 9)])
    np.testing.assert_array_equal(np.array(priors[0]), np.array(priors[1]))
    with pytest.raises(PrivacyError, match=f"sample id {held[0]} is held out"):
        party.train_step(held[:3], torch.zeros(3, 2))
