"""`tpsl-flwr sweep`: a tiny grid end to end, resume, and bad configs."""

import csv
import re
from pathlib import Path

import pytest

import tpsl_flwr.simulations as sims
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.sweep import (
    CSV_COLUMNS,
    SweepConfig,
    load_sweep,
    run_row,
    run_sweep,
)
from tpsl_flwr.experiments.sweep_report import tables_markdown, write_plots
from tpsl_flwr.simulations.cli import main

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
    # The paper's variant, and the same grid with noise-aware training: same
    # run names (hence noise keys), plain vs posterior side by side
    assert {spec.config.label_denoise for spec in paper.runs()} == {"none"}
    posterior = load_sweep(folder / "paper_grid_posterior.toml")
    names = {spec.name for spec in posterior.runs()}
    assert names < {spec.name for spec in paper.runs()}
    assert {spec.config.label_denoise for spec in posterior.runs()} == {"posterior"}


# --- the rows axis ---------------------------------------------------------

CONFIGS = Path(sims.__file__).parent / "configs"


def _row(mechanism, auc, rows, seed=0, epsilon=None, dataset="synthetic-ctr"):
    """A hand-made runs.csv row."""
    return {
        "dataset": dataset,
        "mechanism": mechanism,
        "epsilon": epsilon,
        "sigma": None,
        "seed": seed,
        "rows": rows,
        "test_auc": auc,
        "norm": 0.6,
        "cosine": 0.6,
        "spectral": 0.6,
        "sda": 0.9 if mechanism == "none" else 0.7,
        "auc_bound": None if epsilon is None else 0.73,
    }


def _scaled_rows():
    """none and laplace eps=1 at 20k and 200k rows, two seeds each."""
    return [
        _row("none", 0.77, 20000, seed=0),
        _row("none", 0.79, 20000, seed=1),
        _row("laplace", 0.72, 20000, seed=0, epsilon=1.0),
        _row("laplace", 0.74, 20000, seed=1, epsilon=1.0),
        _row("none", 0.80, 200000, seed=0),
        _row("none", 0.80, 200000, seed=1),
        _row("laplace", 0.79, 200000, seed=0, epsilon=1.0),
        _row("laplace", 0.79, 200000, seed=1, epsilon=1.0),
    ]


def test_rows_axis_multiplies_runs_and_sets_each_runs_size():
    # Prepare
    sweep = SweepConfig(
        datasets=("synthetic-ctr",),
        mechanisms=("none", "laplace"),
        epsilons=(1.0,),
        rows=(20000, 0),
        seeds=(0, 1),
        experiment={"epochs": 1},
    )

    # Execute
    specs = sweep.runs("out")

    # Assert: 2 sizes x (none + laplace eps=1) x 2 seeds.
    assert len(specs) == 2 * 2 * 2
    assert [s.config.rows for s in specs] == [20000] * 4 + [0] * 4
    assert [s.name for s in specs[:4]] == [
        "synthetic-ctr_rows20000_none_seed0",
        "synthetic-ctr_rows20000_none_seed1",
        "synthetic-ctr_rows20000_laplace_eps1_seed0",
        "synthetic-ctr_rows20000_laplace_eps1_seed1",
    ]
    assert specs[4].name == "synthetic-ctr_rows0_none_seed0"
    assert specs[0].config.out_dir == str(
        Path("out") / "runs" / "synthetic-ctr_rows20000_none_seed0"
    )


def test_no_rows_axis_keeps_names_and_experiment_rows():
    # Prepare
    sweep = SweepConfig(
        datasets=("synthetic-ctr",),
        mechanisms=("none", "laplace"),
        experiment={"rows": 5000},
    )

    # Execute
    specs = sweep.runs()

    # Assert
    assert [s.name for s in specs] == [
        "synthetic-ctr_none_seed0",
        "synthetic-ctr_laplace_eps1_seed0",
    ]
    assert {s.config.rows for s in specs} == {5000}


def test_rows_axis_from_toml(tmp_path):
    # Prepare
    path = _write(tmp_path, '[grid]\nmechanisms = ["none"]\nrows = [0, 300]\n')

    # Execute
    sweep = load_sweep(path)

    # Assert
    assert sweep.rows == (0, 300)
    assert [s.name for s in sweep.runs()] == [
        "synthetic-ctr_rows0_none_seed0",
        "synthetic-ctr_rows300_none_seed0",
    ]


@pytest.mark.parametrize(
    ("rows", "value"),
    [
        ("[true]", "True"),
        ("[1.5]", "1.5"),
        ("[20000.0]", "20000.0"),
        ("[100, -3]", "-3"),
        ('["big"]', "'big'"),
        ("[]", "[]"),
    ],
)
def test_bad_rows_values_name_the_key_and_value(tmp_path, rows, value):
    # Prepare
    path = _write(tmp_path, f"[grid]\nrows = {rows}\n")

    # Execute
    with pytest.raises(ConfigError) as caught:
        load_sweep(path)

    # Assert
    message = str(caught.value)
    assert "grid.rows" in message
    assert re.search(rf"got {re.escape(value)}$", message)


