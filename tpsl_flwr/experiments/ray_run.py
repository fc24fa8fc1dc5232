"""Run the TPSL Flower app on Flower's Ray simulation engine, offline, and clean up.

``flwr run <app> local --stream`` starts a detached local SuperLink that keeps
running after the run; this module runs the app through
:func:`~tpsl_flwr.engines.simulation.run_flwr_simulation`, which ends every
process the run started (by PID), echoes this run's progress lines while it
runs (never the last run's: its log is removed first), and returns the results
JSON the ServerApp wrote. A failed run ends in one line naming the cause; the
tracebacks stay in ``out-dir/flwr-run.log``.

The run joins a running Ray cluster when ``RAY_ADDRESS`` names one (or a
``ray start`` cluster is recorded on this host): see
:mod:`~tpsl_flwr.engines.ray_cluster` and ``docs/ray-cluster.md``. Every path
in the run config is made absolute here, against the caller's working folder,
since the label party and the node actors run in other processes, folders
and possibly hosts.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from tpsl_flwr._util.private_files import open_private
from tpsl_flwr.engines.flower_env import app_config, read_toml
from tpsl_flwr.engines.flwr_cli import CompletedRun
from tpsl_flwr.engines.processes import FlowerLaunchError
from tpsl_flwr.engines.ray_cluster import resolve_ray_target
from tpsl_flwr.engines.simulation import run_flwr_simulation
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.audience import (
    CONFIG_PATH_KEYS,
    PUBLIC_SUMMARY,
    write_public,
)
from tpsl_flwr.experiments.experiment import RESULTS_FILE
from tpsl_flwr.experiments.run_folder import (
    FAILED_FILE,
    failed_on_error,
    one_line_error,
    read_failure,
    write_atomic,
)

RUN_LOG = "flwr-run.log"


def absolute_paths(
    config: Mapping[str, Any], overrides: Mapping[str, Any]
) -> dict[str, Any]:
    """``overrides`` with every path of ``config`` made absolute.

    A relative path means the caller's working folder, where the command
    line checked it; the ServerApp and the node actors of ``flwr run`` run
    in other processes (and on a Ray cluster, other hosts), so each set path
    entry of the merged ``config``
    (:data:`~tpsl_flwr.experiments.audience.CONFIG_PATH_KEYS`) is passed on
    resolved (``~`` expanded). Empty values stay unset.

    Examples
    --------
    >>> import os
    >>> out = absolute_paths({"out-dir": "runs/a", "data-path": ""}, {"epochs": 1})
    >>> out["out-dir"] == os.path.join(os.getcwd(), "runs", "a"), "data-path" in out
    (True, False)
    """
    resolved = dict(overrides)
    for key in CONFIG_PATH_KEYS:
        if config.get(key):
            resolved[key] = str(Path(str(config[key])).expanduser().resolve())
    return resolved


def source_app_dir() -> Path:
    """The folder of this project's Flower app (the source tree's root).

    Raises
    ------
    ConfigError
        If the package is not installed from its source tree (``pip install -e``).
    """
    root = Path(__file__).resolve().parents[2]  # tpsl_flwr/experiments/..
    pyproject = root / "pyproject.toml"
    if not pyproject.exists() or "tool" not in read_toml(pyproject):
        raise ConfigError(
            f"no Flower app found beside the package ({pyproject}); install it "
            "with `pip install -e .` from the source tree, or run `flwr run` there"
        )
    return root


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LEVEL = re.compile(r"^(INFO|WARNING)\s*:\s?")
_FLOWER_CHATTER = (
    "Starting logstream",
    "To change federation size",
    "flwr federation simulation-config",
    "default simulated SuperNodes changed",
)
"""Flower's own INFO/WARNING lines that say nothing about this run."""


def progress_line(line: str) -> bool:
    r"""Whether a line of ``flwr-run.log`` is progress the user should see.

    The ServerApp's INFO and WARNING lines are; errors, tracebacks, the
    ClientApp actors' lines (``(ClientAppActor pid=...)``), Flower's CLI chatter
    and blank log lines are not: they stay in the log file, and a failed run
    ends with one summary line instead.

    Examples
    --------
    >>> progress_line("\x1b[92mINFO \x1b[0m:      epoch 1/2  2443 samples/s")
    True
    >>> progress_line("\x1b[91mERROR \x1b[0m:     Traceback (most recent call last):")
    False
    >>> progress_line("(ClientAppActor pid=13415) WARNING :   Manually terminating")
    False
    """
    match = _LEVEL.match(_ANSI.sub("", line))
    if match is None:
        return False
    text = _ANSI.sub("", line)[match.end() :].strip()
    return bool(text) and not any(noise in text for noise in _FLOWER_CHATTER)


def _follow(
    path: Path,
    stop: threading.Event,
    out: TextIO,
    keep: Callable[[str], bool] = progress_line,
) -> None:
    """Echo the lines ``keep`` accepts as they are appended to ``path``.

    Only a file created after the follower starts is read: the caller removes
    the previous run's log first, and a file replaced under the same name
    (another inode) is read from its start. Stops once ``stop`` is set and the
    file is read to its end.
    """
    handle: TextIO | None = None
    inode = None
    pending = ""
    try:
        while True:
            finished = stop.is_set()
            try:
                current = path.stat().st_ino
            except OSError:
                current = None
            if current is not None and current != inode:
                if handle is not None:
                    handle.close()
                handle = path.open("r", encoding="utf-8", errors="replace")
                inode, pending = current, ""
            if handle is not None:
                pending += handle.read()
                *lines, pending = pending.split("\n")
                if finished and pending:
                    lines, pending = [*lines, pending], ""
                shown = [line for line in lines if keep(line)]
                if shown:
                    out.write("".join(line + "\n" for line in shown))
                    out.flush()
            if finished:
                return
            time.sleep(0.2)
    finally:
        if handle is not None:
            handle.close()


