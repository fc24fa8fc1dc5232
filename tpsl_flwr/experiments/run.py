"""Run one experiment: in-process, on Flower's Ray simulation or on a local deployment.

The one recipe behind ``tpsl-flwr simulate``, ``tpsl-flwr sweep``, the benches
and the end-to-end tests:

* ``local``: an :class:`~tpsl_flwr.engines.inprocess.InProcessGrid` of
  ``num-parties`` virtual nodes running the app's ClientApp, and the label
  party (:func:`~tpsl_flwr.experiments.experiment.run_label_party`) on it, in
  this process;
* ``ray``: ``flwr run`` of the app on Flower's Ray simulation
  (:func:`~tpsl_flwr.experiments.ray_run.run_on_ray`), after the label party's
  seeded key, if any, is put in its private folder: ``noise-seed`` never enters
  the run config the nodes receive;
* ``deployment``: ``flwr run`` of the app on a local deployment
  (:class:`~tpsl_flwr.engines.deployment.runtime.DeploymentRuntime`: a SuperLink and
  ``num-parties`` SuperNodes on loopback, over TLS with authenticated
  SuperNodes when ``secure``), the seeded key provided the same way; every
  process it started is ended by PID afterwards.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run_folder import (
    FAILED_FILE,
    failed_on_error,
    one_line_error,
    prepare_run_folder,
    read_failure,
    write_atomic,
)
from tpsl_flwr.experiments.training_settings import resolve_training
from tpsl_flwr.release.store import LabelStore

if TYPE_CHECKING:
    from tpsl_flwr.engines.inprocess import InProcessGrid
    from tpsl_flwr.engines.virtual_nodes import ClientAppCallable

__all__ = [
    "DEPLOYMENT_LOGS",
    "ENGINES",
    "check_engine",
    "round_trip_seconds",
    "run_experiment",
    "run_inprocess_experiment",
]

ENGINES: tuple[str, ...] = ("local", "ray", "deployment")
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
    >>> try:
    ...     check_engine("gpu")
    ... except ConfigError as err:
    ...     print(err)  # doctest: +NORMALIZE_WHITESPACE
    unknown engine 'gpu'; valid engines:
    local, ray, deployment
    """
    if engine not in ENGINES:
        raise ConfigError(
            f"unknown engine {engine!r}; valid engines: {', '.join(ENGINES)}"
        )
    return engine


DEPLOYMENT_LOGS = "deployment-logs"
"""The folder under ``out-dir`` of the deployment's process logs."""


