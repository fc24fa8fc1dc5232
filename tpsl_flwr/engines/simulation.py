"""Ray simulation: ``flwr run <app> <connection> --stream`` on a local SuperLink.

:func:`run_flwr_simulation` runs a Flower app on Flower's simulation engine
(Ray) behind a managed local SuperLink on a free loopback port, reads the run's
status, and ends every process the run started, by PID
(:func:`~tpsl_flwr.engines.processes.terminate_launched`), also on timeout or
error. The SuperLink is the one ``flwr run . local`` would start
(``flower-superlink --simulation``), but started here, behind the peer-uid
guard (:mod:`~tpsl_flwr.engines.superlink_guard`): only this OS user's
processes reach its Control and Runtime APIs. ``flwr run`` gets an explicit
connection to it, never ``local``, so it cannot fall back to starting an
unguarded one.

On a running Ray cluster. Flower's Ray backend calls ``ray.init()`` without
an address, so the run joins the cluster Ray's own resolution names
(``RAY_ADDRESS``, else the latest ``ray start`` on this host); that target is
resolved and checked reachable here before anything starts
(:func:`~tpsl_flwr.engines.ray_cluster.resolve_ray_target`), and the node
actors' resources come from
:func:`~tpsl_flwr.engines.ray_cluster.client_resources` unless the caller
names them. The cluster itself is never stopped: only the run's own processes
are ended.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpsl_flwr._util.private_files import make_private_dir, open_private
from tpsl_flwr.engines.deployment.security import write_connection
from tpsl_flwr.engines.flower_env import (
    check_run_config,
    free_ports,
    kv_option,
    offline_flower_env,
    write_run_config,
)
from tpsl_flwr.engines.flwr_cli import CompletedRun, flwr_run, query_status
from tpsl_flwr.engines.processes import (
    LAUNCH_ID_ENV,
    FlowerLaunchError,
    terminate_launched,
)
from tpsl_flwr.engines.ray_cluster import (
    RayTarget,
    client_resources,
    resolve_ray_target,
)
from tpsl_flwr.engines.superlink_guard import guard_ready, superlink_command
from tpsl_flwr.errors import ConfigError

__all__ = ["CONNECTION", "run_flwr_simulation", "start_simulation_superlink"]

CONNECTION = "tpsl-local"
"""Name of the connection to the run's SuperLink in ``flwr_home/config.toml``."""

SUPERLINK_STARTUP_S = 60.0
"""Seconds the local SuperLink may take to answer."""