def test_rows_in_grid_and_experiment_is_refused(tmp_path):
    # Prepare
    text = "[grid]\nrows = [1000]\n\n[experiment]\nrows = 1000\n"
    path = _write(tmp_path, text)

    # Execute / Assert
    with pytest.raises(ConfigError, match=r"experiment\.rows is set per run.*\[grid\]"):
        load_sweep(path)


def test_run_row_reports_rows_and_train_samples():
    # Prepare
    results = {
        "mechanism": "laplace",
        "epsilon": 1.0,
        "dataset": "synthetic-ctr",
        "train_rows": 16000,
        "config": {"seed": 0, "rows": 20000},
        "history": [{"samples": 16000, "attack_auc": {"sda": 0.7}}],
    }
    older = {"config": {"seed": 0, "rows": 0}, "history": [{"samples": 400}]}

    # Execute
    row = run_row("synthetic-ctr_rows20000_laplace_eps1_seed0", results)
    old = run_row("breast-cancer_none_seed0", older)

    # Assert
    assert row["rows"] == 20000 and row["train_samples"] == 16000
    assert row["sda"] == 0.7
    assert old["rows"] == 0 and old["train_samples"] == 400
    seed = CSV_COLUMNS.index("seed")
    assert CSV_COLUMNS[seed + 1 : seed + 3] == ("rows", "train_samples")


def test_one_size_per_dataset_keeps_dataset_names_and_no_scale_section():
    # Prepare: the experiment's rows (not an axis) is still one size.
    rows = [
        _row("none", 0.78, 20000),
        _row("laplace", 0.73, 20000, epsilon=1.0),
        _row("none", 0.95, 0, dataset="breast-cancer"),
    ]

    # Execute
    tables = tables_markdown(rows)

    # Assert
    assert "| synthetic-ctr | test AUC | 0.780 |" in tables
    assert "| breast-cancer | test AUC | 0.950 |" in tables
    assert "rows |" not in tables.split("## Table 2")[0]
    assert "Utility vs training-set size" not in tables


def test_several_sizes_group_tables_per_dataset_and_size():
    # Prepare
    rows = [*_scaled_rows(), _row("none", 0.7, 0, seed=0)]

    # Execute
    tables = tables_markdown(rows)

    # Assert
    table1 = tables.split("## Table 2")[0]
    assert "| synthetic-ctr, default rows | test AUC | 0.700 |" in table1
    assert "| synthetic-ctr, 20,000 rows | test AUC | 0.780 ± 0.010 |" in table1
    assert "| synthetic-ctr, 200,000 rows | test AUC | 0.800 ± 0.000 |" in table1
    assert "| synthetic-ctr, 200,000 rows | 1 | 0.790 ± 0.000 |" in tables


def test_utility_vs_rows_table_has_utility_and_gap_per_size():
    # Execute
    tables = tables_markdown(_scaled_rows())

    # Assert: laplace mean 0.73 vs none 0.78 at 20k rows; 0.79 vs 0.80 at 200k.
    section = tables.split("## Utility vs training-set size")[1]
    assert "| dataset | rows | none | laplace eps=1 | gap |" in section
    assert (
        "| synthetic-ctr | 20,000 | 0.780 ± 0.010 | 0.730 ± 0.010 | -0.050 |" in section
    )
    assert (
        "| synthetic-ctr | 200,000 | 0.800 ± 0.000 | 0.790 ± 0.000 | -0.010 |"
        in section
    )


def test_write_plots_adds_utility_vs_rows_only_for_several_sizes(tmp_path):
    # Prepare
    scaled, single = tmp_path / "scaled", tmp_path / "single"
    scaled.mkdir()
    single.mkdir()
    one_size = [r for r in _scaled_rows() if r["rows"] == 20000]

    # Execute
    scaled_paths = write_plots(_scaled_rows(), scaled)
    single_paths = write_plots(one_size, single)

    # Assert
    assert scaled_paths[-1] == scaled / "utility_vs_rows.png"
    assert len(scaled_paths) == 3
    for path in scaled_paths:
        assert path.read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in single_paths] == [
        "fig5_utility_vs_epsilon.png",
        "fig5_utility_vs_sda.png",
    ]
    assert not (single / "utility_vs_rows.png").exists()


def test_data_scale_config_parses():
    # Execute
    sweep = load_sweep(CONFIGS / "data_scale.toml")

    # Assert
    assert sweep.rows == (20000, 100000, 300000, 1000000, 3000000)
    assert sweep.epsilons == (1.0,)
    assert "rows" not in sweep.experiment
    specs = sweep.runs()
    assert len(specs) == 5 * 3
    assert specs[-1].name == "synthetic-ctr_rows3000000_discrete_eps1_seed0"
    assert specs[-1].config.batch_size == 1024
