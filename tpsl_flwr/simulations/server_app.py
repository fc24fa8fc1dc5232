"""The label party's ServerApp: a thin wrapper over :func:`run_label_party`."""

from __future__ import annotations

from logging import INFO
from pathlib import Path

from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.superlink.grid import HttpGrid, InMemoryGrid

from tpsl_flwr.engines.app_bundle import check_installed_app
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.experiment import RESULTS_FILE, run_label_party
from tpsl_flwr.experiments.run_folder import run_in_folder
from tpsl_flwr.privacy.epsilon_text import epsilon_text, results_total_text

app = ServerApp()

ENGINE_OF_GRID: tuple[tuple[type, str], ...] = (
    (InMemoryGrid, "ray"),  # flwr run on the simulation engine (Ray)
    (HttpGrid, "deployment"),  # flwr run on a SuperLink with SuperNodes
)
"""The engine name (results, report, logs) of each Flower runtime's Grid."""


def engine_of(grid: Grid) -> str:
    """``"ray"``, ``"deployment"`` or ``"local"`` (the in-process Grid)."""
    return next(
        (name for kind, name in ENGINE_OF_GRID if isinstance(grid, kind)), "local"
    )


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run TPSL with the run config; write ``out-dir/results.json``.

    The run-folder rules (:func:`~tpsl_flwr.experiments.run_folder.run_in_folder`,
    the same an embedder's ServerApp calls): an earlier run's results in
    ``out-dir`` are renamed ``*.previous.*`` first; a failure leaves
    ``out-dir/FAILED`` with its one-line error.
    """
    cfg = ExperimentConfig.from_run_config(context.run_config)
    out = Path(cfg.out_dir)

    def run() -> dict:
        check_installed_app()  # a plain `flwr run .` may have packed run folders
        return run_label_party(grid, cfg, engine=engine_of(grid))

    results = run_in_folder(
        out,
        run,
        results_file=None,  # run_label_party writes results.json and the report
    )
    assert results is not None
    if results.get("note"):
        log(INFO, "TPSL: %s", results["note"])
    metric = "test_auc" if "test_auc" in results else "test_accuracy"
    log(
        INFO,
        "TPSL finished: training %.1f s (label party), %s %.4f, epsilon spent %s "
        "(%s; total of releases %s); results in %s",
        results["seconds"],
        metric,
        results.get(metric, float("nan")),
        epsilon_text(results["epsilon_spent"], results.get("mechanism")),
        results.get("run_kind"),
        results_total_text(results),
        out / RESULTS_FILE,
    )
