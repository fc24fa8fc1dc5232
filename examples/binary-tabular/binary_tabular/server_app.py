"""The label party: a ServerApp running :class:`~tpsl_flwr.strategies.TPSLStrategy`.

It reads only ``labels.csv`` (never a feature file), trains the top model on the
nodes' embeddings, sends back only perturbed gradients, and writes
``out-dir/results.json``.
"""

from __future__ import annotations

from logging import INFO

from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from binary_tabular.task import AppConfig, build_strategy, write_results

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Train with label DP; log and write the test AUC and the epsilon spent."""
    cfg = AppConfig.from_run_config(context.run_config)
    strategy = build_strategy(context.run_config)
    result = strategy.start(grid=grid)
    path = write_results(cfg.out_dir, result, strategy, cfg)
    log(
        INFO,
        "test AUC %.4f, epsilon spent %s (%s); results in %s",
        strategy.history[-1]["test_auc"],
        result.epsilon_spent,
        cfg.mechanism,
        path,
    )
