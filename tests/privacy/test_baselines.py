"""The baseline defenses' defining properties (docs/baselines.md).

Marvell's noise meets its power constraint and lowers the norm attack's AUC;
max-norm equalizes the expected gradient norms of a batch; RR-with-prior's
keep probability matches its closed form. Statistical checks use fixed seeds
and a stated tolerance (a number of standard errors).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tpsl_flwr.attacks.norm import norm_scores
from tpsl_flwr.errors import ConfigError, PrivacyError
from tpsl_flwr.metrics.auc import binary_auc
from tpsl_flwr.privacy.accounting import composed_epsilon_of, privacy_spent
from tpsl_flwr.privacy.epsilon_text import epsilon_text
from tpsl_flwr.privacy.gradient_noise import keyed_normals, perturb_gradients
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import make_mechanism
from tpsl_flwr.privacy.mechanisms.marvell import solve_marvell, sum_kl
from tpsl_flwr.privacy.mechanisms.max_norm import max_norm_scales
from tpsl_flwr.privacy.mechanisms.rr_prior import (
    rr_prior_keep_probabilities,
    rr_prior_set_sizes,
)

KEY = NoiseKey.from_seed(7)
SIGMAS = 4.0
"""Tolerance of the statistical checks, in standard errors."""


def ctr_like_gradients(n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut-layer gradients as a CTR model's early steps give them.

    ``g_i = (sigmoid(z_i) - y_i) a_i`` with ``a_i = dz/de ~ N(mu, I/4)`` and a
    prediction near the positive rate (0.25): the rare positives get gradients
    three times longer, which the norm attack ranks almost perfectly.
    """
    rng = np.random.default_rng(seed)
    labels = (rng.random(n) < 0.25).astype(np.int64)
    jacobians = rng.normal(1.0, 0.5, size=(n, d))
    predicted = np.clip(rng.normal(0.25, 0.05, size=n), 0.01, 0.99)
    return (predicted - labels)[:, None] * jacobians, labels


# ----------------------------------------------------------------- Marvell
@pytest.mark.parametrize(
    ("u", "v", "d", "p", "power"),
    [
        (0.1, 0.5, 16, 0.25, 2.0),
        (0.5, 0.1, 16, 0.25, 2.0),
        (0.0, 0.0, 8, 0.3, 1.0),
        (0.01, 1.0, 16, 0.25, 0.5),
        (0.2, 0.3, 1, 0.6, 4.0),
    ],
)
def test_marvell_solution_meets_its_power_constraint_and_beats_random_search(
    u, v, d, p, power
):
    # Prepare
    rng = np.random.default_rng(0)
    # Execute
    s = solve_marvell(u=u, v=v, d=d, g=1.0, p=p, power=power)
    # Assert: the constraint, the structure, and optimality against 4000
    # random feasible points scaled onto the constraint.
    assert s.power(p, d) <= power * (1 + 1e-9)
    assert s.lam10 >= s.lam20 >= 0 and s.lam11 >= s.lam21 >= 0
    assert min(s.lam20, s.lam21) == 0.0  # one class only gets isotropic noise
    assert s.sum_kl == pytest.approx(
        sum_kl(s.lam10, s.lam20, s.lam11, s.lam21, u=u, v=v, d=d, g=1.0)
    )
    best = math.inf
    for _ in range(4_000):
        a0, a1 = rng.random(2)
        b0, b1 = rng.random(2) * np.array([a0, a1]) * (d > 1)
        spent = p * (a1 + (d - 1) * b1) + (1 - p) * (a0 + (d - 1) * b0)
        a0, b0, a1, b1 = np.array([a0, b0, a1, b1]) * power / spent
        best = min(best, sum_kl(a0, b0, a1, b1, u=u, v=v, d=d, g=1.0))
    assert s.sum_kl <= best + 1e-9
    assert s.sum_kl < sum_kl(0, 0, 0, 0, u=u, v=v, d=d, g=1.0)


def test_marvell_solution_scales_with_the_gradients():
    small = solve_marvell(u=0.1, v=0.4, d=8, g=1.0, p=0.3, power=2.0)
    big = solve_marvell(u=10.0, v=40.0, d=8, g=100.0, p=0.3, power=200.0)
    assert big.lam10 == pytest.approx(100 * small.lam10, rel=1e-6)
    assert big.sum_kl == pytest.approx(small.sum_kl, rel=1e-9)


def test_marvell_noise_meets_the_power_constraint_empirically():
    # Prepare: one batch, its noise drawn 100 times on fresh keyed streams.
    grads, labels = ctr_like_gradients(2048, 16, seed=1)
    marvell = make_mechanism("marvell", marvell_power=2.0)
    solution = marvell.solve(grads, labels)
    delta = grads[labels == 1].mean(0) - grads[labels == 0].mean(0)
    budget = 2.0 * float(delta @ delta)
    ids = np.arange(labels.size)
    # Execute
    powers = []
    for stream in range(1, 101):
        noisy, _ = perturb_gradients(
            marvell, grads, labels, ids=ids, key=KEY, stream=stream, reference=None
        )
        noise = noisy - grads
        powers.append(np.einsum("ij,ij->i", noise, noise).mean())
    # Assert: the solver spends the whole budget and the noise realizes it
    # (mean of 100 batch means within SIGMAS standard errors).
    p = float(labels.mean())
    assert solution.power(p, 16) == pytest.approx(budget, rel=1e-9)
    mean, se = float(np.mean(powers)), float(np.std(powers) / math.sqrt(100))
    assert abs(mean - budget) < SIGMAS * se


