"""Noise-aware training: the posterior of the true label given its noisy release.

Statistical tests draw labels from a known prior, release them through the
real keyed samplers and compare the empirical ``P(y | observation)`` with the
closed-form posterior (Malek et al., NeurIPS 2021), within 4 binomial standard
errors per bin plus 0.005.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from tpsl_flwr.attacks.ceiling import ABOVE
from tpsl_flwr.cli.main import main
from tpsl_flwr.errors import ConfigError, PrivacyError
from tpsl_flwr.models import TopModel
from tpsl_flwr.parties import LabelParty, adam
from tpsl_flwr.parties.label_party import model_prior
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import Mechanism, make_mechanism
from tpsl_flwr.privacy.mechanisms.base import NoisyLabels
from tpsl_flwr.privacy.noisy_labels import STREAM_TRANSCRIPT, draw_noisy_labels
from tpsl_flwr.privacy.perturb import logits_placement_backward
from tpsl_flwr.privacy.posterior import (
    frequency_prior,
    posterior_coefficients,
    unbiased_coefficients,
)

SAMPLES = 200_000
SIGMAS = 4.0
SLACK = 0.005  # binning: the posterior is averaged over a bin, not evaluated


def _release(
    mechanism: Mechanism, prior: list[float], seed: int, samples: int = SAMPLES
) -> tuple[np.ndarray, np.ndarray]:
    """True labels drawn from ``prior`` and their keyed noisy coefficients."""
    labels = np.random.default_rng(seed).choice(len(prior), size=samples, p=prior)
    ids = np.arange(samples, dtype=np.int64)
    noisy = draw_noisy_labels(mechanism, labels, ids, NoiseKey.from_seed(seed))
    return labels, noisy.coefficients


def _assert_calibrated(
    labels: np.ndarray, posterior: np.ndarray, bins: np.ndarray
) -> int:
    """In every bin of >= 500 samples: empirical P(y = j) == mean posterior_j."""
    checked = 0
    for b in np.unique(bins):
        inside = bins == b
        n = int(inside.sum())
        if n < 500:
            continue
        for j in range(posterior.shape[1]):
            empirical = float(np.mean(labels[inside] == j))
            predicted = float(posterior[inside, j].mean())
            se = np.sqrt(max(predicted * (1 - predicted), 1e-4) / n)
            assert abs(empirical - predicted) <= SIGMAS * se + SLACK, (b, j, n)
            checked += 1
    return checked


def test_binary_laplace_posterior_is_bayes_rule_by_monte_carlo():
    # Prepare
    mech = make_mechanism("laplace", epsilon=1.0)
    prior = [0.7, 0.3]
    labels, c = _release(mech, prior, seed=1)
    # Execute
    post = posterior_coefficients(mechanism=mech, coefficients=c, prior=prior)
    # Assert: bins of the observation s = c_1 (0.25 wide on [-2, 3])
    bins = np.digitize(c[:, 1], np.arange(-2.0, 3.01, 0.25))
    assert _assert_calibrated(labels, post, bins) >= 30
    # The ratio is exactly exp((|s| - |s - 1|) / b) at the realized scale b.
    s = c[:, 1]
    b = mech.scale_steps * 2.0**-20
    odds = post[:, 1] / post[:, 0]
    expected = (0.3 / 0.7) * np.exp((np.abs(s) - np.abs(s - 1)) / b)
    np.testing.assert_allclose(odds, expected, rtol=1e-9)


def test_multiclass_laplace_posterior_is_calibrated_by_monte_carlo():
    # Prepare
    mech = make_mechanism("laplace", epsilon=2.0, num_classes=3)
    prior = [0.5, 0.3, 0.2]
    labels, c = _release(mech, prior, seed=2)
    # Execute
    post = posterior_coefficients(mechanism=mech, coefficients=c, prior=prior)
    # Assert: a correct posterior is calibrated; bin by each class's posterior
    for j in range(3):
        bins = np.digitize(post[:, j], np.linspace(0.0, 1.0, 11))
        assert _assert_calibrated(labels, post, bins) >= 15


@pytest.mark.parametrize(
    ("num_classes", "prior"), [(2, [0.8, 0.2]), (4, [0.4, 0.3, 0.2, 0.1])]
)
def test_randomized_response_posterior_is_bayes_rule_by_monte_carlo(num_classes, prior):
    # Prepare
    mech = make_mechanism("discrete", epsilon=1.0, num_classes=num_classes)
    labels, c = _release(mech, prior, seed=3)
    # Execute
    post = posterior_coefficients(mechanism=mech, coefficients=c, prior=prior)
    # Assert: the observation is the released label itself
    assert _assert_calibrated(labels, post, np.argmax(c, axis=1)) == num_classes**2


@pytest.mark.parametrize(
    ("name", "num_classes", "epsilon"),
    [
        ("laplace", 2, 1.0),
        ("laplace", 5, 0.1),
        ("discrete", 3, 1.0),
        ("laplace", 2, 1e4),
        ("discrete", 2, 700.0),
        ("laplace", 4, 50.0),
    ],
)
def test_rows_are_finite_and_sum_to_one(name, num_classes, epsilon):
    mech = make_mechanism(name, epsilon=epsilon, num_classes=num_classes)
    prior = np.random.default_rng(0).dirichlet(np.ones(num_classes), size=1000)
    prior = np.clip(prior, 1e-6, None)
    _, c = _release(mech, [1 / num_classes] * num_classes, seed=4, samples=1000)
    post = posterior_coefficients(mechanism=mech, coefficients=c, prior=prior)
    assert post.shape == (1000, num_classes)
    assert np.isfinite(post).all() and (post >= 0).all()
    np.testing.assert_allclose(post.sum(axis=1), 1.0, atol=1e-12)


def test_no_protection_is_the_identity():
    mech = make_mechanism("none", num_classes=3)
    c = np.eye(3)[[0, 2, 1, 1]]
    post = posterior_coefficients(mechanism=mech, coefficients=c, prior=[0.1] * 3)
    np.testing.assert_array_equal(post, c)


def test_gaussian_is_refused_by_name():
    mech = make_mechanism("gaussian", sigma=1.0)
    with pytest.raises(ConfigError, match="'gaussian'"):
        posterior_coefficients(mechanism=mech, coefficients=np.eye(2), prior=[0.5] * 2)
    with pytest.raises(ConfigError, match="'gaussian'"):
        LabelParty(
            torch.nn.Linear(2, 1),
            np.array([0, 1]),
            mech,
            NoiseKey.from_seed(0),
            denoise="posterior",
        )


@pytest.mark.parametrize(
    ("coefficients", "prior", "match"),
    [
        ([[np.nan, 1.0]], [0.5, 0.5], "not finite"),
        ([[0.0, 1.0]], [np.nan, 0.5], "positive and finite"),
        ([[0.0, 1.0]], [0.0, 1.0], "positive and finite"),
        ([[0.0, 1.0, 0.0]], [0.5, 0.5], r"must be \(n, 2\)"),
    ],
)
def test_bad_inputs_fail_closed(coefficients, prior, match):
    mech = make_mechanism("laplace", epsilon=1.0)
    with pytest.raises(PrivacyError, match=match):
        posterior_coefficients(mechanism=mech, coefficients=coefficients, prior=prior)


@pytest.mark.parametrize(
    ("name", "num_classes", "pi"),
    [
        ("laplace", 2, [0.9, 0.1]),
        ("laplace", 3, [0.5, 0.3, 0.2]),
        ("discrete", 2, [0.9, 0.1]),
        ("discrete", 4, [0.4, 0.3, 0.2, 0.1]),
    ],
)
def test_frequency_prior_is_within_four_standard_errors(name, num_classes, pi):
    # Prepare
    mech = make_mechanism(name, epsilon=1.0, num_classes=num_classes)
    labels, c = _release(mech, pi, seed=5, samples=50_000)
    p = np.asarray(pi)
    # Execute
    estimate = frequency_prior(mechanism=mech, coefficients=c, floor=0.0)
    # Assert: the standard error of the unbiased estimator of each pi_j
    n = labels.size
    if name == "laplace":
        b = mech.scale_steps * 2.0**-20
        se = np.sqrt((p * (1 - p) + 2 * b**2) / n)
    else:
        q = mech.keep_probability
        o = (1 - q) / (num_classes - 1)
        m = q * p + o * (1 - p)
        se = np.sqrt(m * (1 - m) / n) / (q - o)
    # Clipping at 0 and renormalizing move the estimate by far less than 1 SE.
    assert np.all(np.abs(estimate - p) <= SIGMAS * se), (estimate, p, se)
    floored = frequency_prior(mechanism=mech, coefficients=c)
    assert floored.min() >= 1e-3 / num_classes
    assert floored.sum() == pytest.approx(1.0, abs=1e-12)


# ------------------------------------------------------------- the label party
ROWS, WIDTH, BATCH = 400, 6, 64


def _party(mech: Mechanism, placement: str = "logits", **kwargs) -> LabelParty:
    labels = np.random.default_rng(1).integers(0, mech.num_classes, ROWS)
    top = TopModel(
        WIDTH,
        (8,),
        num_outputs=1 if mech.is_binary else mech.num_classes,
        generator=torch.Generator().manual_seed(0),
    )
    return LabelParty(
        top,
        labels,
        mech,
        NoiseKey.from_seed(3),
        placement=placement,
        optimizer=adam(1e-2),
        **kwargs,
    )


def _batches(steps: int = 4) -> list[tuple[np.ndarray, torch.Tensor]]:
    rng = np.random.default_rng(2)
    return [
        (
            rng.choice(ROWS, BATCH, replace=False),
            torch.as_tensor(rng.normal(size=(BATCH, WIDTH)), dtype=torch.float32),
        )
        for _ in range(steps)
    ]


@pytest.mark.parametrize("prior", ["model", "frequency"])
@pytest.mark.parametrize("placement", ["logits", "cut"])
@pytest.mark.parametrize(
    ("name", "num_classes"), [("laplace", 2), ("discrete", 2), ("laplace", 3)]
)
def test_label_party_posterior_is_deterministic_and_finite(
    name, num_classes, placement, prior
):
    # Prepare
    mech = make_mechanism(name, epsilon=1.0, num_classes=num_classes)
    first = _party(mech, placement, denoise="posterior", denoise_prior=prior)
    # The noise cache off: the frequency prior is then drawn in chunks.
    second = _party(
        mech, placement, denoise="posterior", denoise_prior=prior, noise_cache_bytes=0
    )
    plain = _party(mech, placement)
    # Execute
    for epoch in range(2):
        for ids, emb in _batches():
            a = first.train_step(ids, emb, epoch=epoch)
            b = second.train_step(ids, emb, epoch=epoch)
            plain.train_step(ids, emb, epoch=epoch)
            # Assert
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)
    # ... and the top model, trained on the posterior, is not the plain one's
    assert any(
        not torch.equal(p, q)
        for p, q in zip(first.top.parameters(), plain.top.parameters(), strict=True)
    )


@pytest.mark.parametrize("placement", ["logits", "cut"])
@pytest.mark.parametrize(
    ("name", "num_classes", "epsilon"),
    # k-ary randomized response at 30: at 50 its keep threshold overflows.
    [("laplace", 2, 50.0), ("discrete", 2, 50.0), ("discrete", 3, 30.0)],
)
def test_at_a_large_epsilon_the_posterior_gives_the_clean_gradients(
    name, num_classes, epsilon, placement
):
    # Prepare
    mech = make_mechanism(name, epsilon=epsilon, num_classes=num_classes)
    denoised = _party(mech, placement, denoise="posterior")
    clean = _party(make_mechanism("none", num_classes=num_classes), placement)
    # Execute / Assert: over several steps, the top models stay together; the
    # dispatched gradient is the release's (Laplace: still 1/50-scale noise)
    for ids, emb in _batches(6):
        sent, expected = denoised.train_step(ids, emb), clean.train_step(ids, emb)
        if name == "discrete":
            torch.testing.assert_close(sent, expected, rtol=1e-4, atol=1e-7)
        else:  # noise of scale 1/50 on a label difference of 1: a few percent
            gap = float((sent - expected).abs().mean())
            assert gap < 0.1 * float(expected.abs().mean()), gap
    for p, q in zip(denoised.top.parameters(), clean.top.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("prior", ["model", "frequency"])
@pytest.mark.parametrize("placement", ["logits", "cut"])
@pytest.mark.parametrize("name", ["laplace", "discrete"])
def test_the_dispatched_gradient_is_gradperturb_of_the_release_not_its_posterior(
    name, placement, prior
):
    # Prepare: the gradient of the release's unbiased coefficients through the
    # top model as it is before the step, and that of the posterior
    mech = make_mechanism(name, epsilon=1.0)
    party = _party(mech, placement, denoise="posterior", denoise_prior=prior)
    ids, emb = _batches(1)[0]
    noisy = draw_noisy_labels(
        mech, party.labels[ids], ids, NoiseKey.from_seed(3), STREAM_TRANSCRIPT
    )
    unbiased = unbiased_coefficients(mechanism=mech, coefficients=noisy.coefficients)
    release, _ = logits_placement_backward(
        copy.deepcopy(party.top), emb, NoisyLabels(unbiased)
    )
    with torch.no_grad():
        logits = party.top(emb)
    posterior = posterior_coefficients(
        mechanism=mech, coefficients=noisy.coefficients, prior=model_prior(logits)
    )
    of_posterior, _ = logits_placement_backward(
        copy.deepcopy(party.top), emb, NoisyLabels(posterior)
    )

    # Execute
    sent = party.train_step(ids, emb)

    # Assert
    torch.testing.assert_close(sent, release, rtol=1e-5, atol=1e-8)
    assert (sent - of_posterior).abs().max() > 1e-4


def test_default_none_is_bitwise_the_noisy_labels():
    mech = make_mechanism("laplace", epsilon=1.0)
    default, explicit = _party(mech), _party(mech, denoise="none")
    for ids, emb in _batches():
        assert torch.equal(default.train_step(ids, emb), explicit.train_step(ids, emb))


def test_extreme_logits_still_send_finite_gradients():
    mech = make_mechanism("laplace", epsilon=1.0)
    party = _party(mech, denoise="posterior")
    with torch.no_grad():
        for p in party.top.parameters():
            p.mul_(1e3)  # logits of order 1e4..1e6: sigmoid saturates
    for ids, emb in _batches(2):
        assert torch.isfinite(party.train_step(ids, emb * 100)).all()


def test_non_finite_coefficients_fail_closed_and_update_nothing(monkeypatch):
    # Prepare
    mech = make_mechanism("laplace", epsilon=1.0)
    party = _party(mech, denoise="posterior")
    before = copy.deepcopy(party.top.state_dict())
    real = party._noisy

    def poisoned(*args, **kwargs):
        noisy = real(*args, **kwargs)
        noisy.coefficients[0, 0] = np.nan
        return noisy

    monkeypatch.setattr(party, "_noisy", poisoned)
    ids, emb = _batches(1)[0]
    # Execute / Assert
    with pytest.raises(PrivacyError, match="not finite"):
        party.train_step(ids, emb)
    for key, value in party.top.state_dict().items():
        assert torch.equal(value, before[key])
    assert party.steps == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"denoise": "bayes"}, "denoise must be one of none, posterior"),
        ({"denoise_prior": "flat"}, "denoise_prior must be one of model, frequency"),
    ],
)
def test_unknown_choices_are_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        _party(make_mechanism("laplace", epsilon=1.0), **kwargs)


# ------------------------------------------------------------ the audit ceiling
@pytest.mark.parametrize(
    ("mechanism", "prior"),
    [("laplace", "frequency"), ("discrete", "frequency"), ("laplace", "model")],
)
def test_posterior_transcript_stays_within_the_dp_ceiling(tmp_path, mechanism, prior):
    # Execute: breast cancer, eps = 1, the transcript audited every epoch
    code = main(
        [
            "simulate",
            "--dataset",
            "breast-cancer",
            "--epochs",
            "3",
            "--mechanism",
            mechanism,
            "--epsilon",
            "1",
            "--noise-seed",
            "2",
            "--denoise",
            "posterior",
            "--denoise-prior",
            prior,
            "--out-dir",
            str(tmp_path),
        ]
    )
    # Assert: no attack of any epoch or party is above its ceiling (4 SE rule);
    # with a posterior-trained top model the ceiling knows each sample's
    # prediction, as the white-box attacker does, and is at least the plain one
    assert code == 0
    history = json.loads((tmp_path / "results.json").read_text())["history"]
    assert len(history) == 3
    for epoch in history:
        attack = epoch["attack_auc"]
        assert attack["auc_bound_without_prior"] == pytest.approx(0.7311, abs=1e-4)
        assert 0.7311 <= attack["auc_bound"] < 1.0
        for report in [attack, *attack["by_party"]]:
            assert ABOVE not in report["ceiling_verdict"].values(), report