def run_flwr_simulation(
    app_dir: Path,
    num_supernodes: int,
    run_config: Mapping[str, Any] | None,
    flwr_home: Path,
    timeout: float = 600.0,
    *,
    federation_config: Mapping[str, object] | None = None,
    log_dir: Path | None = None,
    check: bool = True,
    grace_s: float = 10.0,
    ray_target: RayTarget | None = None,
) -> CompletedRun:
    """Run a Flower app in Ray simulation with ``flwr run <app> <conn> --stream``.

    Processes. A local ``flower-superlink --simulation`` starts here on a free
    loopback port, behind the peer-uid guard (so the run never joins another
    session's SuperLink on the default 39091, and no other OS user reaches
    it), with its log in ``flwr_home/local-superlink/superlink.log``; once the
    guard answers, ``flwr run`` (a child of this process) runs the app on the
    connection :data:`CONNECTION` written to ``flwr_home/config.toml``. The
    SuperLink starts ``flower-superexec``, which starts ``flwr-simulation``
    for the run, which starts Ray (GCS, raylet, workers) and stops it when the
    run ends. ``flwr run --stream`` returns when the run's logs end. The run's
    status is then read with ``flwr ls``, and the SuperLink and everything
    carrying this launch's marker is ended by PID (see
    :func:`~tpsl_flwr.engines.processes.terminate_launched`), also on timeout
    or error.

    Parameters
    ----------
    app_dir : Path
        Folder holding the app's ``pyproject.toml`` (``[tool.flwr.app]``).
    num_supernodes : int
        Number of simulated SuperNodes (``--federation-config num-supernodes``).
    run_config : Mapping[str, Any] | None
        Overrides of ``[tool.flwr.app.config]``; every key must exist there
        (checked here). Passed as a TOML file, so strings may hold spaces and
        quotes.
    flwr_home : Path
        ``FLWR_HOME`` for this run (created if missing); holds the local
        SuperLink's log (``local-superlink/superlink.log``) and state.
    timeout : float
        Seconds to wait for ``flwr run`` to return.
    federation_config : Mapping[str, object] | None
        Further ``--federation-config`` options (Flower's ``SimulationConfig``
        fields in kebab case): ``client-resources-num-cpus`` (int),
        ``client-resources-num-gpus`` (float), ``backend``, ``verbose``,
        ``init-args-num-cpus``, ``init-args-num-gpus``,
        ``init-args-logging-level``, ``init-args-log-to-driver``. Client
        resources not given here come from
        :func:`~tpsl_flwr.engines.ray_cluster.client_resources` (the caller's
        Flower config, else 1 CPU per actor on a running cluster, else
        Flower's default).
    log_dir : Path | None
        Where ``flwr-run.log`` and ``run-config.toml`` go; ``flwr_home`` if
        ``None``.
    check : bool
        Raise :class:`~tpsl_flwr.engines.processes.FlowerLaunchError` unless
        the run completed.
    grace_s : float
        Seconds between SIGTERM and SIGKILL during cleanup.
    ray_target : RayTarget | None
        Where the node actors run, as resolved by the caller; resolved here
        from this process's environment if ``None``.

    Returns
    -------
    CompletedRun
        Status, output and timing of the run.

    Raises
    ------
    FlowerLaunchError
        On timeout, if the guarded SuperLink does not start (or a server
        without the guard answers on its port), or if ``check`` and the run
        did not complete.
    ConfigError
        If a ``run_config`` key is not in the app's config; if the Ray
        cluster named by ``RAY_ADDRESS`` (or the latest ``ray start``) does
        not answer; or if ``init-args-num-cpus``/``-num-gpus`` are given for
        a run that joins a cluster (its raylets' resources are fixed).
    ValueError
        If ``num_supernodes < 1``.
    """
    if num_supernodes < 1:
        raise ValueError(f"num_supernodes must be >= 1, got {num_supernodes}")
    app_dir = Path(app_dir).resolve()
    check_run_config(app_dir, run_config or {})
    flwr_home = Path(flwr_home).resolve()
    log_dir = flwr_home if log_dir is None else Path(log_dir).resolve()
    flwr_home.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    launch_id = uuid.uuid4().hex
    env = offline_flower_env(flwr_home)
    env[LAUNCH_ID_ENV] = launch_id
    target = resolve_ray_target(env) if ray_target is None else ray_target
    # Pin what was checked: a record written after the check must not redirect
    # the run's ray.init() (``local``: a new instance, never a recorded one).
    env["RAY_ADDRESS"] = target.address or "local"
    fed = {
        "num-supernodes": num_supernodes,
        **client_resources(target),
        **dict(federation_config or {}),
    }
    fixed = sorted({"init-args-num-cpus", "init-args-num-gpus"} & set(fed))
    if target.joins_cluster and fixed:
        raise ConfigError(
            f"federation options {fixed} cannot apply when joining the Ray "
            f"cluster at {target.address}: its raylets' resources are fixed by "
            "`ray start`; drop them"
        )
    args = ["--federation-config", kv_option(fed)]
    args += write_run_config(run_config or {}, log_dir / "run-config.toml")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        address = start_simulation_superlink(flwr_home, env, procs)
        write_connection(flwr_home, CONNECTION, address, None)
        run_id, returncode, output, wall_s = flwr_run(
            app_dir,
            CONNECTION,
            args,
            env,
            log_dir / "flwr-run.log",
            timeout,
        )
        status, details = "unknown", "run was not created"
        if run_id is not None:
            status, details = query_status(env, CONNECTION, run_id)
    finally:
        terminate_launched(launch_id, procs, grace_s=grace_s)
    result = CompletedRun(
        run_id=run_id,
        status=status,
        status_details=details,
        returncode=returncode,
        output=output,
        wall_s=wall_s,
        log_path=log_dir / "flwr-run.log",
        launch_id=launch_id,
    )
    return result.check() if check else result


def start_simulation_superlink(
    flwr_home: Path, env: dict[str, str], procs: list[subprocess.Popen[bytes]]
) -> str:
    """Start a guarded ``flower-superlink --simulation``; return its address.

    Parameters
    ----------
    flwr_home : Path
        ``FLWR_HOME``; its ``local-superlink`` folder (0700) gets the log
        (``superlink.log``), the console output and the database.
    env : dict[str, str]
        Environment (with the launch marker: the caller ends it by PID).
    procs : list[subprocess.Popen[bytes]]
        The started process is appended here, also when it fails to start.

    Returns
    -------
    str
        ``127.0.0.1:PORT``, once the peer-uid guard answers there.

    Raises
    ------
    FlowerLaunchError
        If it exits or does not answer within :data:`SUPERLINK_STARTUP_S`,
        or if a server without the guard answers on its port.

    Notes
    -----
    The arguments are those of Flower's own local SuperLink
    (``flwr/cli/local_superlink.py``), on a free port.
    """
    folder = flwr_home / "local-superlink"
    make_private_dir(folder, check=False)
    (port,) = free_ports(1)
    args = ["--insecure", "--simulation", "--isolation", "subprocess"]
    args += ["--host", "127.0.0.1", "--port", str(port)]
    args += ["--log-file", str(folder / "superlink.log")]
    args += ["--database", str(folder / "state.db")]
    console = open_private(folder / "console.log")
    with open(console, "wb") as out:
        procs.append(
            subprocess.Popen(
                superlink_command(args),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        )
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + SUPERLINK_STARTUP_S
    while not guard_ready(address):
        if procs[0].poll() is not None or time.monotonic() > deadline:
            raise FlowerLaunchError(
                f"the local SuperLink did not start on {address} (exit code "
                f"{procs[0].poll()}); see {folder / 'console.log'}"
            )
        time.sleep(0.2)
    return address