def test_marvell_lowers_the_norm_attack_auc():
    # Prepare
    grads, labels = ctr_like_gradients(4096, 16, seed=2)
    ids = np.arange(labels.size)
    clean = binary_auc(labels, norm_scores(grads))
    # Execute: batches of 256, as the label party would perturb them.
    aucs = {}
    for power in (0.5, 4.0):
        marvell = make_mechanism("marvell", marvell_power=power)
        noisy = np.empty_like(grads)
        for start in range(0, labels.size, 256):
            rows = slice(start, start + 256)
            noisy[rows], _ = perturb_gradients(
                marvell,
                grads[rows],
                labels[rows],
                ids=ids[rows],
                key=KEY,
                stream=1 + start,
                reference=None,
            )
        aucs[power] = binary_auc(labels, norm_scores(noisy))
    # Assert: clean ~0.99; the AUC's standard error here is ~0.01, so the
    # margins (0.2 and 0.05) are many SEs wide.
    assert clean > 0.95
    assert aucs[0.5] < clean - 0.2
    assert aucs[4.0] < aucs[0.5] - 0.05


def test_marvell_one_class_batch_uses_the_last_solution_or_fails_closed():
    grads, labels = ctr_like_gradients(64, 4, seed=3)
    marvell = make_mechanism("marvell", marvell_power=1.0)
    normals = keyed_normals(KEY, np.arange(64), 1, 5)
    only_negatives = np.zeros(64, dtype=np.int64)
    with pytest.raises(PrivacyError, match="holds label 0 only"):
        marvell.perturb_batch(grads, only_negatives, normals, None)
    _, reference = marvell.perturb_batch(grads, labels, normals, None)
    noisy, kept = marvell.perturb_batch(grads, only_negatives, normals, reference)
    assert kept is reference and not np.allclose(noisy, grads)


def test_marvell_is_binary_and_states_no_dp():
    with pytest.raises(ConfigError, match="binary only"):
        make_mechanism("marvell", marvell_power=1.0, num_classes=3)
    with pytest.raises(ConfigError, match="marvell-power"):
        make_mechanism("marvell", marvell_power=0.0)
    marvell = make_mechanism("marvell", marvell_power=1.0)
    spent = privacy_spent(mechanism=marvell, epochs=3)
    assert (spent.epsilon, spent.epsilon_at_delta, spent.auc_bound) == (
        None,
        None,
        None,
    )
    assert spent.releases == 3  # fresh noise every step: one release an epoch
    assert any("no DP guarantee" in note for note in spent.notes)
    assert epsilon_text(None, "marvell") == "n/a (no DP guarantee)"
    assert composed_epsilon_of([(marvell, 1)], delta=1e-5) == math.inf


# ----------------------------------------------------------------- max-norm
def test_max_norm_equalizes_the_expected_norms_of_a_batch():
    # Prepare: 8 gradients of very different norms, each repeated 20000
    # times in one batch (the same batch maximum), each copy its own normal.
    grads, labels = ctr_like_gradients(8, 16, seed=4)
    max_norm = make_mechanism("max-norm")
    top = float(np.max(np.einsum("ij,ij->i", grads, grads)))
    draws = 20_000
    batch = np.tile(grads, (draws, 1))
    # Execute
    noisy, _ = perturb_gradients(
        max_norm,
        batch,
        np.tile(labels, draws),
        ids=np.arange(batch.shape[0]),
        key=KEY,
        stream=1,
        reference=None,
    )
    squared = np.einsum("ij,ij->i", noisy, noisy).reshape(draws, 8)
    # Assert: E ||g~_i||^2 = max ||g||^2 for every row, within SIGMAS SE.
    mean = squared.mean(axis=0)
    se = squared.std(axis=0) / math.sqrt(draws)
    longest = int(np.argmax(np.einsum("ij,ij->i", grads, grads)))
    assert np.all(np.abs(mean - top) <= SIGMAS * se + 1e-12 * top)
    assert se[longest] <= 1e-9 * top  # the longest gradient is left as it is
    # and the direction never changes (the noise is along g_i).
    cosine = np.einsum("ij,ij->i", noisy, batch) / (
        np.linalg.norm(noisy, axis=1) * np.linalg.norm(batch, axis=1)
    )
    assert np.allclose(np.abs(cosine), 1.0)


def test_max_norm_scales_and_zero_gradients():
    grads = np.array([[3.0, 4.0], [0.0, 0.0], [0.3, 0.4]])
    scales = max_norm_scales(grads)
    assert scales.tolist() == pytest.approx([0.0, 0.0, math.sqrt(99.0)])
    noisy, _ = make_mechanism("max-norm").perturb_batch(
        grads, np.array([1, 0, 0]), np.ones((3, 1)), None
    )
    assert noisy[1].tolist() == [0.0, 0.0]
    assert privacy_spent(mechanism=make_mechanism("max-norm")).epsilon is None


