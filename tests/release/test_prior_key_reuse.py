"""RR-with-prior under one key twice: not the same release, not an independent one.

A label randomizer whose draw is a function of (key, id, label) alone gives
the same noisy label every time its key is used: a second run under the same
key (a reused ``noise-seed``, or an embedder's ``noise_key``) releases nothing
new, and the ledger rightly counts the key once. RR-with-prior also takes a
prior the label party computes from training (Ghazi et al. 2021, Algorithm 2),
and anything that changes training (learning rate, batch size, model) changes
it. With ``k >= 3`` two priors read the same keyed words into different
labels, and the pair of releases has *no* finite epsilon: an output pair
possible under one label is impossible under another. Binary labels are safe
(both runs read the one keep word the same way).
"""

import math

import numpy as np
import pytest

from tpsl_flwr.errors import ReleaseRefused
from tpsl_flwr.privacy.accounting import privacy_spent
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import make_mechanism
from tpsl_flwr.privacy.mechanisms.rr_prior import rr_prior_set_sizes
from tpsl_flwr.release.ledger import PrivacyLedger
from tpsl_flwr.release.store import LabelRecords, LabelStore, NoiseBinding

N = 200_000
IDS = np.arange(N, dtype=np.int64)


def _pair(k, prior_a, prior_b, label, epsilon=1.0):
    """The labels two runs with priors ``a`` and ``b`` release under one key."""
    mechanism = make_mechanism("rr-prior", epsilon=epsilon, num_classes=k)
    key = NoiseKey.from_seed(7)
    labels = np.full(N, label, dtype=np.int64)
    out = []
    for prior in (prior_a, prior_b):
        noisy = mechanism.sample_with_prior(labels, IDS, key, 1, np.tile(prior, (N, 1)))
        out.append(np.argmax(noisy.coefficients, axis=1))
    return out


def test_two_priors_under_one_key_have_no_finite_epsilon_for_three_classes():
    # Prepare: run 1 at a uniform prior (k* = 3), run 2 at a prior whose set
    # is {0, 1} (k* = 2): what one training or another gives.
    uniform, skewed = np.full(3, 1 / 3), np.array([0.45, 0.45, 0.10])
    assert rr_prior_set_sizes(np.stack([uniform, skewed]), 1.0).tolist() == [3, 2]
    # Execute: the joint output (0, 1) for label 1 and for label 2.
    a1, b1 = _pair(3, uniform, skewed, label=1)
    a2, b2 = _pair(3, uniform, skewed, label=2)
    p_label1 = np.mean((a1 == 0) & (b1 == 1))
    p_label2 = np.mean((a2 == 0) & (b2 == 1))
    # Assert: (q2 - q3) / 2 under label 1 (binomial SE ~ 5e-4 at N = 2e5;
    # tolerance 5 SE), exactly 0 under label 2: the privacy loss is infinite.
    q2, q3 = math.e / (math.e + 1), math.e / (math.e + 2)
    assert abs(p_label1 - (q2 - q3) / 2) < 2.5e-3
    assert p_label1 > 0.05 and p_label2 == 0.0


def test_two_priors_under_one_key_stay_at_epsilon_for_binary_labels():
    # Both runs keep y where the keep word says so, whatever their priors:
    # where both sets hold two labels the outputs agree, and a set of one
    # label outputs the prior's top label, which says nothing of y.
    a, b = _pair(2, np.array([0.5, 0.5]), np.array([0.3, 0.7]), label=1)
    assert np.array_equal(a, b)


def _open(folder, mechanism, *, public=False, k=3):
    binding = NoiseBinding.of(
        mechanism=mechanism,
        placement="logits",
        reuse_noise=True,
        id_space={"dataset": "file", "id-space": "beef"},
    )
    store = LabelStore(folder)
    store.provide_key(NoiseKey.from_seed(5), origin="seed")  # the same seed twice
    labels = np.random.default_rng(0).integers(0, k, 5000)
    return store.open_release(
        binding,
        resume=False,
        labels=LabelRecords(np.arange(5000), labels),
        privacy=privacy_spent(mechanism=mechanism),
        public_labels=public,
    )


def test_a_second_rr_prior_release_under_the_same_key_is_refused(tmp_path):
    # Prepare: a first release of three-class labels under a seeded key.
    rr = make_mechanism("rr-prior", epsilon=1.0, num_classes=3)
    first = _open(tmp_path / "run-1", rr)
    # Execute / Assert: the same seed again derives the same key; the ledger
    # would count it once at eps 1 while the pair has no finite epsilon.
    with pytest.raises(ReleaseRefused, match="no finite epsilon") as err:
        _open(tmp_path / "run-2", rr)
    assert first.key.fingerprint in str(err.value)
    ((_, entries),) = PrivacyLedger().sets()
    assert [e.kind for e in entries] == ["release"]  # nothing recorded for it


@pytest.mark.parametrize(
    ("mechanism", "k"),
    [("discrete", 3), ("laplace", 3), ("rr-prior", 2)],
)
def test_the_same_key_again_stays_one_release_where_the_draw_is_the_same(
    tmp_path, mechanism, k
):
    # The noisy labels are a function of (key, id, label) (or, binary
    # RR-with-prior, of the one keep word): the same key releases nothing new.
    mech = make_mechanism(mechanism, epsilon=1.0, num_classes=k)
    first = _open(tmp_path / "run-1", mech, k=k)
    second = _open(tmp_path / "run-2", mech, k=k)
    assert second.key.fingerprint == first.key.fingerprint
    assert second.ledger is not None and second.ledger.total.releases == 1


def test_public_rehearsal_labels_are_never_refused(tmp_path):
    rr = make_mechanism("rr-prior", epsilon=1.0, num_classes=3)
    _open(tmp_path / "run-1", rr, public=True)
    _open(tmp_path / "run-2", rr, public=True)
