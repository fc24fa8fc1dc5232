"""validation-fraction = auto: when a run holds out ids, one rule, every entry point."""

import re

import pytest

from tpsl_flwr import ConfigError, PrivacyError
from tpsl_flwr.errors import ResumeRefused
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run import run_experiment
from tpsl_flwr.experiments.training_settings import validation_of
from tpsl_flwr.testing import write_criteo
from tpsl_flwr.validation.holdout import (
    AUTO_FRACTION,
    AUTO_MIN_EPOCHS,
    AUTO_MIN_IDS,
    resolve_validation,
    validation_mode,
)

SMALL_RUN = dict(
    dataset="criteo",  # hashed codes: auto holds out (built-in tables do not)
    mechanism="laplace",
    epsilon=1.0,
    noise_seed=0,
    audit=False,
    batch_size=1024,
)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """30k generated Criteo rows (24k trained: 10% is 2400 ids, over AUTO_MIN_IDS)."""
    path = tmp_path_factory.mktemp("criteo") / "train.txt"
    return dict(SMALL_RUN, data_path=str(write_criteo(path, 30_000, seed=3).path))


"""A quick run whose 10% hold-out is large enough for ``auto``."""


@pytest.mark.parametrize(
    ("rows", "epochs", "mechanism", "expected"),
    [
        (AUTO_MIN_IDS * 10, AUTO_MIN_EPOCHS, "laplace", AUTO_FRACTION),
        (AUTO_MIN_IDS * 10 - 1, AUTO_MIN_EPOCHS, "laplace", 0.0),
        (AUTO_MIN_IDS * 10, AUTO_MIN_EPOCHS - 1, "discrete", 0.0),
        (AUTO_MIN_IDS * 100, 8, "none", AUTO_FRACTION),
        (AUTO_MIN_IDS * 100, 8, "gaussian", 0.0),
    ],
)
def test_auto_holds_out_only_long_runs_with_enough_ids(
    rows, epochs, mechanism, expected
):
    found = resolve_validation(
        "auto", train_rows=rows, epochs=epochs, mechanism=mechanism
    )
    assert found == expected


def test_auto_holds_out_only_where_the_data_has_hashed_codes(small_run):
    # The rule: built-in tables (categorical columns of 3-100 values) average
    rows = AUTO_MIN_IDS * 100
    facts = dict(train_rows=rows, epochs=8, mechanism="laplace")
    assert resolve_validation("auto", **facts, hashed_codes=False) == 0.0
    assert resolve_validation("auto", **facts, hashed_codes=True) == AUTO_FRACTION
    assert resolve_validation(0.2, **facts, hashed_codes=False) == 0.2  # as given
    # The config's: the Criteo and Avazu files are hashed codes, synthetic-ctr not
    criteo = ExperimentConfig(**small_run, epochs=8)
    synthetic = ExperimentConfig(dataset="synthetic-ctr", epochs=8, mechanism="laplace")
    assert validation_of(criteo, rows) == AUTO_FRACTION
    assert validation_of(synthetic, rows) == 0.0


def test_an_explicit_fraction_always_wins():
    assert resolve_validation(0.3, train_rows=10, epochs=1, mechanism="none") == 0.3
    assert resolve_validation("0", train_rows=10**6, epochs=9, mechanism="none") == 0.0


@pytest.mark.parametrize("bad", [0.5, -0.1, "half", True, None, float("nan")])
def test_bad_values_are_refused_by_name(bad):
    with pytest.raises(ConfigError, match="validation-fraction") as err:
        validation_mode(bad)
    assert repr(bad) in str(err.value)
    with pytest.raises(ConfigError, match="validation-fraction"):
        ExperimentConfig(validation_fraction=bad)


def test_run_config_and_cli_spellings_meet_in_one_value():
    run_config = ExperimentConfig().to_run_config()
    assert run_config["validation-fraction"] == "auto"
    parsed = ExperimentConfig.from_run_config({"validation-fraction": "0.2"})
    assert parsed.validation_fraction == 0.2
    assert ExperimentConfig(validation_fraction="AUTO").validation_fraction == "auto"


