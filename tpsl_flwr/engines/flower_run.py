"""Run the TPSL Flower app on Flower's Ray simulation engine, offline, and clean up.

``flwr run <app> local --stream`` starts a detached local SuperLink that keeps
running after the run; this module runs the app through
:func:`~tpsl_flwr.engines.simulation.run_flwr_simulation`, which ends every
process the run started (by PID), echoes the run's log lines while it runs,
and returns the results JSON the ServerApp wrote.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import tpsl_flwr
from tpsl_flwr.engines.flower_env import app_config, read_toml
from tpsl_flwr.engines.processes import FlowerLaunchError
from tpsl_flwr.engines.simulation import run_flwr_simulation
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.experiment import RESULTS_FILE

RUN_LOG = "flwr-run.log"


def source_app_dir() -> Path:
    """The folder of this project's Flower app (the source tree's root).

    Raises
    ------
    ConfigError
        If the package is not installed from its source tree (``pip install -e``).
    """
    root = Path(tpsl_flwr.__file__).resolve().parents[1]
    pyproject = root / "pyproject.toml"
    if not pyproject.exists() or "tool" not in read_toml(pyproject):
        raise ConfigError(
            f"no Flower app found beside the package ({pyproject}); install it "
            "with `pip install -e .` from the source tree, or run `flwr run` there"
        )
    return root


def _follow(path: Path, stop: threading.Event, out: TextIO) -> None:
    """Echo lines appended to ``path`` until ``stop`` is set."""
    position = 0
    while True:
        finished = stop.is_set()
        if path.exists():
            with path.open("r", encoding="utf-8", errors="replace") as handle:
                handle.seek(position)
                chunk = handle.read()
                position = handle.tell()
            if chunk:
                out.write(chunk)
                out.flush()
        if finished:
            return
        time.sleep(0.2)


def run_on_ray(
    run_config: Mapping[str, Any],
    app_dir: Path | None = None,
    timeout: float = 3600.0,
    echo: TextIO | None = sys.stdout,
) -> dict[str, Any]:
    """Run the app in Flower's Ray simulation; return its results JSON.

    Parameters
    ----------
    run_config
        Overrides of the app's ``[tool.flwr.app.config]`` (kebab-case keys).
        ``out-dir`` is made absolute, since the ServerApp and ClientApps run
        in other processes and folders.
    app_dir
        The app folder; this project's source tree by default.
    timeout
        Seconds to wait for the run.
    echo
        Where to copy the run's log lines as they arrive (``None``: quiet).

    Returns
    -------
    dict
        The results JSON, with ``engine`` set to ``"ray"`` and the Flower run's
        wall time as ``flower_wall_seconds``.

    Raises
    ------
    FlowerLaunchError
        If the run did not complete (the message names the log file,
        ``out-dir/flwr-run.log``; the temporary ``FLWR_HOME`` with the
        SuperLink's own log is kept then).
    """
    app = source_app_dir() if app_dir is None else Path(app_dir).resolve()
    config = {**app_config(app), **dict(run_config)}
    out_dir = Path(str(config["out-dir"])).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    overrides = {**dict(run_config), "out-dir": str(out_dir)}
    if config.get("label-dir"):
        overrides["label-dir"] = str(Path(str(config["label-dir"])).resolve())
    results_path = out_dir / RESULTS_FILE
    started = time.time()
    # FLWR_HOME holds installed copies of the app: keep it outside the app
    # folder (and out-dir), or the next `flwr run` would pack them too.
    flwr_home = Path(tempfile.mkdtemp(prefix="tpsl-flwr-home-"))
    stop = threading.Event()
    follower = None
    if echo is not None:
        follower = threading.Thread(
            target=_follow, args=(out_dir / RUN_LOG, stop, echo), daemon=True
        )
        follower.start()
    try:
        run = run_flwr_simulation(
            app,
            int(config["num-parties"]),
            overrides,
            flwr_home=flwr_home,
            timeout=timeout,
            log_dir=out_dir,
            check=True,
        )
        shutil.rmtree(flwr_home, ignore_errors=True)  # kept on failure, for logs
    finally:
        stop.set()
        if follower is not None:
            follower.join(timeout=5)
    if not results_path.exists() or results_path.stat().st_mtime < started:
        raise FlowerLaunchError(
            f"the run completed but wrote no {results_path}; log: {run.log_path}"
        )
    results = json.loads(results_path.read_text())
    results["engine"] = "ray"
    results["flower_wall_seconds"] = run.wall_s
    results_path.write_text(json.dumps(results, indent=2))
    return results
