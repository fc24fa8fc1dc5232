"""The label party: a ServerApp running :class:`~tpsl_flwr.strategies.TPSLStrategy`.

It reads only ``labels.csv`` (never a feature file), trains the top model on the
nodes' embeddings, sends back only perturbed gradients, and writes
``out-dir/results.json`` under the run-folder rules, in one line
(:func:`tpsl_flwr.run_in_folder`: atomic results, ``FAILED`` with
the one-line error on failure, an earlier run's results kept as
``results.previous.json``).
"""

from __future__ import annotations

from logging import INFO
from typing import Any

from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from multiclass_tabular.task import AppConfig, build_strategy, results_of
from tpsl_flwr import run_in_folder

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Train with label DP; write ``out-dir/results.json`` (or ``FAILED``)."""
    cfg = AppConfig.from_run_config(context.run_config)
    run_in_folder(cfg.out_dir, lambda: train(grid, context.run_config, cfg))


def train(grid: Grid, run_config: dict[str, Any], cfg: AppConfig) -> dict[str, Any]:
    """Run the label party; log and return the test accuracy and the epsilon spent."""
    strategy = build_strategy(run_config)
    result = strategy.start(grid=grid)
    results = results_of(result, strategy, cfg)
    log(
        INFO,
        "test accuracy %.4f, epsilon spent %s (total %s), %s",
        results["test_accuracy"],
        result.epsilon_spent,
        result.epsilon_total,
        cfg.mechanism,
    )
    return results
