"""The white-box SDA's likelihood-ratio statistic against its closed forms.

Each transcript here is made by the real GradPerturb code (keyed noise,
``logits_placement_backward`` / ``cut_placement_backward``) through a top
model whose per-sample gradient scale ``||g_1 - g_0||`` spreads over an order
of magnitude, as a trained model's does. Statistical checks use 20,000
samples and a fixed key; the tolerance is 3 Hanley-McNeil standard errors
(about 0.013 at eps 1), or 0.01 for a top-1 accuracy (about 3 binomial SEs).
"""

import math

import numpy as np
import pytest
import torch

from tpsl_flwr.attacks import BatchRecord, attack_report
from tpsl_flwr.attacks.ceiling import pooled_auc_standard_error
from tpsl_flwr.attacks.metrics import pooled_auc, top1_accuracy
from tpsl_flwr.attacks.sda import (
    COORDINATE_RESOLUTION,
    label_coordinates,
    merge_close,
    sda_predictions,
    sda_scores,
    sda_statistic,
)
from tpsl_flwr.attacks.transcript_audit import TranscriptAudit
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.privacy.closed_forms import (
    sda_auc_gaussian,
    sda_auc_laplace,
    sda_auc_randomized_response,
)
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import make_mechanism
from tpsl_flwr.privacy.noisy_labels import draw_noisy_labels
from tpsl_flwr.privacy.perturb import (
    candidate_gradients,
    cut_placement_backward,
    logits_placement_backward,
)

SAMPLES = 20_000
WIDTH = 6
SIGMAS = 3.0


def _transcript(mechanism, *, placement="logits", seed=0):
    """Per-sample received gradients, candidates and labels of one big batch."""
    rng = np.random.default_rng(seed)
    labels = (rng.random(SAMPLES) < 0.3).astype(np.int64)
    torch.manual_seed(seed)
    top = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
    ).double()
    # Embedding scales spread over e^{+-2}: so do the per-sample gradients.
    scale = np.exp(rng.normal(size=(SAMPLES, 1)))
    emb = torch.as_tensor(rng.normal(size=(SAMPLES, WIDTH)) * scale)
    ids = np.arange(SAMPLES, dtype=np.int64)
    key = NoiseKey.from_seed(seed + 100)
    width = WIDTH if placement == "cut" and mechanism.additive else None
    noisy = draw_noisy_labels(mechanism, labels, ids, key, additive_dim=width)
    if placement == "logits":
        sent, _ = logits_placement_backward(top, emb, noisy)
    else:
        update = draw_noisy_labels(mechanism, labels, ids, key, stream=7)
        sent, _ = cut_placement_backward(top, emb, noisy, update)
    candidates = candidate_gradients(top, emb).numpy()
    return sent.numpy() * SAMPLES, candidates, labels, noisy


def _uniform_transcript(mechanism, seed=0):
    """k-class transcript at uniform predictions (the closed forms' setting).

    The top model ``z = (A e) (1 + ||e||^2)`` at embeddings ``e`` in the null
    space of ``A``: every logit is 0 (``p = 1/k``) and each sample's
    Jacobian is ``(1 + ||e||^2) A``, its scale spread over two orders of
    magnitude. ``A`` has orthonormal rows, so the logits' geometry (where
    the closed forms are stated) is the gradients'.
    """
    rng = np.random.default_rng(seed)
    k = mechanism.num_classes
    labels = rng.integers(0, k, size=SAMPLES)
    basis, _ = np.linalg.qr(rng.normal(size=(WIDTH, WIDTH)))
    a = torch.as_tensor(basis[:, :k].T.copy())

    def top(e):
        return (e @ a.T) * (1.0 + (e * e).sum(dim=1, keepdim=True))

    null = basis[:, k:].T
    emb = rng.normal(size=(SAMPLES, null.shape[0])) @ null
    emb *= np.exp(rng.normal(size=(SAMPLES, 1)))
    emb_t = torch.as_tensor(emb)
    ids = np.arange(SAMPLES, dtype=np.int64)
    noisy = draw_noisy_labels(mechanism, labels, ids, NoiseKey.from_seed(seed + 5))
    sent, _ = logits_placement_backward(top, emb_t, noisy)
    candidates = candidate_gradients(top, emb_t).numpy()
    return sent.numpy() * SAMPLES, candidates, labels


def _auc_and_se(labels, scores):
    auc = pooled_auc(labels, scores)
    positives = int(labels.sum())
    return auc, pooled_auc_standard_error(auc, positives, labels.size - positives)


# ------------------------------------------------------- the exact statistic
@pytest.mark.parametrize("placement", ["logits", "cut"])
def test_the_label_coordinate_is_the_released_label_exactly(placement):
    # Prepare: Laplace at eps 1 through a model with spread gradient scales.
    mechanism = make_mechanism("laplace", epsilon=1.0)
    sent, candidates, _, noisy = _transcript(mechanism, placement=placement)
    # Execute
    q = label_coordinates(sent, candidates)
    # Assert: q = c, the coefficients GradPerturb mixed (float64 arithmetic).
    np.testing.assert_allclose(q, noisy.coefficients, atol=1e-9)
    np.testing.assert_allclose(q.sum(axis=1), 1.0)


