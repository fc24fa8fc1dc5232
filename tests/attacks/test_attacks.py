"""Label-inference attacks on gradients whose answer is known, and their metrics."""

import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from tpsl_flwr.attacks import (
    BatchRecord,
    attack_report,
    batch_aucs,
    clustering_scores,
    cosine_scores,
    model_completion_probabilities,
    model_completion_scores,
    norm_scores,
    per_batch_auc,
    per_batch_top1,
    per_sample_gradients,
    pooled_auc,
    sda_predictions,
    sda_scores,
    spectral_direction,
    spectral_scores,
    top1_accuracy,
)
from tpsl_flwr.attacks.spectral import smaller_cluster_is_low
from tpsl_flwr.errors import ConfigError

# Under the null (scores independent of labels) the AUC of n = 20k samples has a
# standard error <= sqrt((n + 1) / (12 n1 n0)) ~ 0.0041 at a 50/50 split: 0.02
# is ~5 standard errors.
NULL_SAMPLES = 20_000
NULL_TOLERANCE = 0.02


def logistic_gradients(rng, n, d=8, positive_rate=0.1):
    """Cut-layer gradients of a logistic top layer: g_j = (sigmoid(z) - j) w."""
    y = (rng.random(n) < positive_rate).astype(np.int64)
    w = rng.normal(size=d)
    z = rng.normal(size=n) - 1.0
    p = 1.0 / (1.0 + np.exp(-z))
    candidates = np.stack([np.outer(p, w), np.outer(p - 1.0, w)], axis=1)
    return candidates[np.arange(n), y], y, candidates


def softmax_gradients(rng, n, d=6, k=4):
    """Candidate gradients W^T (p - e_j) of a linear softmax top layer."""
    y = rng.integers(0, k, n)
    weights = rng.normal(size=(k, d))
    logits = rng.normal(size=(n, k))
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    candidates = (p[:, None, :] - np.eye(k)[None, :, :]) @ weights
    return candidates[np.arange(n), y], y, candidates


def null_data(rng, d=8):
    y = rng.integers(0, 2, NULL_SAMPLES)
    return rng.normal(size=(NULL_SAMPLES, d)), y


def batches_of(gradients, labels, candidates=None, size=64, ids=None):
    ids = np.arange(labels.size) if ids is None else ids
    out = []
    for start in range(0, labels.size, size):
        part = slice(start, start + size)
        n = labels[part].size
        out.append(
            BatchRecord(
                ids[part],
                gradients[part] / n,  # as a message carries it
                labels[part],
                None if candidates is None else candidates[part],
            )
        )
    return out


# ----------------------------------------------------------------- the scorers
def test_norm_attack_separates_larger_positive_gradients():
    # Prepare
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 500)
    directions = rng.normal(size=(500, 4))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    radius = np.where(y == 1, rng.uniform(1.0, 2.0, 500), rng.uniform(0.1, 0.5, 500))
    # Execute
    scores = norm_scores(directions * radius[:, None])
    # Assert
    assert scores == pytest.approx(radius)
    assert pooled_auc(y, scores) == 1.0


def test_logistic_top_layer_is_fully_broken_by_cosine_spectral_and_sda():
    # Prepare
    g, y, candidates = logistic_gradients(np.random.default_rng(1), 2000)
    first_positive = int(np.flatnonzero(y == 1)[0])
    # Execute
    cosine = cosine_scores(g, first_positive)
    spectral = spectral_scores(g)  # cluster-size orientation, 10% positives
    sda = sda_scores(g, candidates)
    # Assert
    assert pooled_auc(y, cosine) == 1.0
    assert pooled_auc(y, spectral) == 1.0
    assert pooled_auc(y, sda) == 1.0
    np.testing.assert_array_equal(sda_predictions(g, candidates), y)
    assert pooled_auc(y, norm_scores(g)) > 0.9  # positives are misclassified