def run_experiment(
    cfg: ExperimentConfig,
    engine: str = "local",
    *,
    echo: TextIO | None = None,
    timeout: float = 3600.0,
    overwrite: bool | None = None,
    secure: bool = False,
    executor: bool = True,
) -> dict[str, Any]:
    """Run the experiment ``cfg`` on ``engine``; return its results JSON.

    Every engine writes ``results.json`` and ``report.md`` to ``cfg.out_dir``
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
        ``"deployment"``: a SuperLink and ``cfg.num_parties`` SuperNodes on
        loopback (:class:`~tpsl_flwr.engines.deployment.runtime.DeploymentRuntime`,
        logs in ``out-dir/deployment-logs``), ``flwr run`` of the app there,
        every process ended by PID afterwards.
    echo
        ``ray``: where to copy the run's log lines as they arrive;
        ``deployment``: where to copy its progress lines once the run ends.
        ``None`` (default) is quiet: no log copy on ``ray`` or
        ``deployment``, only Flower's warnings and errors on ``local``.
    timeout
        Seconds to wait: for each reply of a node (``local``), for the whole
        run (``ray``, ``deployment``).
    overwrite
        ``True``: replace an earlier run in ``cfg.out_dir``; ``False``: refuse
        a folder holding one (``tpsl-flwr simulate`` without ``--overwrite``).
        ``None`` (default, for callers that own their folder, like a sweep's
        ``runs/<name>/``): replace it unless ``cfg.resume`` continues it.
    secure
        ``deployment`` only: TLS and authenticated SuperNodes (local
        certificates, loopback); ignored by the other engines.
    executor
        ``deployment`` only: each SuperNode runs with ``--isolation process``
        and a warm executor beside it (:mod:`~tpsl_flwr.engines.executor.warm`),
        which keeps the ClientApp and the party loaded (default); ``False``:
        Flower's process per message, each ``flwr-clientapp`` running the
        ClientApp with the node's state carried in its context
        (:mod:`~tpsl_flwr.wire.state_codec`).

    Returns
    -------
    dict
        The results JSON (one schema for every engine; ``engine`` names it).
        ``deployment`` adds ``flower_wall_seconds`` (the ``flwr run``) and
        ``round_trip_seconds`` (:func:`round_trip_seconds`).

    Raises
    ------
    ConfigError
        If ``engine`` is unknown, a setting is refused by the label party, or
        ``cfg.out_dir`` holds an earlier run and ``overwrite`` is ``False``.
    RuntimeError
        ``ray``, ``deployment``: if the Flower run did not complete
        (``FlowerLaunchError``).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as out:
    ...     cfg = ExperimentConfig(
    ...         dataset="breast-cancer", epochs=3, noise_seed=0, out_dir=out
    ...     )
    ...     results = run_experiment(cfg)
    >>> results["engine"], results["epsilon_spent"], results["test_auc"] > 0.9
    ('local', 1.0, True)
    """
    check_engine(engine)
    if engine == "ray" and cfg.pipeline_depth > 0:
        from tpsl_flwr.strategies.pipeline import NOT_ON_RAY

        raise ConfigError(NOT_ON_RAY.format(depth=cfg.pipeline_depth))
    if cfg.party_actors and engine != "ray":
        raise ConfigError(
            "party-actors = true keeps each node's party in a Ray actor: it is for "
            f"the ray engine, got engine {engine!r}"
        )
    from tpsl_flwr.experiments.experiment import preflight_release

    preflight_release(cfg)  # a refused release leaves the folder untouched
    prepare_run_folder(
        cfg.out_dir,
        resume=cfg.resume,
        overwrite=not cfg.resume if overwrite is None else overwrite,
        label_dir=cfg.label_party_dir,
        extra=[cfg.transcript_dir] if cfg.transcript_dir else [],
    )
    if engine == "ray":
        from tpsl_flwr.experiments.experiment import provide_seeded_key
        from tpsl_flwr.experiments.ray_run import run_on_ray

        provide_seeded_key(cfg)  # the label party's file; the seed stays here
        return run_on_ray(cfg.to_run_config(), echo=echo, timeout=timeout)
    if engine == "deployment":
        from tpsl_flwr.experiments.experiment import provide_seeded_key

        provide_seeded_key(cfg)  # the label party's file; the seed stays here
        return _run_on_deployment(
            cfg,
            secure=secure,
            echo=echo,
            timeout=timeout,
            executor=executor,
        )
    from tpsl_flwr._util.allocator import tune_allocator

    tune_allocator()  # TPSL_FLWR_MALLOC=lean: freed blocks go back (opt-in)
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
        The nodes' ClientApp (default: the app's own,
        :func:`~tpsl_flwr.experiments.node_party.make_node_app`, as
        :data:`tpsl_flwr.simulations.client_app.app` runs it in a node).
    timeout
        Seconds to wait for each reply of a node.
    **grid_options
        Keyword options of :class:`~tpsl_flwr.engines.inprocess.InProcessGrid`
        (``record_messages``, ``seed``, ``concurrent_nodes``, ...);
        ``app_keeps_state`` is True unless given: the nodes keep their parties
        in the ClientApp object instead of encoding them into ``context.state``
        every step.

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
        from tpsl_flwr.experiments.node_party import make_node_app

        client_app = make_node_app()
    grid_options.setdefault("app_keeps_state", True)  # one object, one process
    grid = InProcessGrid(
        client_app, cfg.num_parties, run_config=cfg.to_run_config(), **grid_options
    )
    results: dict[str, Any] = grid.run_server(
        lambda g, _ctx: run_label_party(g, cfg, engine="local", timeout=timeout)
    )
    return results, grid