def test_gaussian_runs_with_the_default_and_refuses_an_explicit_hold_out():
    ExperimentConfig(mechanism="gaussian", epsilon=0.0, sigma=1.0)  # auto: 0
    with pytest.raises(ConfigError, match="validation-fraction = 0"):
        ExperimentConfig(
            mechanism="gaussian", epsilon=0.0, sigma=1.0, validation_fraction=0.1
        )


def test_results_report_the_resolved_fraction_and_the_strategy_uses_it(
    tmp_path, small_run
):
    """A 3-epoch run of 30k Criteo rows (24k trained: 2400 ids) holds out;
    with 2 epochs it does not."""
    common = small_run
    long = run_experiment(
        ExperimentConfig(**common, epochs=3, out_dir=str(tmp_path / "long"))
    )
    short = run_experiment(
        ExperimentConfig(**common, epochs=2, out_dir=str(tmp_path / "short"))
    )
    assert long["training"]["validation_fraction"] == AUTO_FRACTION
    assert long["best_epoch"] is not None
    assert short["training"]["validation_fraction"] == 0.0
    assert short.get("best_epoch") is None


def test_extending_a_run_across_the_epoch_line_names_the_hold_out(tmp_path, small_run):
    """auto resolves again on resume: 2 -> 3 epochs would hold out ids trained on."""
    common = dict(**small_run, checkpoint=True, out_dir=str(tmp_path / "run"))
    run_experiment(ExperimentConfig(**common, epochs=2))
    with pytest.raises(
        PrivacyError, match=r"validation-fraction \(0.0 -> 0.1\)"
    ) as err:
        run_experiment(ExperimentConfig(**common, epochs=3, resume=True))
    assert "--validation-fraction 0.0" in str(err.value)
    assert "second, correlated draw" not in str(err.value)
    fixed = dict(**common, epochs=3, resume=True, validation_fraction=0)
    # 3 epochs also resolve another lr and FTRL budget: refused, naming the
    # values that resolve to the stopped run's (the checkpoints hold those).
    with pytest.raises(ResumeRefused) as refused:
        run_experiment(ExperimentConfig(**fixed))
    named = re.search(r"resume with (.*) \(they resolve", str(refused.value))
    assert named is not None, refused.value
    values = dict(pair.split(" = ") for pair in named.group(1).split(", "))
    assert set(values) == {"lr", "wide-lr", "wide-l2"}  # wide-l1 stays 0
    flags = {k.replace("-", "_"): float(v) for k, v in values.items()}
    extended = run_experiment(ExperimentConfig(**fixed, **flags))
    assert extended["epochs_trained"] == 1  # the one epoch left
    assert len(extended["history"]) == 3


def test_embedders_strategy_takes_auto_and_names_a_bad_value():
    """TPSLStrategy resolves "auto" by the run config's rule (constructor epochs)."""
    import numpy as np

    from tpsl_flwr import NoiseKey, make_mechanism
    from tpsl_flwr.models import TopModel
    from tpsl_flwr.parties import LabelParty, adam
    from tpsl_flwr.strategies import TPSLStrategy

    labels = np.random.default_rng(0).integers(0, 2, size=30_000)

    def party():
        return LabelParty(
            TopModel(4, hidden=(4,), num_outputs=1),
            labels,
            make_mechanism("laplace", epsilon=1.0),
            NoiseKey.from_seed(1),
            optimizer=adam(0.01),
        )

    long = TPSLStrategy(party(), epochs=3, validation_fraction="auto")
    short = TPSLStrategy(party(), epochs=2, validation_fraction="auto")
    assert long.validation.active and not short.validation.active
    with pytest.raises(ConfigError, match="'most'"):
        TPSLStrategy(party(), epochs=3, validation_fraction="most")
