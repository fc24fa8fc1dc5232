import numpy as np
import pytest
import torch
from torch import nn

from tpsl_flwr.errors import PrivacyError
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import make_mechanism
from tpsl_flwr.privacy.noisy_labels import (
    STREAM_CUT_GAUSSIAN,
    STREAM_TOP_UPDATE,
    NoisyLabels,
    draw_noisy_labels,
    one_hot,
)
from tpsl_flwr.privacy.perturb import (
    candidate_gradients,
    cut_placement_backward,
    logits_placement_backward,
)

KEY = NoiseKey.from_seed(99)


def _top(outputs, width=6, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(width, 16), nn.ReLU(), nn.Linear(16, outputs)
    ).double()


def _batch(n=64, width=6, k=2, seed=1):
    gen = np.random.default_rng(seed)
    emb = torch.as_tensor(gen.normal(size=(n, width)))
    return emb, gen.integers(0, k, size=n), np.arange(100, 100 + n)


def test_bce_logits_path_equals_gradperturb_from_explicit_g0_g1():
    # Prepare
    top = _top(1)
    emb, y, ids = _batch()
    mech = make_mechanism("laplace", epsilon=1.0)
    noisy = draw_noisy_labels(mech, y, ids, KEY)
    u = (noisy.coefficients[:, 1] - y) * (1 - 2 * y)
    # Execute
    dispatched, _ = logits_placement_backward(top, emb, noisy)
    g = candidate_gradients(top, emb).numpy()  # (n, 2, d)
    # Assert: g_y + u (g_{1-y} - g_y), averaged over the batch.
    rows = np.arange(len(y))
    g_y, g_other = g[rows, y], g[rows, 1 - y]
    expected = (g_y + u[:, None] * (g_other - g_y)) / len(y)
    np.testing.assert_allclose(dispatched.numpy(), expected, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("name", ["laplace", "discrete"])
def test_multiclass_logits_path_equals_sum_of_coefficients_times_g(name):
    k = 4
    top = _top(k)
    emb, y, ids = _batch(k=k)
    noisy = draw_noisy_labels(
        make_mechanism(name, epsilon=1.0, num_classes=k), y, ids, KEY
    )
    dispatched, _ = logits_placement_backward(top, emb, noisy)
    g = candidate_gradients(top, emb).numpy()
    expected = np.einsum("nk,nkd->nd", noisy.coefficients, g) / len(y)
    np.testing.assert_allclose(dispatched.numpy(), expected, rtol=1e-10, atol=1e-14)


def test_no_protection_equals_plain_bce_backprop():
    top = _top(1)
    emb, y, ids = _batch()
    noisy = draw_noisy_labels(make_mechanism("none"), y, ids, KEY)
    dispatched, _ = logits_placement_backward(top, emb, noisy)
    ours = [p.grad.clone() for p in top.parameters()]
    top.zero_grad()
    cut = emb.clone().requires_grad_(True)
    loss = nn.functional.binary_cross_entropy_with_logits(
        top(cut)[:, 0], torch.as_tensor(y, dtype=torch.float64)
    )
    loss.backward()
    np.testing.assert_allclose(dispatched.numpy(), cut.grad.numpy(), rtol=1e-10)
    for mine, ref in zip(ours, top.parameters(), strict=True):
        np.testing.assert_allclose(mine.numpy(), ref.grad.numpy(), rtol=1e-10)


def test_logits_top_update_uses_the_same_noise_as_the_transcript():
    top = _top(1)
    emb, y, ids = _batch()
    noisy = draw_noisy_labels(make_mechanism("laplace", epsilon=1.0), y, ids, KEY)
    logits_placement_backward(top, emb, noisy)
    ours = [p.grad.clone() for p in top.parameters()]
    top.zero_grad()
    # Reference: BCE with the soft label t = y + u(1 - 2y) (linear in the label).
    t = torch.as_tensor(noisy.coefficients[:, 1])
    z = top(emb)[:, 0]
    (nn.functional.softplus(z) - t * z).mean().backward()
    for mine, ref in zip(ours, top.parameters(), strict=True):
        np.testing.assert_allclose(mine.numpy(), ref.grad.numpy(), rtol=1e-9)


def test_cut_placement_uses_independent_noise_for_the_update():
    top = _top(1)
    emb, y, ids = _batch()
    mech = make_mechanism("laplace", epsilon=1.0)
    transcript = draw_noisy_labels(mech, y, ids, KEY)
    update = draw_noisy_labels(mech, y, ids, KEY, STREAM_TOP_UPDATE)
    dispatched, _ = cut_placement_backward(top, emb, transcript, update)
    cut_update = [p.grad.clone() for p in top.parameters()]
    g = candidate_gradients(top, emb).numpy()
    expected = np.einsum("nk,nkd->nd", transcript.coefficients, g) / len(y)
    np.testing.assert_allclose(dispatched.numpy(), expected, rtol=1e-10, atol=1e-14)
    # The top update is the logits-placement update under the *other* noise.
    top.zero_grad()
    logits_placement_backward(top, emb, update)
    for mine, ref in zip(cut_update, top.parameters(), strict=True):
        np.testing.assert_allclose(mine.numpy(), ref.grad.numpy(), rtol=1e-10)


def test_gaussian_at_the_cut_adds_isotropic_noise_to_g_y():
    top = _top(1)
    emb, y, ids = _batch()
    mech = make_mechanism("gaussian", sigma=0.3)
    transcript = draw_noisy_labels(
        mech, y, ids, KEY, STREAM_CUT_GAUSSIAN, additive_dim=6
    )
    update = draw_noisy_labels(mech, y, ids, KEY, STREAM_TOP_UPDATE)
    dispatched, _ = cut_placement_backward(top, emb, transcript, update)
    g = candidate_gradients(top, emb).numpy()
    g_y = g[np.arange(len(y)), y]
    expected = (g_y + transcript.additive) / len(y)
    np.testing.assert_allclose(dispatched.numpy(), expected, rtol=1e-10, atol=1e-14)


def test_fail_closed_on_mismatched_or_non_finite_noise():
    top = _top(1)
    emb, y, _ = _batch(n=4)
    with pytest.raises(PrivacyError, match="do not fit"):
        logits_placement_backward(top, emb, NoisyLabels(one_hot(y, 3)))
    bad = one_hot(y, 2)
    bad[0, 0] = np.nan
    with pytest.raises(PrivacyError, match="not finite"):
        logits_placement_backward(top, emb, NoisyLabels(bad))
    with pytest.raises(PrivacyError, match="Gaussian noise"):
        logits_placement_backward(
            top, emb, NoisyLabels(one_hot(y, 2), additive=np.zeros((4, 5)))
        )