def run_on_ray(
    run_config: Mapping[str, Any],
    app_dir: Path | None = None,
    timeout: float = 3600.0,
    echo: TextIO | None = sys.stdout,
) -> dict[str, Any]:
    """Run the app in Flower's Ray simulation; return its results JSON.

    The caller prepares ``out-dir`` (see
    :func:`~tpsl_flwr.experiments.run_folder.prepare_run_folder`); this run's
    log replaces the last one's before anything is echoed.

    Parameters
    ----------
    run_config
        Overrides of the app's ``[tool.flwr.app.config]`` (kebab-case keys).
        Paths (:data:`~tpsl_flwr.experiments.audience.CONFIG_PATH_KEYS`) are
        made absolute against this process's working folder
        (:func:`absolute_paths`), since the ServerApp and ClientApps run in
        other processes, folders and possibly hosts: on a Ray cluster
        ``data-path`` must exist at that absolute path on every host with a
        raylet.
    app_dir
        The app folder; this project's source tree by default.
    timeout
        Seconds to wait for the run.
    echo
        Where to copy the run's progress lines as they arrive
        (:func:`progress_line`; ``None``: quiet), after one line naming the
        Ray cluster joined, if any. Everything else, tracebacks included,
        stays in ``out-dir/flwr-run.log``.

    Returns
    -------
    dict
        The results JSON (``engine`` ``"ray"``), with the Flower run's wall
        time, Ray's start-up included, as ``flower_wall_seconds``, and the
        Ray cluster joined as ``ray_address`` (``None``: a new local
        instance).

    Raises
    ------
    FlowerLaunchError
        If the run did not complete: one line naming the cause (the node and
        partition for a node's error) and the log file,
        ``out-dir/flwr-run.log``. ``out-dir/FAILED`` holds the same cause, and
        the SuperLink's own log is kept as ``out-dir/superlink.log``.
    ConfigError
        If ``RAY_ADDRESS`` (or the latest ``ray start`` on this host) names
        a cluster that does not answer, before anything starts
        (:func:`~tpsl_flwr.engines.ray_cluster.resolve_ray_target`).
    """
    app = source_app_dir() if app_dir is None else Path(app_dir).resolve()
    config = {**app_config(app), **dict(run_config)}
    overrides = absolute_paths(config, run_config)
    out_dir = Path(overrides["out-dir"])
    target = resolve_ray_target()
    out_dir.mkdir(parents=True, exist_ok=True)
    results_path = out_dir / RESULTS_FILE
    log_path = out_dir / RUN_LOG
    log_path.unlink(missing_ok=True)  # progress shown is always this run's
    (out_dir / FAILED_FILE).unlink(missing_ok=True)
    started = time.time()
    # FLWR_HOME holds installed copies of the app: keep it outside the app
    # folder (and out-dir), or the next `flwr run` would pack them too.
    flwr_home = Path(tempfile.mkdtemp(prefix="tpsl-flwr-home-"))
    if echo is not None and target.joins_cluster:
        echo.write(target.describe() + "\n")
        echo.flush()
    stop = threading.Event()
    follower = None
    if echo is not None:
        follower = threading.Thread(
            target=_follow, args=(log_path, stop, echo), daemon=True
        )
        follower.start()
    ok = False
    try:
        with failed_on_error(out_dir):
            run = run_flwr_simulation(
                app,
                int(config["num-parties"]),
                overrides,
                flwr_home=flwr_home,
                timeout=timeout,
                log_dir=out_dir,
                check=False,
                ray_target=target,
            )
            if not run.ok:
                raise FlowerLaunchError(_failure(run, out_dir))
            if not results_path.exists() or results_path.stat().st_mtime < started:
                raise FlowerLaunchError(
                    f"the run completed but wrote no {results_path} "
                    f"(details: {run.log_path})"
                )
        ok = True
    finally:
        stop.set()
        if follower is not None:
            follower.join(timeout=5)
        superlink_log = flwr_home / "local-superlink" / "superlink.log"
        if not ok and superlink_log.exists():
            # 0600 from its creation: the label party's alone
            kept = open_private(out_dir / "superlink.log")
            with open(kept, "wb") as dst, superlink_log.open("rb") as src:
                shutil.copyfileobj(src, dst)
        shutil.rmtree(flwr_home, ignore_errors=True)
    results = json.loads(results_path.read_text())
    results["flower_wall_seconds"] = run.wall_s
    results["ray_address"] = target.address
    write_atomic(results_path, json.dumps(results, indent=2))
    # The shareable summary gains the Flower timings too (allow-listed fields).
    write_public(results_path.parent / PUBLIC_SUMMARY, results)
    return results


def _failure(run: CompletedRun, out_dir: Path) -> str:
    """One line: why ``run`` failed (the ServerApp's ``FAILED``), and the log."""
    cause = read_failure(out_dir)
    if cause is None and run.status_details:
        details = run.status_details.removeprefix("Simulation failed with exception:")
        cause = one_line_error(details.strip())
    if cause is None:
        cause = f"Flower run {run.run_id} ended with status {run.status!r}"
    return f"{cause} (details: {run.log_path})"
