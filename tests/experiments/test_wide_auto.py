"""``wide = "auto"``: one rule, by dataset and training rows, alike on every side.

The rule (:func:`~tpsl_flwr.experiments.wide_settings.resolve_wide`): an FTRL
wide part for Criteo/Avazu files of at most ``WIDE_AUTO_MAX_ROWS`` training
rows, none otherwise; explicit on/off (true/false) win. The label party
resolves it from its label count, each node from its own rows (the same
number), so both build the same split model; a small Criteo run trains with it.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest
import torch
from flwr.app import Context, Message, RecordDict

from tpsl_flwr.cli.flags import add_config_flags
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.architecture import build_bottom, build_top
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.config_fields import FIELD_HELP
from tpsl_flwr.experiments.run import run_inprocess_experiment
from tpsl_flwr.experiments.training_settings import training_of
from tpsl_flwr.experiments.wide_settings import (
    WIDE_AUTO_MAX_ROWS,
    has_wide,
    resolve_wide,
    wide_optimizer,
)
from tpsl_flwr.parties import NonLabelParty
from tpsl_flwr.parties.ftrl import FtrlProximal
from tpsl_flwr.parties.training_rules import BESIDE_FTRL_LR
from tpsl_flwr.simulations.node_app import builtin_party
from tpsl_flwr.testing import write_avazu, write_criteo
from tpsl_flwr.wire.node_side import make_client_app


@pytest.fixture(scope="module")
def criteo_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("criteo") / "train.txt"
    return str(write_criteo(path, 1500, seed=3).path)


@pytest.fixture(scope="module")
def avazu_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("avazu") / "train.csv"
    return str(write_avazu(path, 600, seed=3).path)


def _criteo(path: str, **fields: Any) -> ExperimentConfig:
    return ExperimentConfig(dataset="criteo", data_path=path, **fields)


# ----------------------------------------------------------------- the rule
@pytest.mark.parametrize(
    "rows, want",
    [
        (3600, ("on", "ftrl")),
        (80_000, ("on", "ftrl")),  # a 100,000-row file: measured to win there
        (WIDE_AUTO_MAX_ROWS, ("on", "ftrl")),
        (WIDE_AUTO_MAX_ROWS + 1, ("off", "adam")),
    ],
)
def test_auto_turns_the_ftrl_wide_part_on_for_small_criteo_files_only(
    criteo_file, rows, want
):
    cfg = resolve_wide(_criteo(criteo_file), rows)
    assert (cfg.wide, cfg.wide_optimizer) == want


def test_auto_turns_it_on_for_small_avazu_files(avazu_file):
    cfg = resolve_wide(ExperimentConfig(dataset="avazu", data_path=avazu_file), 480)
    assert (cfg.wide, cfg.wide_optimizer) == ("on", "ftrl")


@pytest.mark.parametrize("dataset", ["synthetic-ctr", "digits", "breast-cancer"])
@pytest.mark.parametrize("rows", [None, 400, 10**7])
def test_auto_leaves_built_in_tables_without_a_wide_part(dataset, rows):
    cfg = ExperimentConfig(dataset=dataset)
    resolved = resolve_wide(cfg, rows)
    assert (resolved.wide, resolved.wide_optimizer) == ("off", "adam")
    assert not has_wide(cfg)


@pytest.mark.parametrize(
    "fields, rows, want",
    [
        ({"wide": True}, 10**7, ("on", "adam")),  # explicit on: Adam, as before
        ({"wide": "on", "wide_optimizer": "ftrl"}, 10**7, ("on", "ftrl")),
        ({"wide": False}, 3600, ("off", "adam")),
        ({"wide": "off", "wide_optimizer": "adam"}, 3600, ("off", "adam")),
        ({"wide_optimizer": "adam"}, 3600, ("on", "adam")),  # auto, own optimizer
        ({"wide_optimizer": "ftrl"}, 10**7, ("on", "ftrl")),  # ftrl asks for one
    ],
)
def test_explicit_settings_override_the_rule(criteo_file, fields, rows, want):
    cfg = resolve_wide(_criteo(criteo_file, **fields), rows)
    assert (cfg.wide, cfg.wide_optimizer) == want


def test_auto_on_a_file_without_its_rows_is_refused_in_one_line(criteo_file):
    cfg = _criteo(criteo_file)
    with pytest.raises(ConfigError, match="wide = 'auto' on dataset 'criteo'"):
        build_bottom(cfg, 13, [10] * 13, 0)


def test_the_help_states_the_threshold_of_the_rule():
    assert f"at most {WIDE_AUTO_MAX_ROWS} training rows" in FIELD_HELP["wide"]


# --------------------------------------------------------- its spellings
@pytest.mark.parametrize(
    "raw, want",
    [(True, "on"), (False, "off"), ("auto", "auto"), ("TRUE", "on"), ("off", "off")],
)
def test_booleans_and_every_spelling_are_read_alike(raw, want):
    assert ExperimentConfig(dataset="digits", wide=raw).wide == want
    run_config = {"dataset": "digits", "wide": raw}
    assert ExperimentConfig.from_run_config(run_config).wide == want


def test_the_run_config_round_trips_the_resolved_value(criteo_file):
    cfg = resolve_wide(_criteo(criteo_file), 1200)
    again = ExperimentConfig.from_run_config(cfg.to_run_config())
    assert (again.wide, again.wide_optimizer) == ("on", "ftrl")


@pytest.mark.parametrize(
    "fields, match",
    [
        (
            {"wide": "yes"},
            r"wide must be one of auto, on, off \(or true, false\), "
            "got 'yes'",
        ),
        ({"wide": 1}, "wide must be one of auto, on, off .*got 1"),
        (
            {"wide_optimizer": "sgd"},
            "wide-optimizer must be one of auto, adam, ftrl, got 'sgd'",
        ),
        (
            {"wide": False, "wide_optimizer": "ftrl"},
            "this run has none "
            r"\(wide = 'off'\)",
        ),
    ],
)
def test_bad_values_are_refused_naming_them(fields, match):
    with pytest.raises(ConfigError, match=match):
        ExperimentConfig(dataset="digits", **fields)


@pytest.mark.parametrize(
    "argv, want",
    [
        ([], "auto"),
        (["--wide"], "on"),
        (["--wide", "off"], "off"),
        (["--wide", "true"], "on"),
        (["--wide", "auto"], "auto"),
    ],
)
def test_the_flag_takes_a_bare_wide_or_a_mode(argv, want):
    parser = argparse.ArgumentParser()
    add_config_flags(parser, engine_flags=False)
    assert parser.parse_args(argv).wide == want


def test_the_flag_refuses_another_value(capsys):
    parser = argparse.ArgumentParser()
    add_config_flags(parser, engine_flags=False)
    with pytest.raises(SystemExit):
        parser.parse_args(["--wide", "maybe"])
    assert "'maybe'" in capsys.readouterr().err


# ------------------------------------------- the label party and the nodes
def _node_context(cfg: ExperimentConfig, partition: int) -> Context:
    node_config = {"partition-id": partition, "num-partitions": cfg.num_parties}
    return Context(1, 7, node_config, RecordDict(), cfg.to_run_config())


def test_the_label_party_and_every_node_build_the_same_wide_model(
    criteo_file, tmp_path
):
    # Prepare: the run config every side receives, wide = auto
    cfg = _criteo(criteo_file, num_parties=3, out_dir=str(tmp_path))
    label_rows = int(cfg.load_labels().train_labels.size)

    # Execute: the label party resolves from its labels, each node its rows
    at_label_party = resolve_wide(cfg, label_rows)
    parties = [builtin_party(_node_context(cfg, p)) for p in range(3)]

    # Assert: wide on everywhere, FTRL at every node, the same rates
    assert (at_label_party.wide, at_label_party.wide_optimizer) == ("on", "ftrl")
    assert build_top(at_label_party, 1).has_wide
    for p, party in enumerate(parties):
        assert isinstance(party.wide_optimizer, FtrlProximal)
        rows = len(cfg.load_party(p).train)
        assert rows == label_rows
        assert build_bottom(resolve_wide(cfg, rows), 0, [2], p).has_wide
    assert training_of(cfg, label_rows).lr == BESIDE_FTRL_LR


def test_a_small_criteo_run_with_auto_trains_the_wide_part(
    criteo_file, tmp_path, one_torch_thread
):
    # Prepare: record the party each node builds
    built: list[NonLabelParty] = []

    def factory(context: Context) -> NonLabelParty:
        built.append(builtin_party(context))
        return built[-1]

    nodes = make_client_app(factory)
    weights: dict[int, float] = {}

    def app(msg: Message, context: Context) -> Message:
        reply = nodes(msg, context)
        for party in built:  # the wide weights move from their start at 0
            for w in party.bottom.wide_parameters():
                weights[id(w)] = float(w.detach().abs().sum())
        return reply

    cfg = _criteo(
        criteo_file,
        mechanism="none",
        epochs=1,
        checkpoint=False,
        new_release=True,
        noise_seed=0,
        out_dir=str(tmp_path / "out"),
    )

    # Execute
    results, _ = run_inprocess_experiment(cfg, client_app=app)

    # Assert: both sides resolved the FTRL wide part, and it learned
    training = results["training"]
    assert (training["wide"], training["wide_optimizer"]) == ("on", "ftrl")
    assert training["lr"] == BESIDE_FTRL_LR
    assert built and all(isinstance(p.wide_optimizer, FtrlProximal) for p in built)
    assert weights and all(v > 0 for v in weights.values())
    # 1500 generated rows, 1 epoch (the generator's logit_sd 1.5): well above
    # chance; a looser bound than the bench's, for one short epoch.
    assert results["test_auc"] > 0.6


@pytest.mark.parametrize(
    ("mechanism", "epochs", "rows", "expected"),
    [
        ("laplace", 8, 4000, (1.25, 0.0, 8.0)),  # 2 / 8: the 2-epoch penalty
        ("discrete", 4, 4000, (2.5, 0.0, 4.0)),
        ("laplace", 2, 4000, (5.0, 0.0, 2.0)),
        ("none", 8, 4000, (5.0, 0.0, 2.0)),  # clean labels keep the settings
        ("laplace", 8, 60_000, (5.0, 0.0, 2.0)),  # above 50,000 rows
    ],
)
def test_ftrl_keeps_a_two_epoch_penalty_under_heavy_noise(
    mechanism, epochs, rows, expected
):
    # Prepare: an FTRL wide part at the default wide-lr 5, wide-l2 2
    cfg = ExperimentConfig(
        dataset="breast-cancer",
        mechanism=mechanism,
        epochs=epochs,
        wide="on",
        wide_optimizer="ftrl",
    )

    # Execute: the factory a node builds from its own row count
    factory = wide_optimizer(cfg, rows, heavy_noise=cfg.heavy_label_noise)
    assert factory is not None
    optimizer = factory([torch.nn.Parameter(torch.zeros(3))])

    # Assert
    got = tuple(optimizer.defaults[k] for k in ("lr", "l1", "l2"))
    assert got == pytest.approx(expected)
    assert wide_optimizer(cfg) is not None  # without rows: the settings as given


def test_a_resume_whose_ftrl_budget_differs_is_refused_naming_it(
    criteo_file, tmp_path, one_torch_thread
):
    # Prepare: 2 epochs on heavily noisy labels with the FTRL wide part, then a
    # resume to 4 epochs at the same explicit lr: the wide part's budget (2 / 4)
    # resolves another rate and penalties, which the nodes' checkpoints would
    # silently override with the stopped run's.
    common = dict(
        mechanism="laplace",
        epsilon=1.0,
        lr=1e-3,
        lr_schedule="constant",
        validation_fraction=0.0,
        checkpoint=True,
        new_release=True,
        out_dir=str(tmp_path / "out"),
    )
    run_inprocess_experiment(_criteo(criteo_file, epochs=2, noise_seed=0, **common))

    # Execute
    resumed = _criteo(criteo_file, epochs=4, resume=True, **common)
    with pytest.raises(ConfigError, match=r"^cannot resume: ") as refused:
        run_inprocess_experiment(resumed)

    # Assert: each changed setting named with both exact values
    message = str(refused.value)
    assert "trained with wide-lr = 5.0, wide-l2 = 2.0 and" in message
    assert "this one resolves wide-lr = 2.5, wide-l2 = 4.0:" in message
    assert " lr = 0.001" not in message  # the same explicit rate: not changed
