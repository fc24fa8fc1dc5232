import itertools
import math

import numpy as np
import pytest

from tpsl_flwr.privacy.closed_forms import (
    auc_bound,
    sda_auc_gaussian,
    sda_auc_laplace,
    sda_top1_gaussian,
    sda_top1_laplace,
    sda_top1_randomized_response,
    top1_bound,
)

RNG = np.random.default_rng(2024)
N = 400_000


def test_golden_values_from_the_issue():
    assert sda_auc_laplace(1.0) == pytest.approx(0.7241, abs=1e-4)
    assert auc_bound(1.0) == pytest.approx(0.7311, abs=1e-4)
    assert sda_top1_randomized_response(2.0, 10) == pytest.approx(0.4509, abs=1e-4)
    assert top1_bound(2.0, 0.1) == pytest.approx(0.4509, abs=1e-4)


def test_laplace_auc_formula_against_monte_carlo():
    # AUC = P(u + u' < 1) for iid Lap(1/eps); standard error ~ 0.0007.
    for eps in (0.5, 1.0, 2.0):
        u = RNG.laplace(scale=1 / eps, size=(N, 2))
        assert np.mean(u.sum(axis=1) < 1) == pytest.approx(
            sda_auc_laplace(eps), abs=0.003
        )


def test_multiclass_integrals_against_monte_carlo():
    k = 6
    for eps in (1.0, 4.0):
        c = RNG.laplace(scale=2 / eps, size=(N // 4, k))
        c[:, 0] += 1
        assert np.mean(c.argmax(axis=1) == 0) == pytest.approx(
            sda_top1_laplace(eps, k), abs=0.005
        )
    r = RNG.normal(scale=0.8, size=(N // 4, k))
    correct = np.all(r[:, 1:] - r[:, :1] > -1, axis=1)
    assert correct.mean() == pytest.approx(sda_top1_gaussian(0.8, k), abs=0.005)
    r2 = RNG.normal(scale=0.8, size=(N, 2))
    assert np.mean(r2[:, 1] - r2[:, 0] < 1) == pytest.approx(
        sda_auc_gaussian(0.8), abs=0.003
    )


def test_bounds_are_monotone_and_limits():
    eps = np.linspace(0.01, 10, 50)
    bounds = [auc_bound(e) for e in eps]
    assert all(a < b for a, b in itertools.pairwise(bounds))
    assert auc_bound(1e-9) == pytest.approx(0.5)
    assert auc_bound(math.inf) == 1.0
    # Laplace's SDA AUC never exceeds the ceiling of any attack.
    assert all(sda_auc_laplace(e) <= auc_bound(e) for e in eps)
    assert top1_bound(1e-9, 0.25) == pytest.approx(0.25)
