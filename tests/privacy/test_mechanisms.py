import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import (
    MECHANISMS,
    GaussianPerturb,
    LaplacePerturb,
    NoProtection,
    RandomizedResponse,
    make_mechanism,
)

epsilons = st.floats(min_value=1e-3, max_value=50.0)
classes = st.integers(min_value=2, max_value=100)


KEY = NoiseKey.from_seed(0)


def test_golden_parameters():
    assert make_mechanism("laplace", epsilon=1.0).scale == 1.0
    assert make_mechanism("laplace", epsilon=0.5, num_classes=10).scale == 4.0
    rr = make_mechanism("discrete", epsilon=1.0)
    assert rr.flip_probability == pytest.approx(1 / (1 + math.e))
    krr = make_mechanism("discrete", epsilon=2.0, num_classes=10)
    assert krr.keep_probability == pytest.approx(0.450853, abs=1e-6)
    assert make_mechanism("gaussian", sigma=2.0).logit_l2_sensitivity == 1.0
    g10 = make_mechanism("gaussian", sigma=2.0, num_classes=10)
    assert g10.logit_l2_sensitivity == pytest.approx(math.sqrt(2))
    assert isinstance(make_mechanism("none"), NoProtection)
    assert make_mechanism("none").epsilon == math.inf


@given(epsilons, classes)
def test_randomized_response_probabilities(eps, k):
    rr = RandomizedResponse(num_classes=k, eps=eps)
    assert 1.0 / k <= rr.keep_probability <= 1.0
    assert rr.keep_probability + rr.flip_probability == pytest.approx(1.0)
    # The dp-accounting parametrisation describes the same channel.
    q = rr.uniform_noise_parameter
    assert 1 - q + q / k == pytest.approx(rr.keep_probability)
    # The likelihood ratio of keeping vs one particular other label is e^eps.
    ratio = rr.keep_probability / (rr.flip_probability / (k - 1))
    assert math.log(ratio) == pytest.approx(eps, rel=1e-9)


@given(epsilons)
def test_binary_flip_probability_in_half_interval(eps):
    assert 0.0 < RandomizedResponse(eps=eps).flip_probability < 0.5


@given(epsilons, classes)
def test_laplace_scale_times_epsilon_is_sensitivity(eps, k):
    lap = LaplacePerturb(num_classes=k, eps=eps)
    assert lap.scale * eps == pytest.approx(lap.l1_sensitivity)


@pytest.mark.parametrize(
    "bad", [0, 0.0, -1.0, float("nan"), float("inf"), "1", None, True]
)
@pytest.mark.parametrize("name", ["laplace", "discrete"])
def test_bad_epsilon_names_the_value(name, bad):
    with pytest.raises(ConfigError, match="epsilon"):
        make_mechanism(name, epsilon=bad)


@pytest.mark.parametrize("bad", [0.0, -0.5, float("nan"), float("inf")])
def test_bad_sigma_names_the_value(bad):
    with pytest.raises(ConfigError, match=f"sigma must be > 0 and finite, got {bad}"):
        GaussianPerturb(sigma=bad)


@pytest.mark.parametrize("bad", [1, 0, -3, 2.5, "2"])
def test_bad_classes(bad):
    with pytest.raises(ConfigError, match="classes must be an integer >= 2"):
        make_mechanism("laplace", epsilon=1.0, num_classes=bad)


def test_unknown_mechanism_lists_valid_names():
    with pytest.raises(ConfigError) as info:
        make_mechanism("lapalce", epsilon=1.0)
    message = str(info.value)
    assert "'lapalce'" in message
    for name in MECHANISMS:
        assert name in message


def test_each_mechanism_takes_its_parameter_and_ignores_the_other():
    # One config-driven call works for every mechanism (epsilon and sigma are
    # both in a run config); a missing parameter the mechanism takes is named.
    with pytest.raises(ConfigError, match="mechanism 'laplace' needs epsilon"):
        make_mechanism("laplace", sigma=2.0)
    with pytest.raises(ConfigError, match="mechanism 'gaussian' needs sigma"):
        make_mechanism("gaussian", epsilon=1.0)
    rr = make_mechanism("discrete", epsilon=1.0, sigma=5.0)
    assert (rr.parameter, rr.parameter_value) == ("epsilon", 1.0)
    gauss = make_mechanism("gaussian", epsilon=9.0, sigma=2.0)
    assert (gauss.parameter, gauss.parameter_value) == ("sigma", 2.0)
    none = make_mechanism("none", epsilon=1.0, sigma=1.0)
    assert (none.parameter, none.parameter_value) == (None, None)


def test_the_registry_declares_each_mechanism_in_one_place():
    from tpsl_flwr.privacy.mechanisms import REGISTRY, parameter_of

    assert MECHANISMS == (
        "none",
        "laplace",
        "discrete",
        "gaussian",
        "marvell",
        "max-norm",
        "rr-prior",
    )
    assert set(REGISTRY) == set(MECHANISMS)
    assert [parameter_of(n) for n in MECHANISMS] == [
        None,
        "epsilon",
        "epsilon",
        "sigma",
        "marvell_power",
        None,
        "epsilon",
    ]
    for name in MECHANISMS:
        mechanism = make_mechanism(name, epsilon=1.0, sigma=1.0, marvell_power=1.0)
        # Every mechanism declares its sampler, event and closed forms.
        assert 0.5 <= mechanism.expected_sda() <= 1.0
        assert set(mechanism.expected_noise()) == {"flip_rate", "mean_abs_noise"}
        assert mechanism.dp_event() is not None
        labels = np.array([0, 1, 1, 0])
        if mechanism.gradient_noise:  # per batch of gradients, no label sampler
            grads = np.arange(8.0).reshape(4, 2)
            normals = np.ones((4, mechanism.noise_width(2)))
            noisy_grads, _ = mechanism.perturb_batch(grads, labels, normals, None)
            assert noisy_grads.shape == (4, 2)
            assert not mechanism.dp_guarantee and mechanism.epsilon is None
            continue
        noisy = mechanism.sample(labels, np.arange(4), KEY, 1, None)
        assert noisy.coefficients.shape == (4, 2)
        assert (noisy.additive is not None) == mechanism.additive


def test_descriptions_are_frozen():
    lap = make_mechanism("laplace", epsilon=1.0)
    with pytest.raises(AttributeError):
        lap.eps = 2.0  # type: ignore[misc]
