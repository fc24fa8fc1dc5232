import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.privacy.accounting import (
    check_placement,
    composed_epsilon,
    no_op_warning,
    privacy_spent,
)
from tpsl_flwr.privacy.mechanisms import make_mechanism

LAP = make_mechanism("laplace", epsilon=1.0)
RR = make_mechanism("discrete", epsilon=1.0)


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=1, max_value=500), st.floats(min_value=0.01, max_value=10))
def test_reused_noise_budget_does_not_grow_with_epochs(epochs, eps):
    mech = make_mechanism("laplace", epsilon=eps)
    assert privacy_spent(
        mechanism=mech, placement="logits", epochs=epochs
    ).epsilon == pytest.approx(eps)
    assert privacy_spent(
        mechanism=mech, placement="cut", epochs=epochs
    ).epsilon == pytest.approx(2 * eps)


def test_fresh_noise_composes_across_epochs():
    spent = privacy_spent(
        mechanism=LAP, placement="logits", epochs=5, reuse_noise=False
    )
    assert spent.epsilon == pytest.approx(5.0)
    assert spent.releases == 5
    # The PLD accountant at delta = 1e-5 is no worse than basic composition.
    assert spent.epsilon_at_delta <= 5.0 + 1e-3
    cut = privacy_spent(mechanism=RR, placement="cut", epochs=3, reuse_noise=False)
    assert cut.epsilon == pytest.approx(6.0)
    assert cut.epsilon_at_delta == pytest.approx(6.0, abs=0.05)


def test_randomized_response_composition_counts_every_release():
    # dp-accounting 0.6 ignores the count of SelfComposedDpEvent(RR); we compose
    # explicitly, so 5 releases of 1-DP randomized response cost ~5, not 1.
    assert composed_epsilon(RR, 5, 1e-9) == pytest.approx(5.0, abs=0.01)
    assert composed_epsilon(RR, 1, 1e-9) == pytest.approx(1.0, abs=0.01)


def test_pld_of_one_release_matches_pure_epsilon():
    for mech in (LAP, RR, make_mechanism("laplace", epsilon=2.0, num_classes=10)):
        assert privacy_spent(mechanism=mech).epsilon_at_delta == mech.epsilon
        assert composed_epsilon(mech, 1, 1e-6) == pytest.approx(mech.epsilon, abs=0.01)


def test_gaussian_reports_epsilon_delta_only_at_the_logits():
    gauss = make_mechanism("gaussian", sigma=1.0)
    logits = privacy_spent(mechanism=gauss, placement="logits", delta=1e-5)
    assert logits.epsilon is None
    # Golden value: PLD epsilon of the Gaussian mechanism, noise multiplier 1.
    assert logits.epsilon_at_delta == pytest.approx(4.38, abs=0.02)
    assert (
        privacy_spent(mechanism=make_mechanism("gaussian", sigma=4.0)).epsilon_at_delta
        < 1.5
    )
    cut = privacy_spent(mechanism=gauss, placement="cut")
    assert cut.epsilon_at_delta is None
    assert any("unbounded" in note for note in cut.notes)


def test_auc_bound_and_no_op_warning():
    assert privacy_spent(mechanism=LAP).auc_bound == pytest.approx(
        math.e / (1 + math.e)
    )
    big = privacy_spent(mechanism=make_mechanism("laplace", epsilon=8.0))
    assert any("no-op" in note for note in big.notes)
    assert not any("no-op" in note for note in privacy_spent(mechanism=LAP).notes)
    assert no_op_warning(None) is None
    none = privacy_spent(mechanism=make_mechanism("none"))
    assert none.epsilon == math.inf and none.to_dict()["epsilon"] == "inf"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"placement": "top"},
            "unknown placement 'top'; valid placements: logits, cut",
        ),
        ({"epochs": 0}, "epochs must be an integer >= 1, got 0"),
        ({"delta": 0.0}, r"delta must be in \(0, 1\), got 0.0"),
    ],
)
def test_bad_accounting_inputs(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        privacy_spent(mechanism=LAP, **kwargs)


def test_check_placement():
    assert check_placement("cut") == "cut"
