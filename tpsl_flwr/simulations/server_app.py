"""The label party's ServerApp: a thin wrapper over :func:`run_label_party`."""

from __future__ import annotations

from logging import INFO

from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.experiment import RESULTS_FILE, run_label_party

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run TPSL with the run config; write ``out-dir/results.json``."""
    cfg = ExperimentConfig.from_run_config(context.run_config)
    results = run_label_party(grid, cfg, engine="flower")
    summary = {
        k: results.get(k) for k in ("test_auc", "test_accuracy", "epsilon_spent")
    }
    log(
        INFO,
        "TPSL finished in %.1f s: %s; results in %s/%s",
        results["seconds"],
        summary,
        cfg.out_dir,
        RESULTS_FILE,
    )
