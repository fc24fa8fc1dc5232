"""`tpsl-flwr sweep`: a tiny grid end to end, resume, and bad configs."""

import csv

import pytest

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.simulations.cli import main
from tpsl_flwr.simulations.sweep import SweepConfig, load_sweep, run_sweep

TINY = """
[grid]
datasets = ["breast-cancer"]
mechanisms = ["none", "laplace", "discrete"]
epsilons = [1, 4]
seeds = [0, 1]

[experiment]
epochs = 1
batch-size = 128
noise-seed = 0
checkpoint = false
"""


def _write(tmp_path, text, name="grid.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_tiny_grid_writes_csv_tables_and_plots_then_resumes(tmp_path, capsys):
    # Prepare
    config = _write(tmp_path, TINY)
    out = tmp_path / "out"

    # Execute
    status = main(["sweep", str(config), "--out-dir", str(out), "--no-progress"])

    # Assert
    assert status == 0
    with (out / "runs.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 + 2 * 2 * 2
    assert {r["mechanism"] for r in rows} == {"none", "laplace", "discrete"}
    for row in rows:
        assert 0.0 <= float(row["test_auc"]) <= 1.0
        assert float(row["sda"]) >= 0.0
        assert float(row["samples_per_second"]) > 0
    laplace = [r for r in rows if r["mechanism"] == "laplace"]
    assert {float(r["epsilon"]) for r in laplace} == {1.0, 4.0}
    assert all(float(r["epsilon_spent"]) == float(r["epsilon"]) for r in laplace)
    tables = (out / "tables.md").read_text()
    assert "Table 1: no protection" in tables
    assert "Table 2: Laplace" in tables and "Table 3: Discrete" in tables
    assert " ± " in tables
    for png in ("fig5_utility_vs_epsilon.png", "fig5_utility_vs_sda.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert (out / "runs" / "breast-cancer_laplace_eps1_seed0" / "results.json").exists()
    assert "ran 10, skipped 0" in capsys.readouterr().out

    # Execute: the same sweep again runs nothing.
    again = run_sweep(load_sweep(config), out, progress=False)

    # Assert
    assert again["ran"] == [] and len(again["skipped"]) == 10
    assert [r["run"] for r in again["rows"]] == [r["run"] for r in rows]
    assert (out / "runs.csv").read_text().count("\n") == 11


def test_partial_results_file_is_rerun(tmp_path):
    # Prepare: one run whose results file is truncated (killed mid-write).
    sweep = SweepConfig(
        datasets=("breast-cancer",),
        mechanisms=("none",),
        seeds=(0,),
        experiment={"epochs": 1, "batch-size": 256, "checkpoint": False},
    )
    run_dir = tmp_path / "runs" / "breast-cancer_none_seed0"
    run_dir.mkdir(parents=True)
    (run_dir / "results.json").write_text('{"history": [')

    # Execute
    done = run_sweep(sweep, tmp_path, progress=False)

    # Assert
    assert done["ran"] == ["breast-cancer_none_seed0"]


def test_changed_settings_over_old_results_are_refused(tmp_path):
    # Prepare: a finished run, then the same grid with another batch size.
    base = {"epochs": 1, "batch-size": 256, "checkpoint": False}
    first = SweepConfig(
        datasets=("breast-cancer",), mechanisms=("none",), experiment=base
    )
    run_sweep(first, tmp_path, progress=False)
    changed = SweepConfig(
        datasets=("breast-cancer",),
        mechanisms=("none",),
        experiment={**base, "batch-size": 128},
    )

    # Execute / Assert
    with pytest.raises(ConfigError, match="batch-size"):
        run_sweep(changed, tmp_path, progress=False)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[grid]\nmechanisms = ["lapalce"]\n', "lapalce"),
        ('[grid]\nepsilons = [0, 1]\nmechanisms = ["laplace"]\n', "grid.epsilons"),
        ('[grid]\nepsilons = ["one"]\n', "grid.epsilons"),
        ("[grid]\nseeds = []\n", "grid.seeds"),
        ('[grid]\nmechanisms = ["gaussian"]\n', "grid.sigmas"),
        ('[grid]\ndatasetz = ["digits"]\n', "datasetz"),
        ('[grid]\ndatasets = ["mnist"]\n', "mnist"),
        ("[experiment]\nbatch-sise = 2\n", "batch-sise"),
        ('[experiment]\nepochs = "many"\n', "epochs"),
        ("[experiment]\nepsilon = 2\n", "experiment.epsilon"),
        ("[experment]\nepochs = 1\n", "experment"),
        ("[grid\n", "not valid TOML"),
    ],
)
def test_bad_config_names_the_key_or_value(tmp_path, text, named):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=named):
        load_sweep(path)


def test_cli_reports_bad_config_in_one_line(tmp_path, capsys):
    path = _write(tmp_path, '[grid]\nmechanisms = ["lapalce"]\n')
    assert main(["sweep", str(path), "--out-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "lapalce" in err and "Traceback" not in err


def test_shipped_configs_parse():
    from pathlib import Path

    import tpsl_flwr.simulations as sims

    folder = Path(sims.__file__).parent / "configs"
    paper = load_sweep(folder / "paper_grid.toml")
    assert paper.epsilons == (0.5, 1.0, 2.0, 4.0, 8.0)
    assert len(paper.seeds) == 3
    assert set(paper.mechanisms) == {"none", "laplace", "discrete", "gaussian"}
    text = (folder / "criteo_file.toml").read_text()
    assert "data-path" in text
