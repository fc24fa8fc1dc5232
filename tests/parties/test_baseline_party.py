"""The label party with the baseline defenses: what it sends and what it keeps.

Marvell and max-norm: the top model trains on the exact labels, the nodes get
the mechanism's noisy version of the exact gradient, keyed and fresh every
step; a first one-class batch is refused. RR-with-prior: each label is
randomized once (noise reused), the nodes get the gradient of that label, and
a resumed run never randomizes a label again.
"""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest
import torch

from tpsl_flwr.errors import PrivacyError
from tpsl_flwr.models import TopModel
from tpsl_flwr.parties import LabelParty, adam
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import make_mechanism
from tpsl_flwr.privacy.perturb import candidate_gradients

ROWS, WIDTH, BATCH = 256, 6, 64
LABELS = (np.arange(ROWS) % 4 == 0).astype(np.int64)  # a quarter positive


def _top() -> TopModel:
    return TopModel(
        WIDTH, (8,), num_outputs=1, generator=torch.Generator().manual_seed(0)
    )


def _party(name: str, **kwargs: object) -> LabelParty:
    options = {"marvell": {"marvell_power": 1.0}, "rr-prior": {"epsilon": 1.0}}
    return LabelParty(
        _top(),
        LABELS,
        make_mechanism(name, **options.get(name, {})),  # type: ignore[arg-type]
        NoiseKey.from_seed(5),
        optimizer=adam(1e-2),
        **kwargs,  # type: ignore[arg-type]
    )


def _embeddings(seed: int, rows: int = BATCH) -> torch.Tensor:
    return torch.from_numpy(
        np.random.default_rng(seed).normal(size=(rows, WIDTH))
    ).float()


