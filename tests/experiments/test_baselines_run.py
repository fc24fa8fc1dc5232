"""The baseline defenses end to end: `simulate` in process, and a tiny sweep.

Marvell and max-norm state no DP guarantee: their epsilon is empty (None) in
results.json and runs.csv, the report and summary say "no DP guarantee", and
the ledger still records the run. RR-with-prior is eps-label-DP and spends
its epsilon like the other mechanisms.
"""

from __future__ import annotations

import csv
import json

import pytest

from tpsl_flwr.cli.main import main
from tpsl_flwr.errors import ReleaseRefused
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run import run_experiment
from tpsl_flwr.experiments.sweep.run import SweepConfig, run_sweep
from tpsl_flwr.privacy.epsilon_text import results_total_text
from tpsl_flwr.release.ledger import PrivacyLedger
from tpsl_flwr.testing import write_criteo

BASE = {"dataset": "breast-cancer", "epochs": 2, "batch_size": 64, "noise_seed": 0}


@pytest.mark.parametrize(
    ("mechanism", "setting", "spent"),
    [
        ("marvell", {"marvell_power": 2.0}, None),
        ("max-norm", {}, None),
        ("rr-prior", {"epsilon": 2.0}, 2.0),
    ],
)
def test_each_baseline_runs_in_process_and_states_its_guarantee(
    tmp_path, mechanism, setting, spent
):
    # Prepare
    cfg = ExperimentConfig(
        **BASE, mechanism=mechanism, audit=True, out_dir=str(tmp_path), **setting
    )
    # Execute
    results = run_experiment(cfg)
    # Assert: it trained, the attacks ran on what the nodes received, and
    # the epsilon is what the mechanism guarantees.
    assert len(results["history"]) == 2
    assert 0.0 <= results["test_auc"] <= 1.0
    assert "sda" in results["history"][-1]["attack_auc"]
    assert results["epsilon_spent"] == spent
    assert results["privacy"]["epsilon"] == spent
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["epsilon_spent"] == spent
    report = (tmp_path / "report.md").read_text()
    assert results["ledger"]["kind"] == "rehearsal"  # recorded, not counted
    if spent is None:
        assert results["privacy"]["epsilon_at_delta"] is None
        assert results["privacy"]["auc_bound"] is None
        assert any("no DP guarantee" in n for n in results["privacy"]["notes"])
        assert "no DP guarantee" in report
        assert "inf" not in report.split("epsilon spent per label:")[1].split(";")[0]
    else:
        assert "epsilon spent per label: 2" in report
    if mechanism == "marvell":
        assert results["marvell_power"] == 2.0
        assert results["epsilon"] is None


def test_simulate_cli_takes_marvell_power(tmp_path, capsys):
    code = main(
        [
            "simulate",
            "--dataset",
            "breast-cancer",
            "--epochs",
            "1",
            "--noise-seed",
            "0",
            "--mechanism",
            "marvell",
            "--marvell-power",
            "0.5",
            "--out-dir",
            str(tmp_path),
        ]
    )
    assert code == 0
    assert "epsilon spent n/a (no DP guarantee)" in capsys.readouterr().out
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["marvell_power"] == 0.5 and saved["epsilon_spent"] is None


def test_a_tiny_sweep_runs_every_baseline(tmp_path, capsys):
    # Prepare
    sweep = SweepConfig(
        datasets=("breast-cancer",),
        mechanisms=("none", "laplace", "marvell", "max-norm", "rr-prior"),
        epsilons=(1.0,),
        marvell_powers=(1.0,),
        experiment={"epochs": 1, "batch-size": 128, "checkpoint": False},
    )
    # Execute
    done = run_sweep(sweep, tmp_path, progress=False)
    # Assert
    names = sorted(done["ran"])
    assert names == [
        "breast-cancer_laplace_eps1_seed0",
        "breast-cancer_marvell_power1_seed0",
        "breast-cancer_max-norm_seed0",
        "breast-cancer_none_seed0",
        "breast-cancer_rr-prior_eps1_seed0",
    ]
    with (tmp_path / "runs.csv").open() as handle:
        rows = {r["mechanism"]: r for r in csv.DictReader(handle)}
    assert rows["marvell"]["marvell_power"] == "1.0"
    for heuristic in ("marvell", "max-norm"):
        assert rows[heuristic]["epsilon_spent"] == ""  # empty, not 0 or inf
        assert rows[heuristic]["epsilon"] == ""
    assert float(rows["rr-prior"]["epsilon_spent"]) == 1.0
    tables = (tmp_path / "tables.md").read_text()
    assert "## marvell (no DP guarantee)" in tables
    assert "## max-norm (no DP guarantee)" in tables
    assert "## rr-prior ((eps, 0)-DP)" in tables
    # max-norm takes no parameter: one level, written "-".
    assert "| breast-cancer | - |  |" in tables
    for png in ("fig5_utility_vs_epsilon.png", "fig5_utility_vs_sda.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def _release(out, path, **fields):
    return ExperimentConfig(
        dataset="criteo",
        data_path=str(path),
        epochs=1,
        batch_size=256,
        validation_fraction=0.0,
        out_dir=str(out),
        release=True,
        **fields,
    )


def test_releases_under_the_baselines_are_recorded_honestly(tmp_path):
    # Prepare: labels that are not public (a generated Criteo file).
    path = tmp_path / "train.txt"
    write_criteo(path, 3000, seed=4, positive_rate=0.25)
    # Execute / Assert: a heuristic with no DP guarantee is released only
    # when acknowledged as unprotected, as `none` is.
    with pytest.raises(ReleaseRefused, match="states no DP guarantee"):
        run_experiment(_release(tmp_path / "m", path, mechanism="max-norm"))
    done = run_experiment(
        _release(tmp_path / "m", path, mechanism="max-norm", unprotected_release=True)
    )
    assert done["run_kind"] == "release" and done["epsilon_spent"] is None
    entries = PrivacyLedger().sets()[0][1]
    assert [(e.mechanism, e.epsilon, e.kind) for e in entries] == [
        ("max-norm", None, "release")
    ]
    # The label set now has no finite total, and says so.
    assert done["epsilon_total"] == "inf"
    assert results_total_text(done) == "inf (no guarantee at any delta)"
    # RR-with-prior is refused as a further release until acknowledged, and
    # then adds its epsilon to the ledger.
    with pytest.raises(ReleaseRefused, match="released 1 time"):
        run_experiment(_release(tmp_path / "r", path, mechanism="rr-prior"))
    rr = run_experiment(
        _release(tmp_path / "r", path, mechanism="rr-prior", new_release=True)
    )
    assert rr["epsilon_spent"] == 1.0
    kinds = [(e.mechanism, e.epsilon) for e in PrivacyLedger().sets()[0][1]]
    assert kinds == [("max-norm", None), ("rr-prior", 1.0)]