def test_cosine_takes_an_index_or_a_vector_and_is_scale_free():
    g, _, _ = logistic_gradients(np.random.default_rng(2), 300)
    by_index = cosine_scores(g, 5)
    np.testing.assert_allclose(cosine_scores(g, g[5] * 7.0), by_index)
    np.testing.assert_allclose(cosine_scores(g / 64.0, 5), by_index)
    assert cosine_scores([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]], 1)[0] == 0.0


def test_spectral_size_rule_is_sign_invariant_and_known_positive_orients():
    # Prepare: balanced labels, where the size rule has nothing to go on.
    g, y, _ = logistic_gradients(np.random.default_rng(3), 1000, positive_rate=0.5)
    imbalanced, y_imb, _ = logistic_gradients(np.random.default_rng(4), 1000)
    positive = int(np.flatnonzero(y == 1)[0])
    # Execute / Assert: the known positive orients, as an index or a vector.
    assert pooled_auc(y, spectral_scores(g, positive)) == 1.0
    assert pooled_auc(y, spectral_scores(-g, positive)) == 1.0
    assert pooled_auc(y, spectral_scores(g, g[positive])) == 1.0
    # The size rule does not depend on the sign of the gradients.
    assert pooled_auc(y_imb, spectral_scores(imbalanced)) == 1.0
    assert pooled_auc(y_imb, spectral_scores(-imbalanced)) == 1.0


def test_spectral_direction_orients_small_batches_with_heavy_tailed_noise():
    # Prepare: an epoch of 10% positives whose transcript carries Laplace noise
    # at the logit (y~ = y + u(1 - 2y)); batches of 64 hold ~6 positives.
    rng = np.random.default_rng(17)
    n, d = 6400, 8
    y = (rng.random(n) < 0.1).astype(np.int64)
    w = rng.normal(size=d)
    p = 1.0 / (1.0 + np.exp(-(rng.normal(size=n) - 2.0)))
    noisy = y + rng.laplace(scale=1.0, size=n) * (1 - 2 * y)
    g = np.outer(p - noisy, w)
    direction = spectral_direction(g)
    labels, parts = np.split(y, 100), np.split(g, 100)
    # Execute
    guided = batch_aucs(
        labels, [spectral_scores(b, direction=direction) for b in parts]
    )
    alone = batch_aucs(labels, [spectral_scores(b) for b in parts])
    # Assert: the size rule in a batch of 64 is nearly a coin flip (~0.5-0.55 on
    # average, ~45 batches below 0.5); the epoch's direction gives each batch
    # the pooled AUC (~0.73, as the Laplace SDA's 0.72 at epsilon = 1).
    pooled = pooled_auc(y, g @ direction)
    assert pooled > 0.68
    assert np.nanmean(guided) == pytest.approx(pooled, abs=0.03)
    assert np.nanmean(alone) < pooled - 0.1
    assert np.sum(guided < 0.5) < np.sum(alone < 0.5)
    with pytest.raises(ConfigError, match="not both"):
        spectral_scores(g, 0, direction=direction)


def test_smaller_cluster_rule():
    assert smaller_cluster_is_low(np.array([-9.0, 0.0, 0.1, 0.2]))
    assert smaller_cluster_is_low(np.array([0.0, 0.1, 0.2, 9.0])) is False
    assert smaller_cluster_is_low(np.array([0.0, 0.0, 1.0, 1.0])) is None
    assert smaller_cluster_is_low(np.ones(5)) is None


def test_isotropic_noise_gives_chance_auc():
    # Prepare
    rng = np.random.default_rng(5)
    g, y = null_data(rng)
    candidates = rng.normal(size=(NULL_SAMPLES, 2, g.shape[1]))
    # Execute
    aucs = {
        "norm": pooled_auc(y, norm_scores(g)),
        "cosine": pooled_auc(y, cosine_scores(g, int(np.argmax(y)))),
        "spectral": pooled_auc(y, spectral_scores(g)),
        "sda": pooled_auc(y, sda_scores(g, candidates)),
        "clustering": pooled_auc(y, clustering_scores(g, n_init=1)),
    }
    # Assert
    for name, auc in aucs.items():
        assert auc == pytest.approx(0.5, abs=NULL_TOLERANCE), name