# ----------------------------------------------------------------- RR-with-prior
PRIORS = np.array(
    [
        [0.25, 0.25, 0.25, 0.25],  # uniform: k* = 4, plain RR
        [0.70, 0.10, 0.10, 0.10],  # confident: k* = 1 at eps 1
        [0.45, 0.40, 0.10, 0.05],  # two likely labels: k* = 2
        [0.05, 0.10, 0.40, 0.45],
    ]
)


def test_rr_prior_set_sizes_maximize_the_expected_keep():
    eps = 1.0
    sizes = rr_prior_set_sizes(PRIORS, eps)
    for row, size in zip(PRIORS, sizes, strict=True):
        top = np.cumsum(np.sort(row)[::-1])
        keep = [math.exp(eps) / (math.exp(eps) + j) * top[j] for j in range(4)]
        assert size == int(np.argmax(keep)) + 1
    assert sizes.tolist() == [4, 1, 2, 2]


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
def test_rr_prior_keep_probability_matches_its_closed_form(eps):
    # Prepare: every (prior row, label) pair, 12000 keyed draws each.
    mechanism = make_mechanism("rr-prior", epsilon=eps, num_classes=4)
    draws = 12_000
    rows = np.repeat(np.arange(4), 4 * draws)
    labels = np.tile(np.repeat(np.arange(4), draws), 4)
    ids = np.arange(labels.size)
    # Execute
    noisy = mechanism.sample_with_prior(labels, ids, KEY, 1, PRIORS[rows])
    kept = np.argmax(noisy.coefficients, axis=1) == labels
    # Assert: P(output = y) = e^eps / (e^eps + k* - 1) in the set, else 0.
    expected = rr_prior_keep_probabilities(PRIORS[rows], labels, eps)
    for prior_row in range(4):
        for label in range(4):
            cell = (rows == prior_row) & (labels == label)
            q = float(expected[cell][0])
            se = math.sqrt(max(q * (1 - q), 1e-12) / draws)
            assert abs(kept[cell].mean() - q) <= SIGMAS * se


def test_rr_prior_is_eps_dp_and_never_leaves_the_set():
    eps, draws = 1.0, 40_000
    mechanism = make_mechanism("rr-prior", epsilon=eps, num_classes=4)
    prior = np.tile(PRIORS[2], (draws, 1))  # set {0, 1}
    histograms = []
    for label in range(4):
        labels = np.full(draws, label)
        noisy = mechanism.sample_with_prior(labels, np.arange(draws), KEY, 2, prior)
        out = np.argmax(noisy.coefficients, axis=1)
        histograms.append(np.bincount(out, minlength=4) / draws)
    h = np.array(histograms)
    assert h[:, 2:].sum() == 0.0  # outputs stay in the top-2 set
    # in the set: q = e/(e+1) kept; outside it: uniform over the set (1/2).
    q = math.e / (math.e + 1)
    se = math.sqrt(q * (1 - q) / draws)
    assert abs(h[0, 0] - q) <= SIGMAS * se and abs(h[1, 1] - q) <= SIGMAS * se
    assert np.all(np.abs(h[2:, :2] - 0.5) <= SIGMAS * math.sqrt(0.25 / draws))
    # Every output's probability moves by at most e^eps when the label does.
    ratio = h[:, :2].max(axis=0) / h[:, :2].min(axis=0)
    assert np.all(ratio <= math.exp(eps) * (1 + 0.05))


def test_rr_prior_at_a_uniform_prior_is_randomized_response():
    rr_prior = make_mechanism("rr-prior", epsilon=1.0)
    labels = np.arange(20_000) % 2
    noisy = rr_prior.sample(labels, np.arange(labels.size), KEY, 1, None)
    kept = (np.argmax(noisy.coefficients, axis=1) == labels).mean()
    q = math.e / (1 + math.e)
    assert abs(kept - q) <= SIGMAS * math.sqrt(q * (1 - q) / labels.size)
    assert rr_prior.expected_sda() == pytest.approx(q)
    spent = privacy_spent(mechanism=rr_prior, epochs=3)
    assert spent.epsilon == 1.0 and spent.releases == 1
    fresh = privacy_spent(mechanism=rr_prior, epochs=3, reuse_noise=False)
    assert fresh.epsilon == 3.0 and 2.5 < fresh.epsilon_at_delta <= 3.0


def test_rr_prior_refuses_a_bad_prior():
    mechanism = make_mechanism("rr-prior", epsilon=1.0)
    with pytest.raises(PrivacyError, match="prior must be"):
        mechanism.sample_with_prior(
            np.array([0, 1]), np.arange(2), KEY, 1, np.array([[0.5, 0.5]])
        )
    with pytest.raises(PrivacyError, match="finite"):
        mechanism.sample_with_prior(
            np.array([0]), np.arange(1), KEY, 1, np.array([[np.nan, 0.5]])
        )
