"""`tpsl-flwr sweep report DIR [DIR ...]`: one report over several sweep folders."""

import csv
import json

import pytest

from tpsl_flwr.cli.main import main
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.sweep.merge import read_sweep, report_sweeps
from tpsl_flwr.experiments.sweep.run import load_sweep, run_sweep

from .results_factory import grid, write_sweep


def _runs_csv(folder):
    with (folder / "runs.csv").open() as handle:
        return list(csv.DictReader(handle))


def test_two_folders_make_one_table_over_all_their_seeds(tmp_path):
    # Prepare: seed 0 in one sweep, seed 1 added later in another (the
    # factory gives each seed's data file its own path: same data, moved).
    first = write_sweep(tmp_path / "first", grid(seeds=(0,)))
    later = write_sweep(tmp_path / "later", grid(seeds=(1,)))
    out = tmp_path / "merged"

    # Execute
    done = report_sweeps([first, later], out)

    # Assert: one runs.csv, one table whose cells are over both seeds.
    rows = _runs_csv(out)
    assert done["runs"] == len(rows) == 2 * 5
    assert {r["seed"] for r in rows} == {"0", "1"}
    tables = (out / "tables.md").read_text()
    assert "seeds [0, 1]" in tables
    table2 = tables.split("## Table 2")[1].split("##")[0]
    assert "| criteo | 1 | 0.705 ± 0.005 |" in table2
    figure = json.loads((out / "fig5_utility_vs_epsilon.json").read_text())
    laplace = next(s for s in figure["panels"][0]["series"] if s["name"] == "laplace")
    assert {p["runs"] for p in laplace["points"]} == {2}
    assert "std over seeds (2 runs a point)" in figure["caption"]
    for name in ("tables.tex", "summary.csv", "attacks_vs_epsilon.pdf"):
        assert (out / name).exists(), name


def test_cli_report_merges_and_names_the_differing_setting(tmp_path, capsys):
    # Prepare: the second sweep ran with another batch size.
    first = write_sweep(tmp_path / "first", grid(seeds=(0,)))
    other = write_sweep(
        tmp_path / "other", grid(seeds=(1,), settings={"batch-size": 256})
    )
    good = write_sweep(tmp_path / "good", grid(seeds=(2,)))

    # Execute
    merged = main(
        ["sweep", "report", str(first), str(good), "--out-dir", str(tmp_path / "m")]
    )
    refused = main(
        ["sweep", "report", str(first), str(other), "--out-dir", str(tmp_path / "x")]
    )

    # Assert
    assert merged == 0
    assert len(_runs_csv(tmp_path / "m")) == 10
    assert refused == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "'batch-size': 128 vs 256" in err[0]
    assert str(first) in err[0] and str(other) in err[0]
    assert not (tmp_path / "x" / "runs.csv").exists()


def test_different_data_is_refused_naming_the_fact(tmp_path):
    # Prepare: a sample with another positive rate, under the same name.
    first = write_sweep(tmp_path / "first", grid(seeds=(0,)))
    other = write_sweep(
        tmp_path / "other", grid(seeds=(1,), data_info={"positive_rate": 0.3})
    )

    # Execute / Assert
    with pytest.raises(
        ConfigError, match=r"different data.*positive_rate: 0.25 vs 0.3"
    ):
        report_sweeps([first, other], tmp_path / "out")


def test_a_run_found_in_two_folders_is_refused(tmp_path):
    # Prepare: a second folder holding the same runs.
    first = write_sweep(tmp_path / "first", grid(seeds=(0,)))
    again = write_sweep(tmp_path / "again", grid(seeds=(0,)))

    # Execute / Assert
    with pytest.raises(ConfigError, match="criteo_none_seed0 is in two sweep folders"):
        report_sweeps([first, again], tmp_path / "out")


def test_a_folder_without_runs_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="not a sweep folder"):
        read_sweep(tmp_path)
    (tmp_path / "runs" / "half").mkdir(parents=True)
    (tmp_path / "runs" / "half" / "results.json").write_text('{"history": [')
    with pytest.raises(ConfigError, match="no finished run"):
        read_sweep(tmp_path)


def test_runs_csv_selects_the_runs_of_the_folder(tmp_path):
    # Prepare: a run left in runs/ by an older grid, not in runs.csv.
    runs = grid(seeds=(0,))
    folder = write_sweep(tmp_path / "s", runs)
    old = dict(runs)
    write_sweep(tmp_path / "s", {"criteo_old_grid_seed0": old.pop("criteo_none_seed0")})
    (folder / "runs.csv").write_text("run\n" + "".join(f"{n}\n" for n in runs))

    # Execute
    found = read_sweep(folder)

    # Assert
    assert sorted(r.name for r in found) == sorted(runs)


@pytest.mark.slow
def test_two_real_sweeps_merge_and_the_bare_form_still_runs(tmp_path):
    # Prepare: one grid, run as two sweeps of one seed each (bare and run forms).
    text = """
[grid]
datasets = ["breast-cancer"]
mechanisms = ["none", "laplace"]
epsilons = [2]
seeds = [{seed}]

[experiment]
epochs = 2
batch-size = 128
noise-seed = 3
checkpoint = false
"""
    for seed, form in ((0, []), (1, ["run"])):
        config = tmp_path / f"seed{seed}.toml"
        config.write_text(text.format(seed=seed))
        out = tmp_path / f"s{seed}"
        args = ["sweep", *form, str(config), "--out-dir", str(out), "--no-progress"]
        assert main(args) == 0

    # Execute
    done = report_sweeps([tmp_path / "s0", tmp_path / "s1"], tmp_path / "m", "last")

    # Assert
    rows = _runs_csv(tmp_path / "m")
    assert done["runs"] == 4
    assert {(r["mechanism"], r["seed"], r["epoch"]) for r in rows} == {
        (m, s, "2") for m in ("none", "laplace") for s in ("0", "1")
    }
    assert {r["epoch_rule"] for r in rows} == {"last"}
    tables = (tmp_path / "m" / "tables.md").read_text()
    assert "at each run's last epoch" in tables
    assert "| breast-cancer | 2 | " in tables and " ± " in tables
    # The same grid again resumes: nothing runs.
    again = run_sweep(
        load_sweep(tmp_path / "seed0.toml"), tmp_path / "s0", progress=False
    )
    assert again["ran"] == []
