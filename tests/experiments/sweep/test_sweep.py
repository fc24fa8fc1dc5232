"""`tpsl-flwr sweep`: a tiny grid end to end, resume, and bad configs."""

import csv
import json
import re
from pathlib import Path

import pytest

import tpsl_flwr.simulations as sims
from tpsl_flwr.cli.main import main
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.sweep.figures import FIGURES
from tpsl_flwr.experiments.sweep.report import tables_markdown, write_plots
from tpsl_flwr.experiments.sweep.run import (
    CSV_COLUMNS,
    SweepConfig,
    csv_columns,
    load_sweep,
    run_noise_seed,
    run_row,
    run_sweep,
)
from tpsl_flwr.experiments.sweep.stats import DIRECTION_COLUMNS
from tpsl_flwr.privacy.closed_forms import (
    sda_auc_gaussian,
    sda_auc_laplace,
    sda_auc_randomized_response,
)
from tpsl_flwr.testing import write_avazu, write_criteo

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
    # noise-seed = 0: every key is seeded; in-process runs are rehearsals.
    assert {(r["key_origin"], r["seeded_key"], r["run_kind"]) for r in rows} == {
        ("seed", "True", "rehearsal")
    }
    tables = (out / "tables.md").read_text()
    assert "Table 1: no protection" in tables
    assert "Table 2: Laplace" in tables and "Table 3: Discrete" in tables
    assert " ± " in tables
    assert "Noise keys: 10 of 10 runs used a seeded key" in tables
    assert "utility, not protection" in tables
    assert "| SDA vs ceiling | key |" in tables and "| seed (not secure) |" in tables
    # Clean-label statistics are the label party's; runs-public.csv is not.
    assert oct(out.stat().st_mode & 0o777) == oct(0o700)
    for name in ("runs.csv", "tables.md", "fig5_utility_vs_epsilon.png"):
        assert oct((out / name).stat().st_mode & 0o777) == oct(0o600), name
    public = (out / "runs-public.csv").read_text()
    assert oct((out / "runs-public.csv").stat().st_mode & 0o777) == oct(0o644)
    assert "key_origin,seeded_key,run_kind" in public and "test_auc" not in public
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
    assert not (folder / "paper_grid_posterior.toml").exists()
    # The paper's variant and noise-aware training in one grid: 48 plain runs,
    # 33 posterior ones (gaussian has none), each variant with its settings.
    specs = paper.runs()
    assert len(specs) == 48 + 33
    plain = [s.config for s in specs if s.config.label_denoise == "none"]
    posterior = [s.config for s in specs if s.config.label_denoise == "posterior"]
    assert (len(plain), len(posterior)) == (48, 33)
    assert {(c.lr_schedule, c.weight_decay, c.validation_fraction) for c in plain} == {
        ("constant", 0.0, 0.0)
    }
    assert {
        (c.lr_schedule, c.weight_decay, c.validation_fraction) for c in posterior
    } == {("cosine", 0.3, 0.1)}
    assert "gaussian" not in {c.mechanism for c in posterior}
    # Both variants share the keys the separate plain grid had.
    assert {c.noise_seed for c in posterior} < {c.noise_seed for c in plain}


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

    # Assert: three figures (PNG, PDF, JSON), then utility vs rows (PNG, PDF).
    assert scaled_paths[-2:] == [
        scaled / "utility_vs_rows.png",
        scaled / "utility_vs_rows.pdf",
    ]
    assert len(scaled_paths) == 3 * 3 + 2
    for path in scaled_paths:
        head = path.read_bytes()[:4]
        assert (
            head
            == {".png": b"\x89PNG", ".pdf": b"%PDF", ".json": b'{\n "'}[path.suffix]
        )
    assert [p.name for p in single_paths] == [
        f"{name}.{suffix}" for name in FIGURES for suffix in ("png", "pdf", "json")
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


def test_paper_scale_config_parses(tmp_path):
    # Arrange: the shipped grid, pointed at a small generated file of the format
    data = tmp_path / "criteo-45m.txt"
    write_criteo(data, 50, seed=0)
    text = (CONFIGS / "paper_scale.toml").read_text()
    assert 'data-path = "criteo-45m.txt"' in text
    grid = _write(tmp_path, text.replace("criteo-45m.txt", str(data)))

    # Execute
    specs = load_sweep(grid).runs()

    # Assert: 1 + 2 mechanisms x 3 epsilons, the whole file, one epoch, audited
    assert [s.name for s in specs][:2] == [
        "criteo_none_seed0",
        "criteo_laplace_eps1_seed0",
    ]
    assert len(specs) == 7
    assert {(s.config.rows, s.config.epochs, s.config.audit) for s in specs} == {
        (0, 1, True)
    }
    assert {s.config.mechanism for s in specs} == {"none", "laplace", "discrete"}


# --- the denoises axis -----------------------------------------------------

DENOISE_GRID = """
[grid]
datasets = ["breast-cancer"]
mechanisms = ["none", "laplace", "gaussian"]
epsilons = [1, 4]
sigmas = [1]
seeds = [0, 1]
denoises = ["none", "posterior"]

[experiment]
epochs = 1
batch-size = 128
noise-seed = 7
checkpoint = false

[denoise.none]
lr-schedule = "constant"
weight-decay = 0.0
validation-fraction = 0.0

[denoise.posterior]
lr-schedule = "cosine"
weight-decay = 0.3
validation-fraction = 0.1
"""


def test_denoises_axis_names_runs_skips_gaussian_posterior_and_applies_tables(
    tmp_path,
):
    # Prepare
    sweep = load_sweep(_write(tmp_path, DENOISE_GRID))

    # Execute
    specs = sweep.runs("out")

    # Assert: none and laplace under both values, gaussian under none only.
    names = [s.name for s in specs]
    assert len(specs) == 2 * 2 + 2 * 2 * 2 + 1 * 2
    assert names[:4] == [
        "breast-cancer_none_denoise-none_seed0",
        "breast-cancer_none_denoise-none_seed1",
        "breast-cancer_none_denoise-posterior_seed0",
        "breast-cancer_none_denoise-posterior_seed1",
    ]
    assert names[4:6] == [
        "breast-cancer_laplace_eps1_denoise-none_seed0",
        "breast-cancer_laplace_eps1_denoise-none_seed1",
    ]
    assert [n for n in names if "gaussian" in n] == [
        "breast-cancer_gaussian_sigma1_denoise-none_seed0",
        "breast-cancer_gaussian_sigma1_denoise-none_seed1",
    ]
    by_name = {s.name: s.config for s in specs}
    plain = by_name["breast-cancer_laplace_eps4_denoise-none_seed1"]
    post = by_name["breast-cancer_laplace_eps4_denoise-posterior_seed1"]
    assert (plain.denoise, plain.lr_schedule, plain.weight_decay) == (
        "none",
        "constant",
        0.0,
    )
    assert (post.denoise, post.lr_schedule, post.weight_decay) == (
        "posterior",
        "cosine",
        0.3,
    )
    assert (plain.validation_fraction, post.validation_fraction) == (0.0, 0.1)
    assert post.out_dir == str(
        Path("out") / "runs" / "breast-cancer_laplace_eps4_denoise-posterior_seed1"
    )


def test_plain_and_posterior_runs_of_a_pair_share_the_noise_key(tmp_path):
    # Prepare
    sweep = load_sweep(_write(tmp_path, DENOISE_GRID))
    no_axis = SweepConfig(
        datasets=("breast-cancer",),
        mechanisms=("laplace",),
        epsilons=(1.0,),
        seeds=(0,),
        experiment={"noise-seed": 7},
    )

    # Execute
    keys = {s.name: s.config.noise_seed for s in sweep.runs()}
    old = no_axis.runs()[0]

    # Assert: one key per (mechanism, level, seed), whatever the denoise value.
    pairs = {}
    for name, key in keys.items():
        pairs.setdefault(name.replace("_denoise-posterior", ""), set()).add(key)
        pairs.setdefault(name.replace("_denoise-none", ""), set()).add(key)
    assert all(len(found) == 1 for found in pairs.values())
    eps1 = "breast-cancer_laplace_eps1_denoise-{}_seed0"
    assert keys[eps1.format("none")] == keys[eps1.format("posterior")]
    # ... distinct across seeds, epsilons and mechanisms (5 points x 2 seeds)
    assert len(set(keys.values())) == (1 + 2 + 1) * 2
    assert keys[eps1.format("none")] != keys[eps1.format("none").replace("d0", "d1")]
    assert (
        keys[eps1.format("none")] != keys[eps1.format("none").replace("eps1", "eps4")]
    )
    # ... and the key a sweep without the axis gives the same point.
    assert old.name == "breast-cancer_laplace_eps1_seed0"
    assert (
        keys[eps1.format("posterior")]
        == old.config.noise_seed
        == run_noise_seed(7, old.name)
    )


def test_no_denoises_axis_keeps_names_and_the_experiments_denoise():
    # Prepare
    sweep = SweepConfig(
        datasets=("breast-cancer",),
        mechanisms=("none", "laplace", "gaussian"),
        sigmas=(1.0,),
        experiment={"denoise": "none", "validation-fraction": 0.0},
    )

    # Execute
    specs = sweep.runs()

    # Assert
    assert [s.name for s in specs] == [
        "breast-cancer_none_seed0",
        "breast-cancer_laplace_eps1_seed0",
        "breast-cancer_gaussian_sigma1_seed0",
    ]
    assert {s.config.denoise for s in specs} == {"none"}


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[grid]\ndenoises = ["none", "posteriour"]\n', "'posteriour'"),
        ('[grid]\ndenoises = ["auto"]\n', "'auto'"),
        ("[grid]\ndenoises = []\n", "grid.denoises"),
        ('[grid]\ndenoises = ["none", "none"]\n', "repeated"),
        ("[grid]\ndenoises = [1]\n", "grid.denoises"),
        (
            '[grid]\ndenoises = ["none"]\n[denoise.posteriour]\nlr = 0.1\n',
            "'posteriour'",
        ),
        (
            '[grid]\ndenoises = ["none"]\n[denoise.none]\nweight-decai = 0.1\n',
            "weight-decai",
        ),
        (
            '[grid]\ndenoises = ["none"]\n[denoise.none]\nmechanism = "laplace"\n',
            r"denoise\.none\.mechanism is set per run",
        ),
        (
            '[grid]\ndenoises = ["none"]\n[denoise.none]\ndenoise = "posterior"\n',
            r"denoise\.none\.denoise is set per run",
        ),
        (
            '[grid]\ndenoises = ["none"]\n[denoise.none]\nnoise-seed = 3\n',
            r"denoise\.none\.noise-seed",
        ),
        ('[grid]\ndenoises = ["none"]\n[denoise]\nnone = 1\n', r"denoise\.none"),
        ("[denoise.posterior]\nlr = 0.1\n", r"\[denoise\.posterior\].*grid\.denoises"),
        (
            '[grid]\ndenoises = ["none"]\n[experiment]\ndenoise = "none"\n',
            r"experiment\.denoise is set per run",
        ),
        (
            '[grid]\nmechanisms = ["gaussian"]\nsigmas = [1]\n'
            'denoises = ["posterior"]\n',
            "no runs",
        ),
        (
            '[grid]\ndenoises = ["posterior"]\n[denoise.posterior]\n'
            'lr-schedule = "sawtooth"\n',
            "sawtooth",
        ),
    ],
)
def test_bad_denoise_config_names_the_value(tmp_path, text, named):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=named):
        load_sweep(path)


