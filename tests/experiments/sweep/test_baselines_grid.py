"""The sweep grid of the baseline defenses: Marvell's axis, run names, checks."""

from __future__ import annotations

import csv
import re

import pytest

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.sweep.config import SweepConfig
from tpsl_flwr.experiments.sweep.run import run_row, write_public_csv
from tpsl_flwr.strategies.label_settings import mechanism_of

from .results_factory import results


def test_marvell_powers_is_marvells_axis_and_max_norm_runs_once():
    sweep = SweepConfig.from_mapping(
        {
            "grid": {
                "datasets": ["breast-cancer"],
                "mechanisms": ["marvell", "max-norm", "rr-prior"],
                "epsilons": [1, 2],
                "marvell-powers": [0.5, 4],
            }
        }
    )
    runs = {spec.name: spec.config for spec in sweep.runs()}
    assert sorted(runs) == [
        "breast-cancer_marvell_power0.5_seed0",
        "breast-cancer_marvell_power4_seed0",
        "breast-cancer_max-norm_seed0",
        "breast-cancer_rr-prior_eps1_seed0",
        "breast-cancer_rr-prior_eps2_seed0",
    ]
    assert runs["breast-cancer_marvell_power4_seed0"].marvell_power == 4.0
    assert runs["breast-cancer_rr-prior_eps2_seed0"].epsilon == 2.0


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ({"mechanisms": ["marvell"]}, "grid.marvell-powers is empty but marvell"),
        (
            {"mechanisms": ["marvell"], "marvell-powers": [0.0]},
            "grid.marvell-powers values must be > 0 and finite, got 0.0",
        ),
        (
            {"mechanisms": ["rr-prior"], "epsilons": []},
            "grid.epsilons is empty but rr-prior",
        ),
    ],
)
def test_a_bad_baseline_grid_names_the_key(grid, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        SweepConfig.from_mapping({"grid": {"datasets": ["breast-cancer"], **grid}})


def test_marvell_power_per_run_is_the_grids():
    with pytest.raises(ConfigError, match=r"experiment\.marvell-power is set per run"):
        SweepConfig.from_mapping(
            {
                "grid": {"mechanisms": ["marvell"], "marvell-powers": [1]},
                "experiment": {"marvell-power": 2.0},
            }
        )


def test_the_embedding_api_takes_marvell_power_and_refuses_the_others():
    mechanism = mechanism_of(
        "marvell", epsilon=None, sigma=None, marvell_power=2.0, num_classes=2
    )
    assert mechanism.parameter_value == 2.0
    with pytest.raises(ConfigError, match="takes marvell_power, not epsilon"):
        mechanism_of("marvell", epsilon=1.0, sigma=None, num_classes=2)
    with pytest.raises(ConfigError, match="takes epsilon, not marvell_power"):
        mechanism_of(
            "rr-prior", epsilon=1.0, sigma=None, marvell_power=1.0, num_classes=2
        )
    with pytest.raises(ConfigError, match="takes no marvell_power"):
        mechanism_of(
            "max-norm", epsilon=None, sigma=None, marvell_power=1.0, num_classes=2
        )


def test_runs_public_csv_says_which_runs_have_no_dp_guarantee(tmp_path):
    # Prepare: the shareable table of a sweep with both heuristics and the
    # Gaussian baseline, whose epsilon cells are all empty.
    made = {
        "marvell_power1": results("marvell", 0, marvell_power=1.0),
        "marvell_power4": results("marvell", 0, marvell_power=4.0),
        "max-norm": results("max-norm", 0, marvell_power=None),
        "gaussian_sigma2": results("gaussian", 0, sigma=2.0),
    }
    made["max-norm"]["privacy"] = {"epsilon": None, "epsilon_at_delta": None}
    rows = [run_row(name, r) for name, r in made.items()]

    # Execute
    path = write_public_csv(rows, tmp_path / "runs-public.csv")

    # Assert: an empty epsilon is told apart from the Gaussian's (eps, delta)
    # guarantee, and the two Marvell settings apart from each other.
    with path.open() as handle:
        public = {r["run"]: r for r in csv.DictReader(handle)}
    assert public["marvell_power1"]["guarantee"] == "no DP guarantee"
    assert public["max-norm"]["guarantee"] == "no DP guarantee"
    assert public["gaussian_sigma2"]["guarantee"] == "(eps, delta)-DP"
    assert public["marvell_power4"]["marvell_power"] == "4.0"
    assert {public[n]["epsilon_spent"] for n in public} == {""}