@pytest.mark.parametrize("name", ["marvell", "max-norm"])
def test_gradient_noise_trains_on_exact_labels_and_sends_noisy_gradients(name):
    # Prepare: the same step under `none` (exact gradient, exact update).
    ids = np.arange(BATCH)
    emb = _embeddings(0)
    exact, noisy = _party("none"), _party(name)
    exact_top = copy.deepcopy(noisy.top)
    # Execute
    clean = exact.train_step(ids, emb)
    sent = noisy.train_step(ids, emb)
    # Assert: the top models took the same (exact) step, the sent gradient
    # is not the clean one, and the same key sends the same noise.
    for a, b in zip(exact.top.parameters(), noisy.top.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not torch.allclose(sent, clean)
    again = _party(name)
    again.top.load_state_dict(exact_top.state_dict())
    assert torch.equal(again.train_step(ids, emb), sent)
    # A second step draws fresh noise (a new stream per step).
    assert noisy.steps == 1


def test_marvell_sends_noise_of_the_solved_power():
    # Prepare
    party = _party("marvell")
    ids, emb = np.arange(BATCH), _embeddings(1)
    per_sample = candidate_gradients(party.top, emb).double().numpy()
    exact = per_sample[np.arange(BATCH), LABELS[ids]]
    solution = party.mechanism.solve(exact, LABELS[ids])  # type: ignore[attr-defined]
    # Execute
    sent = party.train_step(ids, emb).double().numpy() * BATCH
    # Assert: the noise is there, and its power is of the solved size (one
    # batch of 64: within a factor 2 of its expectation).
    noise = sent - exact
    p = float(LABELS[ids].mean())
    power = float(np.einsum("ij,ij->i", noise, noise).mean())
    assert 0.5 < power / solution.power(p, WIDTH) < 2.0


def test_marvell_first_batch_of_one_class_sends_nothing():
    party = _party("marvell")
    negatives = np.flatnonzero(LABELS == 0)[:BATCH]
    before = copy.deepcopy(party.top.state_dict())
    with pytest.raises(PrivacyError, match="holds label 0 only"):
        party.train_step(negatives, _embeddings(2))
    assert party.steps == 0
    for name, value in party.top.state_dict().items():
        assert torch.equal(value, before[name])
    # After a two-class batch, a one-class batch takes its covariance.
    party.train_step(np.arange(BATCH), _embeddings(3))
    assert party.train_step(negatives, _embeddings(2)).shape == (BATCH, WIDTH)


def test_rr_prior_draws_each_label_once_and_sends_its_gradient():
    # Prepare
    party = _party("rr-prior")
    epochs = [np.random.default_rng(e).permutation(ROWS) for e in range(2)]
    # Execute: two epochs, noise reused.
    for order in epochs:
        for start in range(0, ROWS, BATCH):
            ids = order[start : start + BATCH]
            party.train_step(ids, _embeddings(start, ids.size))
        drawn = party._drawn[1].copy()
        assert (drawn >= 0).all()  # every label randomized in epoch 0...
    # ...and none again in epoch 1 (the same array, untouched).
    assert np.array_equal(party._drawn[1], drawn)
    flips = float((drawn != LABELS).mean())
    assert 0.0 < flips < 0.5
    # The sent gradient is the exact gradient of the drawn label.
    ids, emb = np.arange(BATCH), _embeddings(9)
    before = copy.deepcopy(party.top)
    sent = party.train_step(ids, emb).double()
    candidates = candidate_gradients(before, emb).double()
    expected = candidates[np.arange(BATCH), drawn[ids]] / BATCH
    assert torch.allclose(sent, expected, atol=1e-6)


def test_rr_prior_resume_never_draws_again():
    # Prepare: half an epoch drawn, then a checkpoint through torch.save.
    party = _party("rr-prior")
    party.train_step(np.arange(BATCH), _embeddings(0))
    buffer = io.BytesIO()
    torch.save(party.state_dict(), buffer)
    buffer.seek(0)
    resumed = _party("rr-prior")
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    # Execute / Assert: drawn ids train, a fresh id is refused (fail closed).
    resumed.train_step(np.arange(BATCH), _embeddings(0))
    with pytest.raises(PrivacyError, match="resumed run would randomize"):
        resumed.train_step(np.arange(BATCH, 2 * BATCH), _embeddings(1))
    assert np.array_equal(resumed._drawn[1], party._drawn[1])


def test_marvell_reference_survives_a_checkpoint():
    party = _party("marvell")
    party.train_step(np.arange(BATCH), _embeddings(0))
    buffer = io.BytesIO()
    torch.save(party.state_dict(), buffer)
    buffer.seek(0)
    resumed = _party("marvell")
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    negatives = np.flatnonzero(LABELS == 0)[:BATCH]
    assert resumed.train_step(negatives, _embeddings(2)).shape == (BATCH, WIDTH)


def test_rr_prior_resumed_before_any_checkpoint_never_draws():
    # A release resumed with no saved state: the earlier run may have sent
    # draws made with another prior, so none is made again (fail closed).
    party = _party("rr-prior")
    party.mark_resumed()
    with pytest.raises(PrivacyError, match="resumed run would randomize"):
        party.train_step(np.arange(BATCH), _embeddings(0))
    # The other mechanisms draw from (key, id) alone: a resume is the same noise.
    laplace = LabelParty(
        _top(),
        LABELS,
        make_mechanism("laplace", epsilon=1.0),
        NoiseKey.from_seed(5),
    )
    laplace.mark_resumed()
    assert laplace.train_step(np.arange(BATCH), _embeddings(0)).shape == (BATCH, WIDTH)


def test_a_resumed_run_never_reuses_the_interrupted_runs_gradient_noise():
    # Prepare: a Marvell run checkpoints after step 0, then sends step 1 and
    # stops (a node can make it stop). The node replays step 1 of the
    # resumed run with embeddings of its choosing: under the same keyed
    # normals the noise all but cancels in the difference of the two
    # transcripts, leaving the clean gradients' difference, from which a
    # white-box attacker reads every label (100% before the fix).
    ids0, ids1 = np.arange(BATCH), np.arange(BATCH, 2 * BATCH)
    first = _party("marvell")
    first.train_step(ids0, _embeddings(0))
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    emb = _embeddings(1)
    chosen = emb + 3.0 * _embeddings(2)
    before = copy.deepcopy(first.top)
    sent = first.train_step(ids1, emb).double().numpy()
    resumed = _party("marvell")
    buffer.seek(0)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    after = copy.deepcopy(resumed.top)
    again = resumed.train_step(ids1, chosen).double().numpy()
    # Execute: the label coordinate of the difference, in the plane of the
    # candidates' differences (per-sample candidates over the batch mean).
    step = (
        candidate_gradients(before, emb).double().numpy()
        - candidate_gradients(after, chosen).double().numpy()
    ) / BATCH
    axis = step[:, 1] - step[:, 0]
    t = np.einsum("nd,nd->n", sent - again - step[:, 0], axis)
    t = t / np.einsum("nd,nd->n", axis, axis)
    read = np.mean((t > 0.5) == (LABELS[ids1] == 1))
    # Assert: the resumed run drew other noise; the difference is no clean
    # reading (tolerance: 0.9, against 1.0 under reused words).
    assert read < 0.9