def test_per_sample_gradients_undo_the_batch_average():
    np.testing.assert_allclose(per_sample_gradients([[0.5, -1.0]], 4), [[2.0, -4.0]])


# ------------------------------------------------------ population-level attacks
def mixture(rng, n, positive_rate=0.1, d=5, gap=4.0):
    y = (rng.random(n) < positive_rate).astype(np.int64)
    centre = np.zeros(d)
    centre[0] = gap
    return rng.normal(size=(n, d)) + np.outer(y, centre), y


@pytest.mark.parametrize("head", ["logistic", "mlp"])
def test_model_completion_with_a_few_dozen_labels(head):
    # Prepare
    rng = np.random.default_rng(6)
    emb, y = mixture(rng, 3000, positive_rate=0.3)
    known = np.concatenate([np.flatnonzero(y == 1)[:20], np.flatnonzero(y == 0)[:20]])
    unknown = np.setdiff1d(np.arange(y.size), known)
    # Execute
    scores = model_completion_scores(emb, known, y[known], head=head, seed=0)
    # Assert
    assert pooled_auc(y[unknown], scores[unknown]) > 0.95


def test_model_completion_multiclass_and_absent_class():
    rng = np.random.default_rng(7)
    emb = rng.normal(size=(200, 3))
    known = np.arange(30)
    labels = np.arange(30) % 3  # classes 0, 1, 2 of k = 4
    probs = model_completion_probabilities(emb, known, labels, classes=4)
    assert probs.shape == (200, 4)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    assert np.all(probs[:, 3] == 0.0)


def test_model_completion_on_noise_is_chance():
    rng = np.random.default_rng(8)
    emb, y = null_data(rng, d=4)
    known = np.arange(50)
    unknown = np.arange(50, y.size)
    scores = model_completion_scores(emb, known, y[known])
    assert pooled_auc(y[unknown], scores[unknown]) == pytest.approx(
        0.5, abs=NULL_TOLERANCE
    )


def test_clustering_by_size_or_by_known_positive():
    rng = np.random.default_rng(9)
    emb, y = mixture(rng, 1000, positive_rate=0.1)
    assert pooled_auc(y, clustering_scores(emb, n_init=2)) > 0.99
    balanced, yb = mixture(rng, 1000, positive_rate=0.5, gap=6.0)
    positive, negative = int(np.argmax(yb == 1)), int(np.argmax(yb == 0))
    assert pooled_auc(yb, clustering_scores(balanced, positive, n_init=2)) > 0.99
    # A wrong "known positive" turns the attack around.
    assert pooled_auc(yb, clustering_scores(balanced, negative, n_init=2)) < 0.01


# --------------------------------------------------------------------- metrics
def test_batch_aucs_equal_sklearn_per_batch_with_ties_and_ragged_sizes():
    # Prepare
    rng = np.random.default_rng(10)
    sizes = [64, 64, 64, 17, 64, 5, 1]
    labels = [rng.integers(0, 2, s) for s in sizes]
    labels[2][:] = 1  # a single-class batch
    scores = [rng.integers(0, 6, s).astype(float) for s in sizes]  # many ties
    # Execute
    aucs = batch_aucs(labels, scores)
    stats = per_batch_auc(labels, scores)
    # Assert
    for y, s, auc in zip(labels, scores, aucs, strict=True):
        if 0 < y.sum() < y.size:
            assert auc == pytest.approx(roc_auc_score(y, s), abs=1e-12)
        else:
            assert math.isnan(auc)
    kept = aucs[~np.isnan(aucs)]
    assert stats.skipped == int(np.isnan(aucs).sum()) >= 2
    assert stats.evaluated == kept.size
    assert stats.mean == pytest.approx(kept.mean())
    assert stats.p95 == pytest.approx(np.percentile(kept, 95))


