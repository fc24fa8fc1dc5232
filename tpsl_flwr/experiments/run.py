"""Run one experiment, on the in-process engine or on Flower's Ray simulation.

The one recipe behind ``tpsl-flwr simulate``, ``tpsl-flwr sweep``, the benches
and the end-to-end tests:

* ``local``: an :class:`~tpsl_flwr.engines.inprocess.InProcessGrid` of
  ``num-parties`` virtual nodes running the app's ClientApp, and the label
  party (:func:`~tpsl_flwr.experiments.experiment.run_label_party`) on it, in
  this process;
* ``ray``: ``flwr run`` of the app on Flower's Ray simulation
  (:func:`~tpsl_flwr.engines.flower_run.run_on_ray`), after the label party's
  seeded key, if any, is put in its private folder: ``noise-seed`` never enters
  the run config the nodes receive.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run_folder import failed_on_error, prepare_run_folder

if TYPE_CHECKING:
    from tpsl_flwr.engines.inprocess import InProcessGrid
    from tpsl_flwr.engines.virtual_nodes import ClientAppCallable

__all__ = [
    "ENGINES",
    "check_engine",
    "run_experiment",
    "run_inprocess_experiment",
]

ENGINES: tuple[str, ...] = ("local", "ray")
"""The engines :func:`run_experiment` runs on."""


def check_engine(engine: str) -> str:
    """Return ``engine`` after checking it is one of :data:`ENGINES`.

    Raises
    ------
    ConfigError
        If ``engine`` is unknown (the message names it and the valid ones).

    Examples
    --------
    >>> check_engine("ray")
    'ray'
    >>> check_engine("gpu")
    Traceback (most recent call last):
    ...
    tpsl_flwr.errors.ConfigError: unknown engine 'gpu'; valid engines: local, ray
    """
    if engine not in ENGINES:
        raise ConfigError(
            f"unknown engine {engine!r}; valid engines: {', '.join(ENGINES)}"
        )
    return engine


def run_experiment(
    cfg: ExperimentConfig,
    engine: str = "local",
    *,
    echo: TextIO | None = None,
    timeout: float = 3600.0,
    overwrite: bool | None = None,
) -> dict[str, Any]:
    """Run the experiment ``cfg`` on ``engine``; return its results JSON.

    Either engine writes ``results.json`` and ``report.md`` to ``cfg.out_dir``
    (atomically), or ``FAILED`` with the one-line error if the run fails; the
    folder is prepared first by
    :func:`~tpsl_flwr.experiments.run_folder.prepare_run_folder`.

    Parameters
    ----------
    cfg
        The experiment (its ``noise_seed`` stays with the label party).
    engine
        ``"local"``: in this process, one torch thread unless
        ``OMP_NUM_THREADS`` is set (the parties share the process; one thread
        per step beats several fighting over the cores, ~10x measured on 2
        loaded cores). ``"ray"``: Flower's Ray simulation (``flwr run``).
    echo
        ``ray``: where to copy the run's log lines as they arrive. ``None``
        (default) is quiet: no log copy on ``ray``, only Flower's warnings and
        errors on ``local``.
    timeout
        Seconds to wait: for each reply of a node (``local``), for the whole
        run (``ray``).
    overwrite
        ``True``: replace an earlier run in ``cfg.out_dir``; ``False``: refuse
        a folder holding one (``tpsl-flwr simulate`` without ``--overwrite``).
        ``None`` (default, for callers that own their folder, like a sweep's
        ``runs/<name>/``): replace it unless ``cfg.resume`` continues it.

    Returns
    -------
    dict
        The results JSON (one schema for both engines; ``engine`` names it).

    Raises
    ------
    ConfigError
        If ``engine`` is unknown, a setting is refused by the label party, or
        ``cfg.out_dir`` holds an earlier run and ``overwrite`` is ``False``.
    RuntimeError
        ``ray``: if the Flower run did not complete (``FlowerLaunchError``).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as out:
    ...     cfg = ExperimentConfig(
    ...         dataset="breast-cancer", epochs=1, noise_seed=0, out_dir=out
    ...     )
    ...     results = run_experiment(cfg)
    >>> results["engine"], results["epsilon_spent"], results["test_auc"] > 0.9
    ('local', 1.0, True)
    """
    check_engine(engine)
    prepare_run_folder(
        cfg.out_dir,
        resume=cfg.resume,
        overwrite=not cfg.resume if overwrite is None else overwrite,
        label_dir=cfg.label_party_dir,
        extra=[cfg.transcript_dir] if cfg.transcript_dir else [],
    )
    if engine == "ray":
        from tpsl_flwr.engines.flower_run import run_on_ray
        from tpsl_flwr.experiments.experiment import provide_seeded_key

        provide_seeded_key(cfg)  # the label party's file; the seed stays here
        return run_on_ray(cfg.to_run_config(), echo=echo, timeout=timeout)
    with (
        failed_on_error(cfg.out_dir),
        _one_torch_thread(),
        _flower_log_level(None if echo else logging.WARNING),
    ):
        results, _ = run_inprocess_experiment(cfg, timeout=timeout)
    return results


def run_inprocess_experiment(
    cfg: ExperimentConfig,
    client_app: ClientAppCallable | None = None,
    *,
    timeout: float = 3600.0,
    **grid_options: Any,
) -> tuple[dict[str, Any], InProcessGrid]:
    """Run ``cfg`` in this process; return the results JSON and the grid.

    The lower level of :func:`run_experiment`'s ``local`` engine, for tests and
    benches: no thread or logging setting is changed.

    Parameters
    ----------
    cfg
        The experiment.
    client_app
        The nodes' ClientApp (default: the app's,
        :data:`tpsl_flwr.simulations.client_app.app`).
    timeout
        Seconds to wait for each reply of a node.
    **grid_options
        Keyword options of :class:`~tpsl_flwr.engines.inprocess.InProcessGrid`
        (``record_messages``, ``seed``, ``on_message``, ...).

    Returns
    -------
    tuple[dict, InProcessGrid]
        The results JSON (``engine`` ``"local"``) and the grid, whose
        ``sent_messages``/``received_replies`` hold the transcript when
        ``record_messages=True``.
    """
    from tpsl_flwr.engines.inprocess import InProcessGrid
    from tpsl_flwr.experiments.experiment import run_label_party

    if client_app is None:
        from tpsl_flwr.simulations.client_app import app

        client_app = app
    grid = InProcessGrid(
        client_app, cfg.num_parties, run_config=cfg.to_run_config(), **grid_options
    )
    results: dict[str, Any] = grid.run_server(
        lambda g, _ctx: run_label_party(g, cfg, engine="local", timeout=timeout)
    )
    return results, grid


@contextmanager
def _one_torch_thread() -> Iterator[None]:
    """One torch thread while the block runs, unless ``OMP_NUM_THREADS`` is set."""
    import torch

    if "OMP_NUM_THREADS" in os.environ:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def _flower_log_level(level: int | None) -> Iterator[None]:
    """Flower's logger at ``level`` while the block runs (``None``: unchanged)."""
    from flwr.common.logger import FLOWER_LOGGER

    before = FLOWER_LOGGER.level
    if level is not None:
        FLOWER_LOGGER.setLevel(level)
    try:
        yield
    finally:
        FLOWER_LOGGER.setLevel(before)