def round_trip_seconds(results: dict[str, Any]) -> float:
    """Seconds of one label-party round trip (all nodes at once) of a results JSON.

    The strategy does not time its round trips one by one: an epoch's
    training seconds (``samples / samples_per_second``: the transcript audit,
    if on, excluded) over that epoch's round trips (``ceil(batches /
    steps-per-message)`` train messages, plus ``min(pipeline-depth, train
    messages - 1)`` gradient-only messages, plus one test query), i.e. the MEAN
    per round trip of each epoch; the median of those means over the epochs.

    Examples
    --------
    >>> round(round_trip_seconds({
    ...     "train_rows": 455,
    ...     "config": {"batch-size": 64, "steps-per-message": 1},
    ...     "history": [{"samples": 455, "samples_per_second": 5.0}],
    ... }), 3)  # 91 s over 8 train round trips + 1 test query
    10.111
    """
    config = results["config"]
    rows = int(results["train_rows"])
    # batch-size 0 (auto) resolves from the training rows alone, as in the run.
    batch = resolve_training(
        train_rows=rows, epochs=1, batch_size=int(config["batch-size"])
    ).batch_size
    batches = math.ceil(rows / batch)
    train = math.ceil(batches / int(config["steps-per-message"]))
    depth = int(config.get("pipeline-depth", 0))
    messages = train + min(depth, train - 1) + 1
    means = [
        float(entry["samples"]) / float(entry["samples_per_second"]) / messages
        for entry in results["history"]
        if entry.get("samples_per_second")
    ]
    return statistics.median(means) if means else float("nan")


def _absolute_paths(run_config: dict[str, Any]) -> dict[str, Any]:
    """``run_config`` with every set path made absolute, ``~`` expanded.

    The ServerApp and the ClientApps run in other processes and folders; the
    same rule as ``tpsl-flwr flower-run``
    (:func:`~tpsl_flwr.experiments.ray_run.absolute_paths`).
    """
    from tpsl_flwr.experiments.ray_run import absolute_paths

    return {**run_config, **absolute_paths(run_config, {})}


def _run_on_deployment(
    cfg: ExperimentConfig,
    *,
    secure: bool,
    echo: TextIO | None,
    timeout: float,
    executor: bool = True,
) -> dict[str, Any]:
    """``flwr run`` of the app on a fresh local deployment; its results JSON."""
    from tpsl_flwr.engines.deployment.runtime import DeploymentRuntime
    from tpsl_flwr.engines.processes import FlowerLaunchError
    from tpsl_flwr.experiments.audience import PUBLIC_SUMMARY, write_public
    from tpsl_flwr.experiments.experiment import RESULTS_FILE
    from tpsl_flwr.experiments.ray_run import progress_line, source_app_dir

    app = source_app_dir()
    run_config = _absolute_paths(cfg.to_run_config())
    out_dir = Path(run_config["out-dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    results_path = out_dir / RESULTS_FILE
    (out_dir / FAILED_FILE).unlink(missing_ok=True)
    store = LabelStore(Path(cfg.label_party_dir).resolve())
    with failed_on_error(out_dir), _removing(store.clear_rehearsal_mark):
        with DeploymentRuntime(
            cfg.num_parties,
            out_dir / DEPLOYMENT_LOGS,
            secure=secure,
            executor=executor,
        ) as runtime:
            # Every node of this deployment was started here, by the label
            # party: a rehearsal, for the ServerApp of this launch alone.
            store.mark_rehearsal(runtime.launch_id)
            run = runtime.run(app, run_config, timeout=timeout, check=False)
        if echo is not None:
            shown = [line for line in run.output.splitlines() if progress_line(line)]
            echo.write("".join(line + "\n" for line in shown))
            echo.flush()
        if not run.ok:
            cause = read_failure(out_dir)
            if cause is None and run.status_details:
                cause = one_line_error(run.status_details.strip())
            if cause is None:
                cause = f"Flower run {run.run_id} ended with status {run.status!r}"
            raise FlowerLaunchError(f"{cause} (details: {run.log_path})")
        if not results_path.exists():
            raise FlowerLaunchError(
                f"the run completed but wrote no {results_path} "
                f"(details: {run.log_path})"
            )
    results: dict[str, Any] = json.loads(results_path.read_text())
    results["engine"] = "deployment"
    results["executor"] = executor
    results["flower_wall_seconds"] = run.wall_s
    results["round_trip_seconds"] = round_trip_seconds(results)
    write_atomic(results_path, json.dumps(results, indent=2))
    # The shareable summary gains the Flower timings too (allow-listed fields).
    write_public(results_path.parent / PUBLIC_SUMMARY, results)
    return results


@contextmanager
def _removing(remove: Callable[[], None]) -> Iterator[None]:
    """Call ``remove`` when the block ends, however it ends."""
    try:
        yield
    finally:
        remove()


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