def test_pooled_auc_is_sklearns_and_nan_for_one_class():
    rng = np.random.default_rng(11)
    y, s = rng.integers(0, 2, 100), rng.normal(size=100)
    assert pooled_auc(y, s) == pytest.approx(roc_auc_score(y, s))
    assert math.isnan(pooled_auc(np.ones(5, dtype=int), np.arange(5.0)))


def test_all_batches_single_class():
    stats = per_batch_auc([np.zeros(3, int), np.ones(2, int)], [np.ones(3), np.ones(2)])
    assert stats.skipped == 2 and stats.evaluated == 0
    assert math.isnan(stats.mean) and math.isnan(stats.p95)


def test_top1():
    assert top1_accuracy([0, 1, 2, 2], [0, 1, 1, 2]) == 0.75
    stats = per_batch_top1([[0, 1], [2, 2]], [[0, 1], [1, 2]])
    assert stats.mean == 0.75 and stats.skipped == 0


# ---------------------------------------------------------------- the report
def test_report_on_an_unprotected_logistic_transcript():
    # Prepare: ragged batches (the last one smaller) and a single-class batch.
    rng = np.random.default_rng(12)
    g, y, candidates = logistic_gradients(rng, 1000)
    y[:64] = 0  # the first batch holds negatives only
    g[:64] = candidates[:64, 0]
    ids = rng.permutation(5000)[:1000]
    batches = batches_of(g, y, candidates, size=64, ids=ids)
    # Execute
    report = attack_report(batches)
    # Assert
    assert report["classes"] == 2
    assert report["samples"] == 1000 and report["batches"] == 16
    for name in ("cosine", "spectral", "sda"):
        assert report[name] == 1.0, name
        assert report["per_batch"][name]["mean"] == 1.0, name
        assert report["per_batch"][name]["p95"] == 1.0, name
    assert report["norm"] > 0.9
    assert report["cosine_positive_id"] == int(ids[np.flatnonzero(y == 1)[0]])
    skipped = sum(1 for b in batches if np.unique(b.labels).size < 2)
    assert skipped >= 1
    for stats in report["per_batch"].values():
        assert stats["skipped"] == skipped
        assert stats["evaluated"] == 16 - skipped


def test_report_spectral_orientation_by_known_positive_on_balanced_labels():
    g, y, _ = logistic_gradients(np.random.default_rng(18), 1024, positive_rate=0.5)
    report = attack_report(batches_of(g, y), spectral="known-positive")
    assert report["spectral"] == 1.0
    assert report["per_batch"]["spectral"]["mean"] == 1.0


def test_report_undoes_batch_averaging_before_pooling():
    # Prepare: equal per-sample norms for each class, in batches of two sizes.
    # Pooled without undoing the average, the small batch's negatives would
    # outscore the big batch's positives.
    y = np.array([0, 1] * 8 + [0, 1])
    g = np.where(y[:, None] == 1, 2.0, 1.0) * np.ones((18, 3))
    batches = [
        BatchRecord(np.arange(16), g[:16] / 16, y[:16]),
        BatchRecord(np.arange(16, 18), g[16:] / 2, y[16:]),
    ]
    # Execute / Assert
    assert attack_report(batches)["norm"] == 1.0


def test_report_sda_matches_randomized_response_closed_form():
    # Prepare: binary randomized response at epsilon = 1 on the transcript.
    rng = np.random.default_rng(13)
    epsilon = 1.0
    n = NULL_SAMPLES
    _, y, candidates = logistic_gradients(rng, n, positive_rate=0.5)
    flip = rng.random(n) < 1.0 / (1.0 + math.exp(epsilon))
    sent = candidates[np.arange(n), np.where(flip, 1 - y, y)]
    # Execute
    report = attack_report(batches_of(sent, y, candidates, size=256))
    # Assert: e^eps / (1 + e^eps) = 0.7311 (the ceiling of any attack).
    ceiling = math.exp(epsilon) / (1.0 + math.exp(epsilon))
    assert report["sda"] == pytest.approx(ceiling, abs=NULL_TOLERANCE)
    assert report["cosine"] <= ceiling + NULL_TOLERANCE


