"""Launch Flower runs as subprocesses and end every process they start.

Two engines, both driven through the ``flwr`` CLI of Flower 1.42:

- :func:`run_flwr_simulation`: ``flwr run <app> local --stream`` (Ray
  simulation behind a managed local SuperLink);
- :class:`DeploymentRuntime`: a ``flower-superlink`` plus one
  ``flower-supernode`` per party on loopback, then ``flwr run <app> <connection>``.

Process hygiene. Flower starts processes that outlive the command that started
them: ``flwr run ... local`` spawns a *detached* ``flower-superlink`` (own
session, no CLI to stop it) that in turn spawns ``flower-superexec`` and, per
run, ``flwr-simulation`` with its Ray processes; a SuperNode spawns its own
``flower-superexec`` and one ``flwr-clientapp`` per message, and those survive
a SIGTERM of the SuperNode for a few seconds. Every process launched here
therefore gets a unique marker in its environment (``TPSL_FLWR_LAUNCH_ID``),
which all descendants inherit, detached or not; cleanup finds them by that
marker (plus by parentage) in ``/proc`` and ends them by PID: SIGTERM, a grace
period, then SIGKILL. :func:`find_launched_processes` lets tests assert that
nothing is left. Finding detached processes needs Linux ``/proc``; elsewhere
only the processes started directly are ended.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import tomli
import tomli_w
from flwr.common.config import flatten_dict

from tpsl_flwr.errors import ConfigError

__all__ = [
    "LAUNCH_ID_ENV",
    "CompletedRun",
    "DeploymentRuntime",
    "FlowerLaunchError",
    "find_launched_processes",
    "offline_flower_env",
    "run_flwr_simulation",
    "terminate_launched",
]

LAUNCH_ID_ENV = "TPSL_FLWR_LAUNCH_ID"
"""Environment variable that marks every process of one launch."""

_COMPLETED = "finished:completed"
_RUN_ID_RE = re.compile(r"Successfully started run (\d+)")
_SUPERNODE_READY_RE = re.compile(r"SuperNode ID: (\d+)")
_PROC = Path("/proc")


class FlowerLaunchError(RuntimeError):
    """A Flower process could not start, a run timed out or did not complete."""


@dataclass(frozen=True)
class CompletedRun:
    """Outcome of one ``flwr run``.

    Parameters
    ----------
    run_id : int | None
        Flower run id (``None`` if the run was never created).
    status : str
        Run status from ``flwr ls``, e.g. ``"finished:completed"`` or
        ``"finished:failed"``; ``"unknown"`` if it could not be read.
    status_details : str
        Flower's details for the status (the exception message on failure).
    returncode : int
        Exit code of the ``flwr run`` CLI. It is 0 even when the ServerApp
        fails, so look at :attr:`status`.
    output : str
        Everything ``flwr run --stream`` printed: the run's logs as the
        SuperLink streams them (the ServerApp's; in simulation, ClientApp
        logs only with ``init-args-log-to-driver``).
    wall_s : float
        Wall-clock seconds from launching the CLI to the end of the run.
    log_path : Path
        File holding :attr:`output`.
    launch_id : str
        Marker of the processes this launch started.
    """

    run_id: int | None
    status: str
    status_details: str
    returncode: int
    output: str
    wall_s: float
    log_path: Path
    launch_id: str

    @property
    def ok(self) -> bool:
        """Whether the run finished and completed."""
        return self.status == _COMPLETED

    def check(self) -> CompletedRun:
        """Return ``self`` if :attr:`ok`, else raise :class:`FlowerLaunchError`.

        Returns
        -------
        CompletedRun
            This object.

        Raises
        ------
        FlowerLaunchError
            If the run did not complete; the message holds the output's tail.
        """
        if not self.ok:
            raise FlowerLaunchError(
                f"Flower run {self.run_id} ended with status {self.status!r} "
                f"({self.status_details}); log: {self.log_path}\n" + self.output[-4000:]
            )
        return self


# --------------------------------------------------------------- environment
def offline_flower_env(
    flwr_home: Path, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Return an environment for running Flower offline and quietly.

    Parameters
    ----------
    flwr_home : Path
        Flower's config folder (``FLWR_HOME``): ``config.toml``, installed
        apps, the local SuperLink's database and log.
    base : Mapping[str, str] | None
        Environment to extend; ``os.environ`` when ``None``.

    Returns
    -------
    dict[str, str]
        ``base`` plus: ``FLWR_HOME``; no runtime ``uv sync`` of app
        dependencies (``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1``); no
        telemetry, update check or Ray usage stats; Ray's
        ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0``; unbuffered Python output; and
        this interpreter's ``bin`` folder first on ``PATH`` so that ``flwr`` and
        ``flower-*`` resolve to the installation running this code.
    """
    env = dict(os.environ if base is None else base)
    bin_dir = str(Path(sys.executable).parent)
    path = env.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        env["PATH"] = os.pathsep.join([bin_dir, path]) if path else bin_dir
    env.update(
        {
            "FLWR_HOME": str(flwr_home),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _flwr_executable() -> str:
    candidate = Path(sys.executable).parent / "flwr"
    return str(candidate) if candidate.exists() else "flwr"


def _free_ports(count: int) -> list[int]:
    """Return ``count`` distinct free TCP ports on 127.0.0.1."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _toml_scalar(value: object) -> str:
    """Format a scalar as a TOML value for ``key=value`` CLI options."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str) and '"' not in value and "\n" not in value:
        return f'"{value}"'
    raise ValueError(f"cannot pass {value!r} as a Flower key=value option")


def _kv_option(options: Mapping[str, object]) -> str:
    return " ".join(f"{key}={_toml_scalar(value)}" for key, value in options.items())


def _check_run_config(app_dir: Path, run_config: Mapping[str, Any]) -> None:
    """Raise ``ConfigError`` for keys missing from ``[tool.flwr.app.config]``.

    Flower would otherwise accept the run and fail it on the SuperLink.
    """
    if not run_config:
        return
    pyproject = tomli.loads((app_dir / "pyproject.toml").read_text(encoding="utf-8"))
    app_config = pyproject.get("tool", {}).get("flwr", {}).get("app", {})
    known = set(flatten_dict(app_config.get("config", {})))
    unknown = sorted(set(flatten_dict(dict(run_config))) - known)
    if unknown:
        raise ConfigError(
            f"run_config keys {unknown} are not in [tool.flwr.app.config] of "
            f"{app_dir / 'pyproject.toml'} (known: {sorted(known)})"
        )


def _write_run_config(run_config: Mapping[str, Any], path: Path) -> list[str]:
    """Write ``run_config`` to ``path`` (TOML) and return the CLI arguments."""
    if not run_config:
        return []
    path.write_text(tomli_w.dumps(dict(run_config)), encoding="utf-8")
    return ["--run-config", str(path)]


# ----------------------------------------------------------------- processes
def _ppid_map() -> dict[int, int]:
    table: dict[int, int] = {}
    for entry in _PROC.iterdir() if _PROC.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields and fields[0] != "Z":
            table[int(entry.name)] = int(fields[1])
    return table


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (zombies count as ended)."""
    if _PROC.is_dir():
        try:
            stat = (_PROC / str(pid) / "stat").read_text()
        except OSError:
            return False
        return stat[stat.rfind(")") + 2 :].split()[0] != "Z"
    try:  # no /proc: a zombie counts as alive until its parent reaps it
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def find_launched_processes(launch_id: str, roots: Iterable[int] = ()) -> list[int]:
    """Return the live PIDs marked with ``launch_id`` or descending from ``roots``.

    Parameters
    ----------
    launch_id : str
        The marker (``CompletedRun.launch_id``, ``DeploymentRuntime.launch_id``).
    roots : Iterable[int]
        PIDs whose descendants (and themselves) are included too. Pass only
        processes known to be running (e.g. a ``Popen`` not yet reaped): the
        PID of a process that has ended may belong to another process by now.

    Returns
    -------
    list[int]
        Sorted PIDs; empty when everything has ended.
    """
    needle = f"{LAUNCH_ID_ENV}={launch_id}".encode()
    ppids = _ppid_map()
    found: set[int] = set()
    for pid in ppids:
        try:
            environ = (_PROC / str(pid) / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.add(pid)
    children: dict[int, list[int]] = {}
    for pid, ppid in ppids.items():
        children.setdefault(ppid, []).append(pid)
    stack = [pid for pid in roots if _alive(pid)]
    while stack:
        pid = stack.pop()
        found.add(pid)
        stack.extend(c for c in children.get(pid, ()) if c not in found)
    found.discard(os.getpid())
    return sorted(found)


def _signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_gone(
    launch_id: str, popens: Sequence[subprocess.Popen[Any]], timeout: float
) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        # Reap our direct children; a reaped child's PID is free for reuse by
        # any other process, so only unreaped ones may serve as roots.
        roots = [proc.pid for proc in popens if proc.poll() is None]
        left = find_launched_processes(launch_id, roots)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def terminate_launched(
    launch_id: str,
    popens: Sequence[subprocess.Popen[Any]] = (),
    grace_s: float = 10.0,
) -> list[int]:
    """End every process of a launch, by PID, and return the PIDs signalled.

    Every live process started directly (``popens``) or carrying the marker
    gets SIGTERM (Flower's processes shut down cleanly on it); those still
    alive after ``grace_s`` (or spawned meanwhile) get SIGTERM again, then
    SIGKILL.

    Parameters
    ----------
    launch_id : str
        The launch's marker.
    popens : Sequence[subprocess.Popen[Any]]
        Processes started directly (they are also reaped).
    grace_s : float
        Seconds to wait after each SIGTERM round.

    Returns
    -------
    list[int]
        Sorted PIDs that were signalled.

    Raises
    ------
    FlowerLaunchError
        If a process is still alive after SIGKILL.
    """
    signalled: set[int] = set()
    first = {p.pid for p in popens if p.poll() is None}
    first |= set(find_launched_processes(launch_id))
    _signal_all(first, signal.SIGTERM)
    signalled.update(first)
    left = _wait_gone(launch_id, popens, grace_s)
    if left:  # e.g. spawned while shutting down
        _signal_all(left, signal.SIGTERM)
        signalled.update(left)
        left = _wait_gone(launch_id, popens, min(grace_s, 2.0))
    for _ in range(3):
        if not left:
            break
        _signal_all(left, signal.SIGKILL)
        signalled.update(left)
        left = _wait_gone(launch_id, popens, 5.0)
    if left:
        raise FlowerLaunchError(f"processes {left} survived SIGKILL")
    return sorted(signalled)


# ------------------------------------------------------------------- running
def _query_status(
    env: Mapping[str, str], connection: str, run_id: int, timeout: float = 60.0
) -> tuple[str, str]:
    """Ask the SuperLink for a run's status with ``flwr ls``; wait for the end.

    Retries (until ``timeout``) while the run is not finished or the CLI's
    output is not JSON (e.g. a slow, loaded machine); each ``flwr ls`` costs
    a CLI start-up (~2-3 s).
    """
    cmd = [_flwr_executable(), "ls", connection, "--run-id", str(run_id)]
    cmd += ["--format", "json"]
    deadline = time.monotonic() + timeout
    status, details = "unknown", "could not read the run status"
    while time.monotonic() < deadline:
        try:
            res = subprocess.run(
                cmd,
                env=dict(env),
                capture_output=True,
                text=True,
                timeout=max(1.0, deadline - time.monotonic()),
            )
        except subprocess.TimeoutExpired:
            details = f"`flwr ls` did not answer within {timeout:g} s"
            break
        try:
            payload = json.loads(res.stdout[res.stdout.find("{") :])
        except json.JSONDecodeError:
            tail = (res.stdout + res.stderr).strip()[-500:]
            details = f"`flwr ls` exited with {res.returncode}: {tail}"
            time.sleep(1.0)
            continue
        if not payload.get("success", False) or not payload.get("runs"):
            details = str(payload.get("error-message", details))
            break
        run = payload["runs"][0]
        status = str(run.get("status", "unknown"))
        details = str(run.get("status-details", ""))
        if status.startswith("finished"):
            break
        time.sleep(0.5)
    return status, details


def _flwr_run(
    app_dir: Path,
    connection: str,
    extra_args: Sequence[str],
    env: Mapping[str, str],
    log_path: Path,
    timeout: float,
) -> tuple[int | None, int, str, float]:
    """Run ``flwr run <app> <connection> --stream``; return id, code, output, s."""
    cmd = [_flwr_executable(), "run", str(app_dir), connection, "--stream"]
    cmd += list(extra_args)
    start = time.perf_counter()
    with log_path.open("w", encoding="utf-8") as log_file:
        proc = subprocess.Popen(
            cmd, env=dict(env), stdout=log_file, stderr=subprocess.STDOUT
        )
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            output = log_path.read_text(encoding="utf-8", errors="replace")
            raise FlowerLaunchError(
                f"`{' '.join(cmd)}` did not finish within {timeout} s; "
                f"log: {log_path}\n{output[-4000:]}"
            ) from None
        finally:
            if proc.poll() is None:  # timeout or interrupt: stop the CLI
                proc.kill()
                proc.wait()
    wall_s = time.perf_counter() - start
    output = log_path.read_text(encoding="utf-8", errors="replace")
    match = _RUN_ID_RE.search(output)
    return (int(match.group(1)) if match else None), returncode, output, wall_s


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
) -> CompletedRun:
    """Run a Flower app in Ray simulation with ``flwr run <app> local --stream``.

    Processes. ``flwr run`` (a child of this process) starts a detached local
    ``flower-superlink --simulation`` on two free loopback ports chosen here
    (``FLWR_LOCAL_SUPERLINK_HTTP_API_PORT``, ``FLWR_LOCAL_CONTROL_API_PORT``,
    so the run never joins another session's SuperLink on the default 39091);
    the SuperLink starts ``flower-superexec``, which starts ``flwr-simulation``
    for the run, which starts Ray (GCS, raylet, workers) and stops it when the
    run ends. ``flwr run --stream`` returns when the run's logs end. The run's
    status is then read with ``flwr ls``, and the SuperLink and everything
    carrying this launch's marker is ended by PID (see
    :func:`terminate_launched`), also on timeout or error.

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
        ``init-args-logging-level``, ``init-args-log-to-driver``.
    log_dir : Path | None
        Where ``flwr-run.log`` and ``run-config.toml`` go; ``flwr_home`` if
        ``None``.
    check : bool
        Raise :class:`FlowerLaunchError` unless the run completed.
    grace_s : float
        Seconds between SIGTERM and SIGKILL during cleanup.

    Returns
    -------
    CompletedRun
        Status, output and timing of the run.

    Raises
    ------
    FlowerLaunchError
        On timeout, or if ``check`` and the run did not complete.
    ConfigError
        If a ``run_config`` key is not in the app's config.
    ValueError
        If ``num_supernodes < 1``.
    """
    if num_supernodes < 1:
        raise ValueError(f"num_supernodes must be >= 1, got {num_supernodes}")
    app_dir = Path(app_dir).resolve()
    _check_run_config(app_dir, run_config or {})
    flwr_home = Path(flwr_home).resolve()
    log_dir = flwr_home if log_dir is None else Path(log_dir).resolve()
    flwr_home.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    launch_id = uuid.uuid4().hex
    http_port, control_port = _free_ports(2)
    env = offline_flower_env(flwr_home)
    env[LAUNCH_ID_ENV] = launch_id
    env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(http_port)
    env["FLWR_LOCAL_CONTROL_API_PORT"] = str(control_port)
    fed = {"num-supernodes": num_supernodes, **dict(federation_config or {})}
    args = ["--federation-config", _kv_option(fed)]
    args += _write_run_config(run_config or {}, log_dir / "run-config.toml")
    try:
        run_id, returncode, output, wall_s = _flwr_run(
            app_dir,
            "local",
            args,
            env,
            log_dir / "flwr-run.log",
            timeout,
        )
        status, details = "unknown", "run was not created"
        if run_id is not None:
            status, details = _query_status(env, "local", run_id)
    finally:
        terminate_launched(launch_id, grace_s=grace_s)
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


@dataclass
class DeploymentRuntime:
    """A SuperLink and N SuperNodes on loopback, as a context manager.

    On entry it starts ``flower-superlink --insecure --host 127.0.0.1 --port P``
    (one HTTP port serves the Fleet, Control and Runtime APIs in 1.42) and, for
    each party ``i``, ``flower-supernode --insecure --superlink 127.0.0.1:P
    --port Q_i --node-config "partition-id=i num-partitions=N ..."`` (``Q_i`` is
    the SuperNode's own Runtime API port and must differ per SuperNode), with
    the default ``--isolation subprocess``: each message runs in a fresh
    ``flwr-clientapp`` process. It waits until the SuperLink answers
    ``/health`` and every SuperNode has logged its id, and writes a connection
    ``[superlink.<connection>]`` with ``address``/``insecure`` into
    ``$FLWR_HOME/config.toml`` for :meth:`run`. On exit, even after an
    exception, every process it started and all their descendants are ended
    by PID (SIGTERM, then SIGKILL after ``grace_s``).

    Parameters
    ----------
    num_supernodes : int
        Number of SuperNodes (non-label parties).
    log_dir : Path
        Folder for ``superlink.log``, ``supernode-<i>.log`` and each run's log.
    flwr_home : Path | None
        ``FLWR_HOME``; ``log_dir / "flwr-home"`` if ``None``.
    node_configs : Sequence[Mapping[str, object]] | None
        Extra node config per SuperNode, merged over the partition keys.
    startup_timeout : float
        Seconds to wait for the SuperLink and the SuperNodes to be ready.
    grace_s : float
        Seconds between SIGTERM and SIGKILL when stopping.
    connection : str
        Name of the SuperLink connection written to ``config.toml``.

    Examples
    --------
    ::

        with DeploymentRuntime(2, tmp_path) as runtime:
            result = runtime.run(app_dir, {"num-rounds": 3}, timeout=120)
    """

    num_supernodes: int
    log_dir: Path
    flwr_home: Path | None = None
    node_configs: Sequence[Mapping[str, object]] | None = None
    startup_timeout: float = 60.0
    grace_s: float = 10.0
    connection: str = "tpsl-deployment"
    launch_id: str = field(default_factory=lambda: uuid.uuid4().hex, init=False)
    address: str = field(default="", init=False)
    env: dict[str, str] = field(default_factory=dict, init=False)
    _procs: list[subprocess.Popen[Any]] = field(default_factory=list, init=False)
    _runs: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.num_supernodes < 1:
            raise ValueError(f"num_supernodes must be >= 1, got {self.num_supernodes}")
        if self.node_configs is not None and len(self.node_configs) != (
            self.num_supernodes
        ):
            raise ValueError(
                f"node_configs must have {self.num_supernodes} entries, "
                f"got {len(self.node_configs)}"
            )
        self.log_dir = Path(self.log_dir).resolve()
        home = self.log_dir / "flwr-home" if self.flwr_home is None else self.flwr_home
        self.flwr_home = Path(home).resolve()
        self.env = offline_flower_env(self.flwr_home)
        self.env[LAUNCH_ID_ENV] = self.launch_id

    @property
    def pids(self) -> list[int]:
        """PIDs of the SuperLink (first) and the SuperNodes started directly."""
        return [proc.pid for proc in self._procs]

    def __enter__(self) -> DeploymentRuntime:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the SuperLink and the SuperNodes and wait until they are ready.

        Raises
        ------
        FlowerLaunchError
            If already started, if a process exits early, or if not ready
            within ``startup_timeout``.
        """
        if self._procs:
            raise FlowerLaunchError("DeploymentRuntime is already started")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        assert self.flwr_home is not None
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        link_port, *node_ports = _free_ports(1 + self.num_supernodes)
        self.address = f"127.0.0.1:{link_port}"
        self._write_connection()
        deadline = time.monotonic() + self.startup_timeout
        self._spawn(
            [
                "flower-superlink",
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(link_port),
                "--disable-runtime-dependency-installation",
            ],
            self.log_dir / "superlink.log",
        )
        logs = []
        for i, port in enumerate(node_ports):
            node_config: dict[str, object] = {
                "partition-id": i,
                "num-partitions": self.num_supernodes,
            }
            if self.node_configs is not None:
                node_config.update(self.node_configs[i])
            logs.append(self.log_dir / f"supernode-{i}.log")
            self._spawn(
                [
                    "flower-supernode",
                    "--insecure",
                    "--superlink",
                    self.address,
                    "--port",
                    str(port),
                    "--node-config",
                    _kv_option(node_config),
                ],
                logs[-1],
            )
        # SuperNodes start alongside the SuperLink (they retry until it is up)
        self._wait(lambda: _http_ok(f"http://{self.address}/health"), deadline)
        self._wait(
            lambda: all(_logged(log, _SUPERNODE_READY_RE) for log in logs), deadline
        )

    def run(
        self,
        app_dir: Path,
        run_config: Mapping[str, Any] | None = None,
        *,
        timeout: float = 600.0,
        check: bool = True,
    ) -> CompletedRun:
        """Run an app on this deployment with ``flwr run <app> <connection>``.

        Parameters
        ----------
        app_dir : Path
            Folder holding the app's ``pyproject.toml``.
        run_config : Mapping[str, Any] | None
            Overrides of ``[tool.flwr.app.config]`` (passed as a TOML file).
        timeout : float
            Seconds to wait for ``flwr run --stream`` to return.
        check : bool
            Raise :class:`FlowerLaunchError` unless the run completed.

        Returns
        -------
        CompletedRun
            Status, output and timing of the run.

        Raises
        ------
        FlowerLaunchError
            If not started, on timeout, or if ``check`` and the run failed.
        ConfigError
            If a ``run_config`` key is not in the app's config.
        """
        if not self._procs:
            raise FlowerLaunchError("DeploymentRuntime is not started")
        app_dir = Path(app_dir).resolve()
        _check_run_config(app_dir, run_config or {})
        self._runs += 1
        tag = f"run-{self._runs}"
        args = _write_run_config(run_config or {}, self.log_dir / f"{tag}-config.toml")
        run_id, returncode, output, wall_s = _flwr_run(
            app_dir,
            self.connection,
            args,
            self.env,
            self.log_dir / f"flwr-{tag}.log",
            timeout,
        )
        status, details = "unknown", "run was not created"
        if run_id is not None:
            status, details = _query_status(self.env, self.connection, run_id)
        result = CompletedRun(
            run_id=run_id,
            status=status,
            status_details=details,
            returncode=returncode,
            output=output,
            wall_s=wall_s,
            log_path=self.log_dir / f"flwr-{tag}.log",
            launch_id=self.launch_id,
        )
        return result.check() if check else result

    def stop(self) -> list[int]:
        """End every process of this deployment; return the PIDs signalled.

        Returns
        -------
        list[int]
            Sorted PIDs that were signalled (empty if nothing was running).
        """
        ended = terminate_launched(self.launch_id, self._procs, self.grace_s)
        self._procs.clear()
        return ended

    # ------------------------------------------------------------- helpers
    def _spawn(self, cmd: list[str], log_path: Path) -> None:
        with log_path.open("w", encoding="utf-8") as log_file:
            self._procs.append(
                subprocess.Popen(
                    cmd,
                    env=self.env,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            )

    def _wait(self, ready: Callable[[], bool], deadline: float) -> None:
        while not ready():
            for proc, name in zip(self._procs, self._names(), strict=False):
                if proc.poll() is not None:
                    raise FlowerLaunchError(
                        f"{name} exited with code {proc.returncode}; "
                        f"see logs in {self.log_dir}"
                    )
            if time.monotonic() > deadline:
                raise FlowerLaunchError(
                    f"Flower deployment not ready within {self.startup_timeout} s; "
                    f"see logs in {self.log_dir}"
                )
            time.sleep(0.2)

    def _names(self) -> list[str]:
        return ["flower-superlink"] + [
            f"flower-supernode {i}" for i in range(len(self._procs) - 1)
        ]

    def _write_connection(self) -> None:
        assert self.flwr_home is not None
        path = self.flwr_home / "config.toml"
        config: dict[str, Any] = {}
        if path.exists():
            config = tomli.loads(path.read_text(encoding="utf-8"))
        superlink = config.setdefault("superlink", {})
        superlink[self.connection] = {"address": self.address, "insecure": True}
        path.write_text(tomli_w.dumps(config), encoding="utf-8")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _logged(path: Path, pattern: re.Pattern[str]) -> bool:
    try:
        return (
            pattern.search(path.read_text(encoding="utf-8", errors="replace"))
            is not None
        )
    except OSError:
        return False