def _pair_rows():
    """none and laplace eps=1, plain and posterior, two seeds each."""
    rows = []
    for denoise, shift in (("none", 0.0), ("posterior", 0.02)):
        for seed in (0, 1):
            for row in (
                _row("none", 0.78 - shift, 20000, seed=seed),
                _row("laplace", 0.70 + shift + 0.01 * seed, 20000, seed, 1.0),
            ):
                rows.append({**row, "denoise": denoise})
    return rows


def test_tables_put_plain_and_posterior_side_by_side():
    # Execute
    tables = tables_markdown(_pair_rows())

    # Assert: a denoise column, the two values' rows next to each other.
    table1 = tables.split("## Table 2")[0]
    assert "| dataset | denoise | metric | utility | NA | SA | SDA |" in table1
    assert "| synthetic-ctr | none | test AUC | 0.780 ± 0.000 |" in table1
    assert "| synthetic-ctr | posterior | test AUC | 0.760 ± 0.000 |" in table1
    table2 = tables.split("## Table 2")[1].split("##")[0]
    assert "| dataset | epsilon | denoise | utility |" in table2
    plain = "| synthetic-ctr | 1 | none | 0.705 ± 0.005 |"
    post = "| synthetic-ctr | 1 | posterior | 0.725 ± 0.005 |"
    lines = table2.splitlines()
    at = [i for i, line in enumerate(lines) if line.startswith((plain, post))]
    assert len(at) == 2 and at[1] == at[0] + 1
    side = tables.split("## Denoise side by side")[1]
    assert "| utility none | utility posterior | posterior - none |" in side
    assert (
        "| synthetic-ctr | laplace | 1 | 0.705 ± 0.005 | 0.725 ± 0.005 | +0.020 |"
        in side
    )
    assert (
        "| synthetic-ctr | none | - | 0.780 ± 0.000 | 0.760 ± 0.000 | -0.020 |" in side
    )


