"""Defaults that scale with the data: ``batch-size = 0`` and ``lr = 0`` resolved."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run import run_inprocess_experiment
from tpsl_flwr.experiments.training_settings import training_of
from tpsl_flwr.parties.training_rules import (
    BASE_LR,
    BESIDE_FTRL_LR,
    MAX_LR,
    SMALL_DATA_ROWS,
    resolve_schedule,
    resolve_training,
)
from tpsl_flwr.testing import write_criteo


def test_a_small_table_gets_small_batches_and_a_larger_rate():
    # Execute: digits' ~1400 training rows, 5 epochs
    settings = resolve_training(train_rows=1437, epochs=5)

    # Assert: 45 steps an epoch (not 6 at 256), and the fastest rate
    assert settings.batch_size == 32
    assert settings.steps == 5 * 45
    assert settings.lr == MAX_LR
    assert settings.auto == ("batch-size", "lr")


def test_a_large_table_keeps_the_defaults_chosen_on_200k_rows():
    # 200k synthetic rows: 160k train, 8 epochs (the README's measured table)
    settings = resolve_training(train_rows=160_000, epochs=8)

    assert (settings.batch_size, settings.lr) == (256, BASE_LR)
    assert settings.steps == 8 * 625


def test_the_batch_is_the_largest_that_gives_64_steps_an_epoch():
    assert resolve_training(train_rows=64 * 256, epochs=1).batch_size == 256
    assert resolve_training(train_rows=64 * 256 - 1, epochs=1).batch_size == 128
    assert resolve_training(train_rows=64 * 64, epochs=1).batch_size == 64
    assert resolve_training(train_rows=10, epochs=1).batch_size == 32


@pytest.mark.parametrize(
    ("given_values", "expected"),
    [
        ({"batch_size": 512}, (512, None)),
        ({"lr": 0.5}, (None, 0.5)),
        ({"batch_size": 7, "lr": 1e-4}, (7, 1e-4)),
    ],
)
def test_explicit_values_always_win(given_values, expected):
    # Execute
    for rows, epochs in ((100, 1), (1437, 5), (1_000_000, 20)):
        settings = resolve_training(train_rows=rows, epochs=epochs, **given_values)

        # Assert: what was given is used as given; only the rest is auto
        batch, lr = expected
        if batch is not None:
            assert settings.batch_size == batch
        if lr is not None:
            assert settings.lr == lr
        assert set(settings.auto) == {"batch-size", "lr"} - {
            k.replace("_", "-") for k in given_values
        }


@given(
    rows=st.integers(min_value=1, max_value=10**8),
    epochs=st.integers(min_value=1, max_value=100),
)
def test_the_rate_stays_in_its_range_and_falls_with_more_steps(rows, epochs):
    settings = resolve_training(train_rows=rows, epochs=epochs)
    longer = resolve_training(train_rows=rows, epochs=epochs + 1)

    assert BASE_LR <= settings.lr <= MAX_LR
    assert longer.lr <= settings.lr
    assert settings.batch_size in (32, 64, 128, 256)
    assert settings.steps == epochs * -(-rows // settings.batch_size)


def test_only_public_counts_enter_the_rule():
    # The rule's inputs are counts and the run config: no label, no data.
    params = set(inspect.signature(resolve_training).parameters)
    assert params == {
        "train_rows",
        "epochs",
        "batch_size",
        "lr",
        "beside_ftrl",
        "heavy_noise",
        "lr_schedule",
        "held_out",
    }
    assert set(inspect.signature(resolve_schedule).parameters) == {
        "schedule",
        "train_rows",
        "epochs",
        "beside_ftrl",
        "held_out",
    }


@pytest.mark.parametrize(
    ("rows", "options", "two_epochs_lr"),
    [
        (3600, {"beside_ftrl": True}, BESIDE_FTRL_LR),
        (1600, {"heavy_noise": True}, MAX_LR),  # 50 steps an epoch: two epochs'
    ],
)
def test_small_data_keeps_two_epochs_worth_of_steps(rows, options, two_epochs_lr):
    # Execute: a few thousand training rows at 1, 2, 8 and 16 epochs
    rates = {
        e: resolve_training(train_rows=rows, epochs=e, **options).lr
        for e in (1, 2, 8, 16)
    }

    # Assert: the rate times the epochs stays that of two epochs from 2 on
    assert rates[1] == rates[2] == two_epochs_lr
    assert rates[8] == pytest.approx(two_epochs_lr / 4)
    assert rates[16] == pytest.approx(two_epochs_lr / 8)


@pytest.mark.parametrize(
    ("rows", "options", "worth"),
    [
        (16_000, {"beside_ftrl": True, "heavy_noise": True}, 1),  # Criteo 20k
        (4_000, {"beside_ftrl": True, "heavy_noise": True}, 1),  # 125 steps
        (1_600, {"beside_ftrl": True, "heavy_noise": True}, 2),  # 50 steps
        (16_000, {"beside_ftrl": True}, 2),  # clean labels
        (32_000, {"heavy_noise": True}, 1),  # synthetic-ctr 40k, no wide part
        (50_000, {"heavy_noise": True}, 1),  # the 2-epoch rate, under the cap
        (456, {"heavy_noise": True}, 2),  # breast-cancer: 15 steps an epoch
    ],
)
def test_noisy_labels_keep_one_epochs_worth_from_64_steps_an_epoch(
    rows, options, worth
):
    # Execute: the rate and budget at 1, 2, 3, 8 and 16 epochs
    runs = {
        e: resolve_training(train_rows=rows, epochs=e, **options)
        for e in (1, 2, 3, 8, 16)
    }
    two = runs[2].lr
    per_epoch = runs[1].steps

    # Assert: past 2 epochs, `worth` epochs' worth of the 2-epoch rate
    assert runs[1].lr >= two  # one epoch: its own (fewer steps, larger) rate
    for epochs in (3, 8, 16):
        assert runs[epochs].lr == pytest.approx(two * worth / epochs, rel=1e-2)
        assert runs[epochs].budget_steps == worth * per_epoch
    assert runs[2].budget_steps == 2 * per_epoch


def test_the_epoch_budget_needs_small_data_and_leaves_explicit_rates_alone():
    large = resolve_training(train_rows=SMALL_DATA_ROWS + 1, epochs=8, heavy_noise=True)
    plain = resolve_training(train_rows=3600, epochs=8)
    noisy = resolve_training(train_rows=3600, epochs=8, heavy_noise=True)
    given = resolve_training(train_rows=3600, epochs=8, lr=0.02, heavy_noise=True)

    assert large.lr == resolve_training(train_rows=SMALL_DATA_ROWS + 1, epochs=8).lr
    # clean labels, no wide part: the rule alone, 3e-3 sqrt(4000 / 904)
    assert plain.lr == 0.00631
    assert noisy.lr == MAX_LR / 8  # 113 steps an epoch: one epoch's worth
    assert given.lr == 0.02


@pytest.mark.parametrize(
    ("dataset", "mechanism", "epsilon", "budget"),
    [
        ("breast-cancer", "laplace", 1.0, True),
        ("breast-cancer", "discrete", 1.0, True),
        ("breast-cancer", "none", 1.0, False),
        ("digits", "discrete", 4.0, False),  # keeps 0.86 of ten classes' labels
        ("digits", "discrete", 1.0, True),  # keeps 0.23
    ],
)
def test_the_config_applies_the_budget_where_the_labels_are_heavily_noisy(
    dataset, mechanism, epsilon, budget
):
    cfg = ExperimentConfig(dataset=dataset, mechanism=mechanism, epsilon=epsilon)
    at_8 = training_of(dataclasses.replace(cfg, epochs=8), 400)
    at_2 = training_of(dataclasses.replace(cfg, epochs=2), 400)

    assert cfg.heavy_label_noise is budget
    assert at_2.lr == MAX_LR
    assert at_8.lr == (MAX_LR / 4 if budget else MAX_LR)


def test_beside_an_ftrl_wide_part_the_deep_rate_is_slower():
    # Prepare: 5000 Criteo rows' ~3600 trained on, 2 epochs
    plain = resolve_training(train_rows=3600, epochs=2)
    beside = resolve_training(train_rows=3600, epochs=2, beside_ftrl=True)
    given = resolve_training(train_rows=3600, epochs=2, lr=0.02, beside_ftrl=True)

    # Assert: only the auto rate changes, and an explicit one still wins
    assert (plain.batch_size, plain.lr) == (32, MAX_LR)
    assert (beside.batch_size, beside.lr, beside.steps) == (32, BESIDE_FTRL_LR, 226)
    assert given.lr == 0.02
    assert BESIDE_FTRL_LR < BASE_LR


def test_the_config_resolves_the_rate_beside_ftrl_from_its_own_keys():
    wide = {"dataset": "breast-cancer", "wide": True}
    adam = training_of(ExperimentConfig(**wide), 400)
    ftrl = training_of(ExperimentConfig(**wide, wide_optimizer="ftrl"), 400)
    assert adam.lr == MAX_LR and ftrl.lr == BESIDE_FTRL_LR


def test_the_label_party_and_every_node_resolve_the_same_values():
    # Prepare: the label party counts its labels, each node its own rows
    cfg = ExperimentConfig(dataset="breast-cancer", num_parties=3)
    label_rows = cfg.load_labels().train_labels.size

    # Execute
    at_label_party = training_of(cfg, int(label_rows))
    at_nodes = [training_of(cfg, len(cfg.load_party(p).train)) for p in range(3)]

    # Assert
    assert all(node == at_label_party for node in at_nodes)
    assert at_label_party.batch_size == 32


@pytest.mark.parametrize(
    ("rows", "epochs", "beside_ftrl", "held_out", "expected"),
    [
        (SMALL_DATA_ROWS + 1, 3, True, True, "restarts"),  # one-epoch phenomenon
        (SMALL_DATA_ROWS + 1, 2, True, True, "cosine"),  # one cycle: the cosine
        (SMALL_DATA_ROWS + 1, 8, True, False, "cosine"),  # returns its last epoch
        (SMALL_DATA_ROWS, 8, True, True, "cosine"),  # small data: the epoch budget
        (200_000, 8, False, True, "cosine"),  # no wide part (synthetic-ctr 200k)
    ],
)
def test_auto_restarts_only_beside_ftrl_on_large_files_past_two_epochs(
    rows, epochs, beside_ftrl, held_out, expected
):
    facts = {"train_rows": rows, "epochs": epochs, "beside_ftrl": beside_ftrl}
    got = resolve_schedule("auto", **facts, held_out=held_out)
    assert got == expected
    settings = resolve_training(**facts, lr_schedule="auto", held_out=held_out)
    assert settings.schedule == expected
    assert "lr-schedule" in settings.auto
    assert settings.to_dict()["schedule"] == expected
    # A named schedule is kept as named, wherever it is.
    for named in ("constant", "cosine", "restarts"):
        kept = resolve_schedule(named, train_rows=rows, epochs=epochs, beside_ftrl=True)
        assert kept == named


def test_the_config_resolves_the_schedule_from_the_files_rows_and_wide_part(
    tmp_path,
):
    # A Criteo run beside FTRL (wide = auto turns it on up to 200k rows); the
    # rows are given to the rule, the file's own size does not enter
    path = write_criteo(tmp_path / "train.txt", 200, seed=1).path
    big = {"dataset": "criteo", "data_path": str(path), "wide": True}
    big["wide_optimizer"] = "ftrl"
    assert training_of(ExperimentConfig(**big, epochs=8), 80_000).schedule == (
        "restarts"
    )
    assert training_of(ExperimentConfig(**big, epochs=2), 80_000).schedule == "cosine"
    # No hold-out (none asked for, or a mechanism without keyed labels): cosine
    kept_last = ExperimentConfig(**big, epochs=8, validation_fraction=0.0)
    assert training_of(kept_last, 80_000).schedule == "cosine"
    gaussian = ExperimentConfig(**big, epochs=8, mechanism="gaussian")
    assert training_of(gaussian, 80_000).schedule == "cosine"
    assert training_of(ExperimentConfig(epochs=8), 160_000).schedule == "cosine"
    # The built-in tables hold nothing out (the tail average): no restarts
    table = {**big, "dataset": "breast-cancer", "data_path": ""}
    assert training_of(ExperimentConfig(**table, epochs=8), 80_000).schedule == (
        "cosine"
    )
    named = ExperimentConfig(**big, epochs=8, lr_schedule="cosine")
    assert training_of(named, 80_000).schedule == "cosine"


@pytest.mark.parametrize(
    ("rows", "options", "budget_steps", "still_learning"),
    [
        (1_600, {"beside_ftrl": True, "heavy_noise": True}, 100, True),  # 2k file
        (1_600, {"beside_ftrl": True}, 100, False),  # clean labels peak mid-run
        # 5k rows: 125 steps an epoch, one epoch's worth under noise beside FTRL
        (4_000, {"beside_ftrl": True, "heavy_noise": True}, 125, False),
        (4_000, {"beside_ftrl": True}, 250, False),  # clean: two epochs' worth
        (456, {"heavy_noise": True}, 30, True),  # breast-cancer, Laplace
        (1_437, {}, 0, False),  # digits, light noise: no budget
        (1_600, {"heavy_noise": True, "lr": 1e-3}, 0, False),  # a rate given
        (60_000, {"heavy_noise": True}, 0, False),  # above the budget's rows
    ],
)
def test_still_learning_where_the_budget_leaves_under_64_steps_an_epoch(
    rows, options, budget_steps, still_learning
):
    settings = resolve_training(train_rows=rows, epochs=8, **options)
    assert settings.budget_steps == budget_steps
    assert settings.still_learning is still_learning
    assert settings.to_dict()["budget_steps"] == budget_steps
    assert settings.to_dict()["still_learning"] is still_learning


def test_the_defaults_are_auto_and_round_trip_through_the_run_config():
    cfg = ExperimentConfig()
    assert (cfg.batch_size, cfg.lr, cfg.lr_schedule) == (0, 0.0, "auto")
    again = ExperimentConfig.from_run_config(cfg.to_run_config())
    assert dataclasses.asdict(again) == dataclasses.asdict(cfg)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("batch_size", -1, "batch-size must be an integer >= 0, got -1"),
        ("lr", -0.1, r"lr must be >= 0 \(0: auto\) and finite, got -0.1"),
        ("lr", float("inf"), "lr must be >= 0"),
        ("lr", "fast", "lr must be a number, got 'fast'"),
        (
            "lr_schedule",
            "sawtooth",
            "lr-schedule must be one of auto, constant, cosine, restarts, "
            "got 'sawtooth'",
        ),
    ],
)
def test_bad_values_are_refused_naming_them(field, value, message):
    with pytest.raises(ConfigError, match=message):
        ExperimentConfig(**{field: value})


@pytest.mark.parametrize(
    ("mechanism", "classes", "epsilon", "expected"),
    [
        ("laplace", 2, 1.0, "posterior"),
        ("discrete", 2, 8.0, "posterior"),  # two classes: always
        ("discrete", 10, 4.0, "none"),  # keeps 0.86: the model's prior misleads
        ("discrete", 10, 1.0, "posterior"),  # keeps 0.23
        ("gaussian", 2, 1.0, "none"),
        ("none", 10, 1.0, "none"),
    ],
)
def test_auto_denoise_follows_the_noise_and_the_public_schema(
    mechanism, classes, epsilon, expected
):
    from tpsl_flwr.parties.training_rules import resolve_denoise

    got = resolve_denoise("auto", mechanism, classes=classes, epsilon=epsilon)
    assert got == expected
    assert resolve_denoise("none", mechanism, classes=classes) == "none"


def test_the_config_resolves_denoise_from_its_schema():
    digits = ExperimentConfig(dataset="digits", mechanism="discrete", epsilon=4.0)
    assert digits.label_denoise == "none"
    assert ExperimentConfig(dataset="digits", mechanism="discrete").label_denoise == (
        "posterior"
    )
    assert ExperimentConfig(mechanism="discrete", epsilon=4.0).label_denoise == (
        "posterior"
    )


@pytest.mark.parametrize(
    ("given_values", "message"),
    [
        ({"train_rows": 0}, "training rows must be an integer >= 1, got 0"),
        ({"batch_size": -3}, "batch-size must be an integer >= 0, got -3"),
        ({"lr": float("nan")}, "lr must be >= 0"),
    ],
)
def test_resolve_training_refuses_bad_values_naming_them(given_values, message):
    with pytest.raises(ConfigError, match=message):
        resolve_training(**{"train_rows": 100, "epochs": 1, **given_values})


@pytest.mark.parametrize(
    ("mechanism", "averaged_epochs"),
    [("laplace", 0), ("none", 4)],
    ids=["budget-still-learning", "no-budget"],
)
def test_a_run_resolves_auto_from_its_epoch_budget(
    tmp_path, mechanism, averaged_epochs
):
    # Prepare: breast-cancer, 5 epochs, no hold-out: under Laplace labels the
    # epoch budget holds it to 2 x 15 steps' worth (still learning); clean
    # labels have no budget
    cfg = ExperimentConfig(
        dataset="breast-cancer",
        mechanism=mechanism,
        epochs=5,
        noise_seed=3,
        out_dir=str(tmp_path),
    )

    # Execute
    results, _ = run_inprocess_experiment(cfg)

    # Assert: averaged over epochs 2-5 only without the budget
    assert results["training"]["average_epochs"] == averaged_epochs
    assert (results["averaged"] is not None) == (averaged_epochs > 0)
