"""The privacy boundary end to end (in-process): keys, resume, files, node views."""

import json
import stat

import numpy as np
import pytest

from tpsl_flwr.cli.main import main
from tpsl_flwr.errors import ConfigError, PrivacyError
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run import run_experiment, run_inprocess_experiment
from tpsl_flwr.experiments.sweep.run import SweepConfig
from tpsl_flwr.simulations.client_app import app as builtin_app

BASE = {"dataset": "breast-cancer", "batch_size": 128, "checkpoint": True}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One finished epoch of Laplace eps 1 with an OS key, to resume from."""
    out = tmp_path_factory.mktemp("first")
    cfg = ExperimentConfig(
        **BASE, mechanism="laplace", epsilon=1.0, epochs=1, out_dir=str(out)
    )
    return cfg, run_experiment(cfg)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"epsilon": 4.0}, "epsilon (1.0 -> 4.0)"),
        (
            {"mechanism": "gaussian", "validation_fraction": 0.0},
            "mechanism ('laplace' -> 'gaussian')",
        ),
        ({"placement": "cut"}, "placement ('logits' -> 'cut')"),
        ({"reuse_noise": False}, "reuse-noise (True -> False)"),
        ({"seed": 3}, "seed (0 -> 3)"),
        ({"rows": 500}, "rows (0 -> 500)"),
        ({"test_fraction": 0.3}, "test-fraction (0.2 -> 0.3)"),
        # auto resolved to 0 for this 1-epoch run; the resolved value is bound
        ({"validation_fraction": 0.2}, "validation-fraction (0.0 -> 0.2)"),
    ],
)
def test_resume_with_changed_noise_settings_is_refused_naming_them(
    finished_run, change, named
):
    # The reproduction: eps 1 for an epoch, then "resume" at eps 4 for
    # two would reuse the key's words at another scale (t1 - 2 t2 = -y).
    cfg, _ = finished_run
    settings = {**BASE, "mechanism": "laplace", "epsilon": 1.0, **change}
    resumed = ExperimentConfig(**settings, epochs=2, out_dir=cfg.out_dir, resume=True)
    with pytest.raises(PrivacyError, match="changed since the checkpoint") as err:
        run_experiment(resumed)
    assert named in str(err.value)


def test_resume_with_the_same_settings_continues_under_the_same_key(finished_run):
    cfg, first = finished_run
    resumed = ExperimentConfig(
        **BASE,
        mechanism="laplace",
        epsilon=1.0,
        epochs=2,
        out_dir=cfg.out_dir,
        resume=True,
    )
    second = run_experiment(resumed)
    assert second["noise_key"]["fingerprint"] == first["noise_key"]["fingerprint"]
    assert [h["epoch"] for h in second["history"]] == [1, 2]
    assert second["epsilon_spent"] == 1.0


def test_resume_with_no_label_party_key_is_refused(tmp_path):
    cfg = ExperimentConfig(**BASE, epochs=1, out_dir=str(tmp_path), resume=True)
    with pytest.raises(PrivacyError, match="no noise key"):
        run_experiment(cfg)


def test_the_label_partys_files_are_private_and_apart_from_the_nodes(finished_run):
    cfg, results = finished_run
    folder = cfg.label_party_dir
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["checkpoint.pt", "noise-key.json"]
    for path in folder.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # The key is in its file and in no file outside the label party's folder
    # (results, report, the nodes' checkpoints).
    key_hex = json.loads((folder / "noise-key.json").read_text())["key"]
    assert results["noise_key"]["fingerprint"] != key_hex[:12]
    outside = [
        p for p in folder.parent.rglob("*") if p.is_file() and folder not in p.parents
    ]
    assert any(p.parent.name == "checkpoints" for p in outside)
    for path in outside:
        data = path.read_bytes()
        assert key_hex.encode() not in data and bytes.fromhex(key_hex) not in data


def test_noise_seed_is_not_run_config_and_never_reaches_a_node(tmp_path):
    # Prepare: a seeded run whose nodes record the run config they are given.
    seen = []
    client = builtin_app

    def recording(message, context):
        seen.append(dict(context.run_config))
        return client(message, context)

    cfg = ExperimentConfig(**BASE, epochs=1, noise_seed=11, out_dir=str(tmp_path))
    # Execute
    results, _ = run_inprocess_experiment(cfg, recording)
    # Assert
    assert seen and all("noise-seed" not in config for config in seen)
    assert all(11 not in config.values() for config in seen)
    assert results["noise_key"]["secure"] is False
    assert results["noise_key"]["origin"] == "seed"
    assert any("knows the seed" in note for note in results["privacy"]["notes"])
    assert "knows the seed" in (tmp_path / "report.md").read_text()
    with pytest.raises(ConfigError, match="noise-seed is not a run-config key"):
        ExperimentConfig.from_run_config({"noise-seed": 11})


def test_a_seeded_run_is_reproducible_and_an_os_keyed_one_is_not(tmp_path):
    runs = [
        run_experiment(
            ExperimentConfig(**BASE, epochs=1, out_dir=str(tmp_path / n), **extra)
        )
        for n, extra in (("a", {"noise_seed": 4}), ("b", {"noise_seed": 4}), ("c", {}))
    ]
    prints = [r["noise_key"]["fingerprint"] for r in runs]
    assert prints[0] == prints[1] != prints[2]
    assert runs[0]["test_auc"] == runs[1]["test_auc"]


def test_every_run_of_a_seeded_sweep_gets_its_own_key(tmp_path):
    sweep = SweepConfig(
        datasets=("breast-cancer",),
        mechanisms=("laplace", "discrete"),
        epsilons=(1.0, 4.0),
        seeds=(0, 1),
        experiment={"epochs": 1, "noise-seed": 0},
    )
    seeds = [spec.config.noise_seed for spec in sweep.runs(tmp_path)]
    assert len(seeds) == 8 and len(set(seeds)) == 8
    assert all(s >= 0 for s in seeds)
    # The same sweep derives the same keys (reproducible, still NOT secure).
    assert seeds == [spec.config.noise_seed for spec in sweep.runs(tmp_path)]


def test_the_node_process_never_calls_a_label_loader(tmp_path, monkeypatch):
    # Prepare: every label path of the data layer raises; the label party's
    # labels are loaded first, outside the patch.
    import tpsl_flwr.data.views as views

    cfg = ExperimentConfig(**BASE, epochs=1, noise_seed=0, out_dir=str(tmp_path))
    labels = cfg.load_labels()

    def no_labels(*_args, **_kwargs):
        raise AssertionError("a node asked for labels")

    monkeypatch.setattr(views, "_label_view", no_labels)
    monkeypatch.setattr(views, "_ctr_label_view", no_labels)
    monkeypatch.setattr(views, "load_label_view", no_labels)
    monkeypatch.setattr("tpsl_flwr.data.load_dataset", no_labels)
    monkeypatch.setattr(
        "tpsl_flwr.experiments.config.load_label_view", lambda _spec, **_options: labels
    )
    monkeypatch.setattr("tpsl_flwr.experiments.config.load_dataset", no_labels)
    # Execute: the whole run, nodes included, trains without one label load
    # outside the label party.
    results = run_experiment(cfg)
    # Assert
    assert results["train_rows"] == labels.train_labels.size
    assert np.isfinite(results["test_auc"])


def test_keygen_leaves_a_private_unbound_key_for_the_next_run(tmp_path, capsys):
    folder = tmp_path / "lp"
    assert main(["keygen", str(folder), "--seed", "9"]) == 0
    assert "NOT secure" in capsys.readouterr().out
    assert stat.S_IMODE((folder / "noise-key.json").stat().st_mode) == 0o600
    cfg = ExperimentConfig(
        **BASE, epochs=1, out_dir=str(tmp_path / "out"), label_dir=str(folder)
    )
    results = run_experiment(cfg)
    assert results["noise_key"]["origin"] == "seed"