def test_one_denoise_value_keeps_the_old_tables_and_csv_columns():
    # Prepare
    rows = [r for r in _pair_rows() if r["denoise"] == "posterior"]

    # Execute
    tables = tables_markdown(rows)

    # Assert
    assert "denoise" not in tables
    assert "| dataset | metric | utility | NA | SA | SDA |" in tables
    # (no run reports an attack direction: those columns are left out)
    assert csv_columns(rows) == tuple(
        c for c in CSV_COLUMNS if c not in DIRECTION_COLUMNS
    )
    columns = csv_columns(_pair_rows())
    assert columns[columns.index("sigma") + 1] == "denoise"
    assert set(columns) - set(CSV_COLUMNS) == {"denoise"}


def test_write_plots_draws_each_denoise_value_and_splits_scale_panels(tmp_path):
    # Prepare: two sizes too, so utility vs rows splits per denoise value.
    rows = _pair_rows() + [{**r, "rows": 200000} for r in _pair_rows()]

    # Execute
    paths = write_plots(rows, tmp_path)
    tables = tables_markdown(rows)

    # Assert
    pngs = [p.name for p in paths if p.suffix == ".png"]
    assert pngs == [f"{name}.png" for name in FIGURES] + ["utility_vs_rows.png"]
    for path in paths:
        if path.suffix == ".png":
            assert path.read_bytes()[:4] == b"\x89PNG"
    scale = tables.split("## Utility vs training-set size")[1]
    assert "| synthetic-ctr, denoise none | 20,000 | 0.780 ± 0.000 |" in scale
    assert "| synthetic-ctr, denoise posterior | 20,000 | 0.760 ± 0.000 |" in scale


