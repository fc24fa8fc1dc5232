"""The white-box residual attack: what a label-shaped noise leaves off the plane.

Marvell (Li et al. 2022) gives isotropic noise to the class of smaller
gradient variance only; a received gradient's energy outside the plane of its
own ``g_1 - g_0`` and its batch's top direction then tells the classes apart,
whatever the power. GradPerturb's label mixing stays in the plane, so the
same score carries nothing there.
"""

import numpy as np
import pytest

from tpsl_flwr.attacks.ceiling import pooled_auc_standard_error
from tpsl_flwr.attacks.metrics import pooled_auc
from tpsl_flwr.attacks.report import BatchRecord, attack_report
from tpsl_flwr.attacks.sda import sda_residual_scores
from tpsl_flwr.privacy.closed_forms import sda_auc_laplace
from tpsl_flwr.privacy.gradient_noise import perturb_gradients
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import make_mechanism
from tpsl_flwr.privacy.noisy_labels import draw_noisy_labels

N, D, BATCHES = 256, 16, 24


def _batches(seed=0):
    """Per-sample logit gradients ``(p - y) J_i``: each rank one, as at the logits."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=D)
    for b in range(BATCHES):
        y = (rng.random(N) < 0.25).astype(np.int64)
        jac = base + 0.5 * rng.normal(size=(N, D))
        p = 1.0 / (1.0 + np.exp(-rng.normal(-1.0, 1.0, size=N)))
        cand = np.stack([p[:, None] * jac, (p - 1.0)[:, None] * jac], axis=1)
        yield b, y, cand


def _marvell_epoch(power):
    mechanism, key, reference = (
        make_mechanism("marvell", marvell_power=power),
        None,
        None,
    )
    key = NoiseKey.from_seed(3)
    records = []
    for b, y, cand in _batches():
        ids = np.arange(N) + b * N
        clean = cand[np.arange(N), y]
        noisy, reference = perturb_gradients(
            mechanism, clean, y, ids=ids, key=key, stream=b + 1, reference=reference
        )
        records.append(BatchRecord(ids, noisy / N, y, cand))
    return records


@pytest.mark.parametrize("power", [1.0, 4.0])
def test_marvell_is_read_off_the_plane_whatever_its_power(power):
    # Execute
    report = attack_report(_marvell_epoch(power))
    # Assert: the coordinate SDA reads a fraction of the labels; the
    # residual reads almost all of them (measured 1.000 at both powers; SE
    # below 0.001 over 6144 rows, tolerance 0.01).
    assert report["sda"] < 0.85
    assert report["sda_residual"] > 0.99
    assert report["sda_residual"] - report["sda"] > 0.15


def test_gradperturb_leaves_nothing_off_the_plane():
    # Prepare: Laplace at eps 1 mixes g_0 and g_1: every received gradient
    # lies in its own candidates' span (float64, no transport rounding).
    laplace, key = make_mechanism("laplace", epsilon=1.0), NoiseKey.from_seed(4)
    labels, scores = [], []
    for b, y, cand in _batches(seed=1):
        ids = np.arange(N) + b * N
        c = draw_noisy_labels(laplace, y, ids, key, 1).coefficients
        got = np.einsum("nk,nkd->nd", c, cand)
        labels.append(y)
        scores.append(sda_residual_scores(got, cand))
    y, s = np.concatenate(labels), np.concatenate(scores)
    # Execute
    auc = pooled_auc(y, s)
    # Assert: within 4 SE of chance, far below the eps-1 closed form.
    se = pooled_auc_standard_error(0.5, int(y.sum()), int(y.size - y.sum()))
    assert abs(max(auc, 1 - auc) - 0.5) < 4 * se
    assert max(auc, 1 - auc) < sda_auc_laplace(1.0)
