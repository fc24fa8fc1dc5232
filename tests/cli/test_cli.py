"""`tpsl-flwr simulate` flags mirror the run config; `run_experiment`'s engines."""

import argparse
import dataclasses

import pytest
import torch

from tpsl_flwr.cli.flags import config_from_args
from tpsl_flwr.cli.main import build_parser, main
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.config_fields import FIELD_HELP
from tpsl_flwr.experiments.run import run_experiment
from tpsl_flwr.release.store import LabelStore

RUN_CONFIG_KEYS = sorted(ExperimentConfig().to_run_config())


def _simulate_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    commands = next(
        a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
    )
    return commands.choices["simulate"]


def _options(parser):
    return {
        option: action for action in parser._actions for option in action.option_strings
    }


def test_every_run_config_key_is_a_simulate_flag_of_the_same_name_with_help():
    # Prepare
    options = _options(_simulate_parser())
    # Assert: same kebab-case name, a help text, the default shown.
    for key in RUN_CONFIG_KEYS:
        action = options.get(f"--{key}")
        assert action is not None, f"no --{key} flag"
        assert action.help and FIELD_HELP[key] in action.help % vars(action)
        assert "(default:" in action.help
    assert "--noise-seed" in options  # label party only, never run config
    assert "--parties" not in options and "--record-transcript" not in options


def test_simulate_help_lists_every_run_config_key(capsys):
    # Execute
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--help"])
    # Assert
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for key in [*RUN_CONFIG_KEYS, "noise-seed", "engine", "json"]:
        assert f"--{key}" in text, key
    assert "--no-audit" in text and "--no-checkpoint" in text


def test_every_dataclass_field_has_one_line_of_help():
    fields = {f.name.replace("_", "-") for f in dataclasses.fields(ExperimentConfig)}
    assert set(FIELD_HELP) == fields
    assert all(text and "\n" not in text for text in FIELD_HELP.values())


def test_unset_flags_take_the_dataclass_defaults_except_audit():
    # Execute
    args = _simulate_parser().parse_args([])
    cfg = config_from_args(args)
    # Assert: audit is on in simulate, off in the run config.
    assert cfg == dataclasses.replace(ExperimentConfig(), audit=True)


def test_flags_set_the_fields_of_their_run_config_keys():
    # Execute
    args = _simulate_parser().parse_args(
        [
            "--num-parties",
            "3",
            "--no-audit",
            "--no-reuse-noise",
            "--test-fraction",
            "0.25",
            "--transcript-dir",
            "t",
            "--resume",
            "--noise-seed",
            "7",
        ]
    )
    cfg = config_from_args(args)
    # Assert
    assert cfg.to_run_config() == {
        **ExperimentConfig().to_run_config(),
        "num-parties": 3,
        "audit": False,
        "reuse-noise": False,
        "test-fraction": 0.25,
        "transcript-dir": "t",
        "resume": True,
    }
    assert cfg.noise_seed == 7


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--epochs", "two"], "epochs must be an integer, got 'two'"),
        (["--lr", "fast"], "lr must be a number, got 'fast'"),
        (["--parties", "3"], "unrecognized arguments: --parties 3"),
        (["--epochs", "0"], "epochs must be an integer >= 1, got 0"),
    ],
)
def test_bad_simulate_flags_fail_in_one_line_with_status_2(argv, message, capsys):
    # Execute
    try:
        code = main(["simulate", *argv])
    except SystemExit as exit_:
        code = exit_.code
    # Assert
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "\n" not in err and message in err


def test_run_experiment_names_an_unknown_engine_and_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown engine 'gpu'; valid engines: local"):
        run_experiment(ExperimentConfig(), "gpu")


def test_the_ray_engine_gets_the_seeded_key_first_and_no_seed(tmp_path, monkeypatch):
    # Prepare: a stand-in for `flwr run` that looks at what it is given.
    seen = {}

    def fake_run_on_ray(run_config, echo=None, timeout=0.0):
        seen["run_config"] = dict(run_config)
        seen["key_there"] = LabelStore(cfg.label_party_dir).key_path.exists()
        seen["timeout"] = timeout
        return {"engine": "ray"}

    monkeypatch.setattr("tpsl_flwr.experiments.ray_run.run_on_ray", fake_run_on_ray)
    cfg = ExperimentConfig(noise_seed=5, out_dir=str(tmp_path))
    # Execute
    results = run_experiment(cfg, "ray", timeout=12.0)
    # Assert
    assert results == {"engine": "ray"}
    assert seen["key_there"] and seen["timeout"] == 12.0
    assert seen["run_config"] == cfg.to_run_config()
    assert "noise-seed" not in seen["run_config"]


def test_the_local_engine_runs_on_one_torch_thread_and_restores_it(
    tmp_path, monkeypatch
):
    # Prepare
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    during = []
    monkeypatch.setattr(
        "tpsl_flwr.experiments.run.run_inprocess_experiment",
        lambda cfg, timeout: (during.append(torch.get_num_threads()) or {}, None),
    )
    # Execute
    run_experiment(ExperimentConfig(out_dir=str(tmp_path)))
    # Assert
    assert during == [1]
    assert torch.get_num_threads() == before