def test_k_class_coordinates_are_the_coefficients_up_to_the_prediction():
    # Prepare: a linear softmax top layer (any Jacobian A, any prediction p);
    # GradPerturb sends A^T (C p - c) with C = sum_j c_j (Algorithm 4).
    rng = np.random.default_rng(4)
    n, k = 500, 4
    weights = rng.normal(size=(k, WIDTH))
    logits = rng.normal(size=(n, k))
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    candidates = (p[:, None, :] - np.eye(k)[None, :, :]) @ weights
    c = np.eye(k)[rng.integers(0, k, n)] + rng.laplace(scale=2.0, size=(n, k))
    sent = np.einsum("nj,njd->nd", c, candidates)
    # Execute
    q = label_coordinates(sent, candidates)
    # Assert: q = c - (C - 1) p, which is c wherever C = 1 (randomized response).
    expected = c - (c.sum(axis=1, keepdims=True) - 1.0) * p
    np.testing.assert_allclose(q, expected, atol=1e-8)


def test_a_sample_without_gradient_is_no_evidence():
    candidates = np.zeros((2, 2, 3))
    candidates[1] = [[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]]
    sent = np.array([[0.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    assert sda_scores(sent, candidates).tolist() == [0.5, 1.0]


# ------------------------------------------------------ against closed forms
@pytest.mark.parametrize("epsilon", [1.0, 2.0, 4.0])
@pytest.mark.parametrize("placement", ["logits", "cut"])
def test_laplace_sda_is_its_closed_form_where_the_pooled_distance_falls_short(
    epsilon, placement
):
    # Prepare
    mechanism = make_mechanism("laplace", epsilon=epsilon)
    sent, candidates, labels, _ = _transcript(mechanism, placement=placement)
    expected = sda_auc_laplace(epsilon)
    # Execute
    auc, se = _auc_and_se(labels, sda_scores(sent, candidates))
    pooled, _ = _auc_and_se(labels, sda_scores(sent, candidates, statistic="distance"))
    # Assert: 1 - (2 + eps) e^-eps / 4 within 3 SE; the pooled distance, which
    # weighs each sample by ||g_1 - g_0||^2, is below the statistic.
    assert auc == pytest.approx(expected, abs=SIGMAS * se)
    assert pooled < auc


@pytest.mark.parametrize("epsilon", [1.0, 3.0])
def test_randomized_response_sda_is_its_closed_form(epsilon):
    mechanism = make_mechanism("discrete", epsilon=epsilon)
    sent, candidates, labels, noisy = _transcript(mechanism)
    scores = sda_scores(sent, candidates)
    # The statistic is the released label itself: exact ties, no float noise.
    assert np.unique(scores).size == 2
    np.testing.assert_allclose(scores, noisy.coefficients[:, 1], atol=1e-9)
    auc, se = _auc_and_se(labels, scores)
    assert auc == pytest.approx(sda_auc_randomized_response(epsilon), abs=SIGMAS * se)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
def test_gaussian_at_the_logits_is_its_closed_form(sigma):
    mechanism = make_mechanism("gaussian", sigma=sigma)
    assert sda_statistic(mechanism, "logits") == "coordinate"
    sent, candidates, labels, _ = _transcript(mechanism)
    auc, se = _auc_and_se(labels, sda_scores(sent, candidates))
    assert auc == pytest.approx(sda_auc_gaussian(sigma), abs=SIGMAS * se)


def test_gaussian_at_the_cut_layer_is_scored_by_the_distance():
    # Isotropic noise in gradient space: the likelihood ratio is the distance
    # difference, and the label coordinate (which ignores how far apart a
    # sample's candidates are) is the weaker attack there.
    mechanism = make_mechanism("gaussian", sigma=0.25)
    assert sda_statistic(mechanism, "cut") == "distance"
    sent, candidates, labels, _ = _transcript(mechanism, placement="cut")
    distance, se = _auc_and_se(
        labels, sda_scores(sent, candidates, statistic="distance")
    )
    coordinate, _ = _auc_and_se(labels, sda_scores(sent, candidates))
    assert distance > coordinate + SIGMAS * se


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("discrete", {"epsilon": 1.0}),
        ("laplace", {"epsilon": 2.0}),
        ("gaussian", {"sigma": 0.5}),
    ],
)
def test_multiclass_sda_top1_is_its_closed_form_at_uniform_predictions(name, kwargs):
    # Prepare: k = 4, every softmax output 1/4, gradient scales spread.
    mechanism = make_mechanism(name, num_classes=4, **kwargs)
    sent, candidates, labels = _uniform_transcript(mechanism)
    # Execute
    accuracy = top1_accuracy(labels, sda_predictions(sent, candidates))
    # Assert: e^eps/(e^eps+k-1), or the integrals of closed_forms.py.
    assert accuracy == pytest.approx(mechanism.expected_sda(), abs=0.01)


# ------------------------------------------------------- in the epoch report
def test_the_report_scores_the_statistic_and_keeps_the_pooled_distance():
    mechanism = make_mechanism("laplace", epsilon=2.0)
    sent, candidates, labels, _ = _transcript(mechanism)
    batches = [
        BatchRecord(
            np.arange(start, start + 500),
            sent[start : start + 500] / 500,
            labels[start : start + 500],
            candidates[start : start + 500],
        )
        for start in range(0, SAMPLES, 500)
    ]
    report = attack_report(batches)
    expected = sda_auc_laplace(2.0)
    assert report["sda"] == pytest.approx(
        expected, abs=SIGMAS * report["standard_error"]["sda"]
    )
    assert report["sda_pooled"] < report["sda"]
    assert report["direction"]["sda"] == "as scored"
    distance = attack_report(batches, sda_statistic="distance")
    assert distance["sda"] == distance["sda_pooled"] == report["sda_pooled"]
    with pytest.raises(ConfigError, match="'nearest'"):
        attack_report(batches, sda_statistic="nearest")


class _Party:
    """The least a label party shows the audit: a top model, labels, a mechanism."""

    def __init__(self, mechanism, placement):
        torch.manual_seed(0)
        self.top = torch.nn.Sequential(
            torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
        )
        self.labels = np.array([0, 1] * 100, dtype=np.int8)
        self.mechanism, self.placement, self.denoise = mechanism, placement, "none"
        self.noise = torch.Generator().manual_seed(1)

    def train_step(self, sample_ids, embeddings, epoch=0):
        candidates = candidate_gradients(self.top, embeddings)
        sent = candidates[torch.as_tensor(sample_ids), self.labels[sample_ids]]
        sent = sent + torch.randn(sent.shape, generator=self.noise)
        return sent / len(sample_ids)


@pytest.mark.parametrize(
    ("mechanism", "placement", "statistic"),
    [
        (make_mechanism("gaussian", sigma=1.0), "cut", "distance"),
        (make_mechanism("gaussian", sigma=1.0), "logits", "coordinate"),
        (make_mechanism("laplace", epsilon=1.0), "cut", "coordinate"),
    ],
)
def test_the_transcript_audit_takes_the_statistic_of_the_mechanism(
    mechanism, placement, statistic
):
    # Prepare
    party = _Party(mechanism, placement)
    audit = TranscriptAudit([(0, 2)])
    ids = np.arange(200)
    scales = torch.exp(torch.randn(200, 1, generator=torch.Generator().manual_seed(2)))
    # Execute: one step of 200 rows, then the epoch's report.
    audit.step(party, ids, scales * torch.randn(200, 2), epoch=0)
    report = audit.epoch_report(None)
    # Assert: the distance is the SDA only for the Gaussian at the cut layer.
    assert audit.statistic == statistic
    assert (report["sda"] == report["sda_pooled"]) == (statistic == "distance")
    with pytest.raises(ConfigError, match="'x'"):
        TranscriptAudit([(0, 2)], statistic="x")


# ------------------------------------------------------------ float ties
def test_float_rounding_does_not_break_the_ties_of_a_release():
    # Randomized response through float32: every t is 0 or 1 up to rounding;
    # broken at random by it, the ties would add variance to the AUC.
    rng = np.random.default_rng(3)
    n = 8000
    labels = (rng.random(n) < 0.25).astype(np.int64)
    released = np.where(rng.random(n) < 1 / (1 + math.e), 1 - labels, labels)
    direction = rng.normal(size=(n, 4)) * np.exp(rng.normal(size=(n, 1)))
    s = rng.random(n)[:, None]
    candidates = np.stack([s * direction, (s - 1) * direction], axis=1)
    sent = ((s - released[:, None]) * direction).astype(np.float32)
    scores = sda_scores(sent, candidates.astype(np.float32))
    assert np.unique(scores).size == 2
    assert pooled_auc(labels, scores) == pooled_auc(labels, released.astype(float))
    merged = merge_close(np.array([0.3, 0.3 + COORDINATE_RESOLUTION / 10, 0.31]), 1e-5)
    assert merged.tolist() == [0.3, 0.3, 0.31]
    # Exact (float64) gradients: nothing merged.
    exact = sda_scores(sent.astype(np.float64), candidates, resolution=0.0)
    assert np.unique(exact).size > 2


def test_bad_statistic_names_the_value():
    with pytest.raises(ConfigError, match="'median'"):
        sda_scores(np.ones((1, 1)), np.ones((1, 2, 1)), statistic="median")
    with pytest.raises(ConfigError, match="'top'"):
        sda_statistic(make_mechanism("laplace", epsilon=1.0), "top")
    with pytest.raises(ConfigError, match="-1"):
        sda_scores(np.ones((1, 1)), np.ones((1, 2, 1)), resolution=-1.0)
    with pytest.raises(ConfigError, match="k >= 2"):
        label_coordinates(np.ones((1, 1)), np.ones((1, 1, 1)))
