"""Every setting and combination is refused when the config is built, in one line."""

import re

import pytest

from tpsl_flwr.cli.main import main
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.config import ExperimentConfig, schema_classes


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        # party count vs the dataset's columns (public schema)
        (
            {"num_parties": 1000},
            "num_parties=1000 exceeds the number of columns (16) of 'synthetic-ctr'",
        ),
        (
            {"dataset": "breast-cancer", "num_parties": 31},
            "num_parties=31 exceeds the number of columns (30) of 'breast-cancer'",
        ),
        # mechanism vs its parameter, for the dataset's classes
        ({"mechanism": "laplace", "epsilon": 0.0}, "epsilon must be > 0"),
        ({"mechanism": "discrete", "epsilon": float("inf")}, "got inf"),
        (
            {"mechanism": "gaussian", "sigma": -1.0, "validation_fraction": 0.0},
            "sigma must be > 0",
        ),
        ({"mechanism": "lapalce"}, "unknown mechanism 'lapalce'"),
        ({"dataset": "digits", "epsilon": 1.5e-6}, "epsilon 1.5e-06 is too small"),
        # dataset vs data-path
        ({"dataset": "criteo"}, "dataset 'criteo' needs data-path"),
        (
            {"dataset": "avazu", "data_path": "/no/such/train.csv"},
            "data-path '/no/such/train.csv' of dataset 'avazu' does not exist",
        ),
        (
            {"dataset": "breast-cancer", "data_path": "x.csv"},
            "dataset 'breast-cancer' is built in, got data-path='x.csv'",
        ),
        # split vs dataset
        ({"split": "time"}, "split='time' applies only to criteo, avazu"),
        ({"split": "latest"}, "split must be one of random, time, got 'latest'"),
        # ranges
        ({"test_fraction": 0.0}, "test-fraction must be in (0, 1), got 0.0"),
        ({"test_fraction": 1.0}, "test-fraction must be in (0, 1), got 1.0"),
        ({"rows": -5}, "rows must be an integer >= 0, got -5"),
        (
            {"dataset": "breast-cancer", "rows": 600},
            "rows=600 exceeds the 569 rows of 'breast-cancer'",
        ),
        ({"hash_buckets": 8}, "hash-buckets applies only to criteo, avazu"),
        ({"batch_size": -1}, "batch-size must be an integer >= 0, got -1"),
        ({"epochs": 0}, "epochs must be an integer >= 1, got 0"),
        ({"steps_per_message": 0}, "steps-per-message must be an integer >= 1"),
        ({"lr": -0.5}, "lr must be >= 0 (0: auto) and finite, got -0.5"),
        ({"placement": "top"}, "unknown placement 'top'"),
        ({"dataset": "mnist"}, "unknown dataset 'mnist'"),
        # combinations of switches
        ({"resume": True, "checkpoint": False}, "resume = true needs checkpoint"),
    ],
)
def test_each_bad_setting_is_refused_when_built(settings, message):
    # Execute
    with pytest.raises(ConfigError) as info:
        ExperimentConfig(**settings)
    # Assert: one line, naming the value
    text = str(info.value)
    assert "\n" not in text
    assert message in text


def test_a_file_dataset_with_an_existing_file_is_accepted(tmp_path):
    # Prepare: only the path is checked here, no row is read
    path = tmp_path / "train.txt"
    path.write_text("")
    # Execute
    cfg = ExperimentConfig(dataset="criteo", data_path=str(path), split="time")
    # Assert
    assert cfg.data_path == str(path)
    with pytest.raises(ConfigError, match="is not a file"):
        ExperimentConfig(dataset="criteo", data_path=str(tmp_path))


def test_good_combinations_pass():
    ExperimentConfig(num_parties=16)
    ExperimentConfig(dataset="breast-cancer", num_parties=30, rows=100)
    ExperimentConfig(mechanism="none", epsilon=-1.0)  # takes no parameter
    ExperimentConfig(
        mechanism="gaussian", epsilon=0.0, sigma=2.0, validation_fraction=0.0
    )
    assert schema_classes("digits") == 10 and schema_classes("criteo") == 2


def test_the_run_config_path_is_refused_the_same_way():
    with pytest.raises(ConfigError, match="num_parties=1000 exceeds"):
        ExperimentConfig.from_run_config({"num-parties": 1000})


def test_simulate_refuses_before_anything_starts_in_one_line(capsys, monkeypatch):
    # Prepare: starting a run at all would be a failure
    import tpsl_flwr.experiments.run as run

    def started(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(run, "run_experiment", started)
    # Execute
    code = main(["simulate", "--num-parties", "1000"])
    # Assert
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.splitlines()
    assert lines == [
        "tpsl-flwr simulate: error: num_parties=1000 exceeds the number of "
        "columns (16) of 'synthetic-ctr'"
    ]
    assert captured.out == ""


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--dataset", "criteo", "--data-path", "/no/file.gz"], "'/no/file.gz'"),
        (["--split", "time"], "split='time'"),
        (["--test-fraction", "1.5"], "1.5"),
        (
            ["--mechanism", "gaussian", "--sigma", "0", "--validation-fraction", "0"],
            "sigma",
        ),
    ],
)
def test_simulate_names_the_bad_value(argv, named, capsys):
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and re.search(re.escape(named), err)