def test_tiny_denoise_sweep_runs_pairs_on_one_key(tmp_path):
    # Prepare: no protection and laplace eps=4 under both values, gaussian plain.
    text = DENOISE_GRID.replace("epsilons = [1, 4]", "epsilons = [4]").replace(
        "seeds = [0, 1]", "seeds = [0]"
    )
    sweep = load_sweep(_write(tmp_path, text))

    # Execute
    done = run_sweep(sweep, tmp_path / "out", progress=False)

    # Assert
    assert len(done["ran"]) == 5
    with (tmp_path / "out" / "runs.csv").open() as handle:
        rows = {r["run"]: r for r in csv.DictReader(handle)}
    laplace = "breast-cancer_laplace_eps4_denoise-{}_seed0"
    assert rows[laplace.format("posterior")]["denoise"] == "posterior"
    assert rows[laplace.format("none")]["denoise"] == "none"
    results = {
        name: json.loads(
            (tmp_path / "out" / "runs" / name / "results.json").read_text()
        )
        for name in rows
    }
    prints = {n: r["noise_key"]["fingerprint"] for n, r in results.items()}
    assert prints[laplace.format("none")] == prints[laplace.format("posterior")]
    assert (
        prints[laplace.format("none")]
        != prints["breast-cancer_none_denoise-none_seed0"]
    )
    assert results[laplace.format("posterior")]["config"]["lr-schedule"] == "cosine"
    tables = (tmp_path / "out" / "tables.md").read_text()
    assert "## Denoise side by side" in tables


