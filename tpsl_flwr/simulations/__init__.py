"""Flower wiring: ServerApp/ClientApp, engines, experiment configs and the CLI.

:func:`run_in_folder` is the run-folder rules for any ServerApp, in one line
(one folder per run, ``FAILED`` with a one-line error, atomic results)::

    from tpsl_flwr.simulations import run_in_folder

    run_in_folder(out_dir, lambda: train(grid, context))

It is imported on first use: the ClientApp module of this package stays light.
"""

from typing import Any

__all__ = ["run_in_folder"]


def __getattr__(name: str) -> Any:
    """:func:`~tpsl_flwr.experiments.run_folder.run_in_folder`, lazily."""
    if name == "run_in_folder":
        from tpsl_flwr.experiments.run_folder import run_in_folder

        return run_in_folder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