def test_multiclass_report_has_sda_top1_only():
    g, y, candidates = softmax_gradients(np.random.default_rng(14), 500)
    report = attack_report(batches_of(g, y, candidates))
    assert report["classes"] == 4
    assert report["sda_top1"] == 1.0
    assert report["per_batch"]["sda_top1"]["mean"] == 1.0
    assert not {"norm", "cosine", "spectral", "sda"} & report.keys()
    without = attack_report(batches_of(g, y))
    assert without["sda_top1"] is None and without["per_batch"] == {}


def test_report_without_candidates_and_without_positives():
    g, y, _ = logistic_gradients(np.random.default_rng(15), 200)
    report = attack_report(batches_of(g, y))
    assert report["sda"] is None and "sda" not in report["per_batch"]
    negatives = attack_report(batches_of(g, np.zeros_like(y)))
    assert negatives["cosine_positive_id"] is None
    assert math.isnan(negatives["norm"]) and math.isnan(negatives["cosine"])


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda: norm_scores([[np.nan, 1.0]]), "NaN"),
        (lambda: norm_scores(np.zeros((2, 2, 2))), "shape (2, 2, 2)"),
        (lambda: cosine_scores(np.ones((3, 2)), 3), "got 3"),
        (lambda: cosine_scores(np.ones((3, 2)), [1.0, 2.0, 3.0]), "width 3"),
        (lambda: cosine_scores(np.ones((3, 2)), True), "True"),
        (lambda: cosine_scores(np.zeros((3, 2)), 0), "zero"),
        (lambda: spectral_scores(np.ones((1, 2))), "at least 2"),
        (lambda: per_sample_gradients(np.ones((2, 2)), 0), "batch_size"),
        (lambda: pooled_auc([0, 2], [0.1, 0.2]), "0 or 1"),
        (lambda: pooled_auc([0, 1], [0.1]), "one length"),
        (lambda: batch_aucs([[0, 1]], []), "1 batches"),
        (
            lambda: model_completion_scores(np.ones((4, 2)), [0, 1], [0, 1], head="x"),
            "'x'",
        ),
        (lambda: model_completion_scores(np.ones((4, 2)), [0, 1], [1, 1]), "two"),
        (lambda: model_completion_scores(np.ones((4, 2)), [0, 9], [0, 1]), "9"),
        (lambda: model_completion_scores(np.ones((4, 2)), [0, 0], [0, 1]), "once"),
        (lambda: model_completion_scores(np.ones((4, 2)), [0, 1], [0, 2]), "< cl"),
        (lambda: clustering_scores(np.ones((4, 2)), positive=4), "got 4"),
        (lambda: clustering_scores(np.ones((4, 2)), n_init=0), "n_init"),
        (lambda: attack_report([]), "none"),
        (lambda: attack_report([], spectral="up"), "'up'"),
        (lambda: attack_report([BatchRecord([0, 1], [[1.0]], [0, 1])]), "differ"),
        (lambda: attack_report([BatchRecord([0], [[1.0]], [3])], classes=2), "< cl"),
        (lambda: attack_report([BatchRecord([0], [[1.0]], [0.5])]), "integers"),
        (
            lambda: attack_report(
                [
                    BatchRecord([0], [[1.0]], [0], np.ones((1, 2, 1))),
                    BatchRecord([1], [[1.0]], [1]),
                ]
            ),
            "some batches",
        ),
        (
            lambda: attack_report(
                [BatchRecord([0], [[1.0]], [0]), BatchRecord([1], [[1.0, 2.0]], [1])]
            ),
            "width",
        ),
        (
            lambda: attack_report([BatchRecord([0], [[1.0]], [0], np.ones((1, 3)))]),
            "(n, k, d)",
        ),
    ],
)
def test_bad_input_is_a_config_error_naming_the_value(call, fragment):
    with pytest.raises(ConfigError, match=None) as info:
        call()
    assert fragment in str(info.value)