@pytest.mark.parametrize(
    "name, dataset", [("criteo_small", "criteo"), ("avazu_small", "avazu")]
)
def test_small_file_configs_take_the_users_file_os_keys_and_five_seeds(
    tmp_path, name, dataset
):
    # Arrange: a generated file of the config's format
    write = write_criteo if dataset == "criteo" else write_avazu
    data = write(tmp_path / f"{dataset}.txt", 300, seed=2).path
    given = {"data-path": str(data), "cache-dir": str(tmp_path / "cache")}

    # Execute
    grid = load_sweep(CONFIGS / f"{name}.toml", given)

    # Assert: the CLI's file and cache folder, keys from the OS, 5 seeds
    configs = [spec.config for spec in grid.runs()]
    assert len(configs) == 5 * (1 + 2 * 5 + 5)
    assert {c.dataset for c in configs} == {dataset}
    assert {(c.data_path, c.cache_dir) for c in configs} == {
        (str(data), str(tmp_path / "cache"))
    }
    assert {c.noise_seed for c in configs} == {-1}
    assert sorted({c.seed for c in configs}) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "name, dataset",
    [("baselines_matched", "criteo"), ("baselines_matched_synthetic", "synthetic-ctr")],
)
def test_matched_sda_configs_run_every_defense_at_three_levels_with_os_keys(
    tmp_path, name, dataset
):
    # Arrange: for the file grid, a generated Criteo file and a cache folder
    given = {}
    if dataset == "criteo":
        data = write_criteo(tmp_path / "criteo.txt", 300, seed=2).path
        given = {"data-path": str(data), "cache-dir": str(tmp_path / "cache")}

    # Execute
    grid = load_sweep(CONFIGS / f"{name}.toml", given)

    # Assert: every defense, 3 levels each (none and max-norm once), 3 seeds,
    # keys from the OS, the CLI's file where there is one
    configs = [spec.config for spec in grid.runs()]
    assert len(configs) == 3 * (1 + 1 + 3 * 5)
    assert set(grid.mechanisms) == {
        "none",
        "laplace",
        "discrete",
        "rr-prior",
        "gaussian",
        "marvell",
        "max-norm",
    }
    assert {c.dataset for c in configs} == {dataset}
    assert {c.noise_seed for c in configs} == {-1}
    assert sorted({c.seed for c in configs}) == [0, 1, 2]
    if dataset == "criteo":
        assert {(c.data_path, c.cache_dir) for c in configs} == {
            (str(data), str(tmp_path / "cache"))
        }
    else:
        assert {c.rows for c in configs} == {10000}
    # The levels match SDA by the closed forms: 0.70, 0.80, 0.90 within 0.015
    # (Laplace and randomized response share one epsilon axis) and 0.005
    # (Gaussian).
    targets = (0.70, 0.80, 0.90)
    for closed_form in (sda_auc_laplace, sda_auc_randomized_response):
        aucs = [closed_form(eps) for eps in grid.epsilons]
        assert aucs == pytest.approx(targets, abs=0.015)
    assert [sda_auc_gaussian(s) for s in grid.sigmas] == pytest.approx(
        targets, abs=0.005
    )
    assert list(grid.marvell_powers) == sorted(grid.marvell_powers, reverse=True)
