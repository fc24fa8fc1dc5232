"""The label party: a ServerApp running :class:`~tpsl_flwr.strategies.TPSLStrategy`.

It reads only ``labels.csv`` (never a feature file), trains its own top model
on the three nodes' embeddings, sends back only perturbed gradients, and
follows the run-folder rules in one line
(:func:`tpsl_flwr.run_in_folder`): ``out-dir/results.json``
written atomically when the run finishes, ``out-dir/FAILED`` with the one-line
error when it does not, an earlier run's results kept as
``results.previous.json``.
"""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from three_party_categorical.task import AppConfig, train
from tpsl_flwr import run_in_folder

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Train with label DP; write ``out-dir/results.json`` (or ``FAILED``)."""
    out_dir = AppConfig.from_run_config(context.run_config).out_dir
    run_in_folder(out_dir, lambda: train(grid, context.run_config))
