"""Local deployment: a ``flower-superlink`` and N ``flower-supernode`` on loopback.

:class:`DeploymentRuntime` starts Flower's deployment runtime as it runs in
production (insecure, on 127.0.0.1), runs apps on it with
``flwr run <app> <connection>``, and on exit ends every process it started and
all their descendants, by PID
(:func:`~tpsl_flwr.engines.processes.terminate_launched`).

With ``secure=True`` it runs over TLS with authenticated SuperNodes, and the
SuperNodes reach the SuperLink only through an nginx proxy that forwards the
Fleet API alone (:mod:`~tpsl_flwr.engines.deployment.fleet_proxy`). In both modes the
SuperLink stays on loopback and answers only the label party's OS user
(:mod:`~tpsl_flwr.engines.superlink_guard`). The TLS support (certificates,
SuperNode registration, readiness) and the ``flwr`` CLI calls are in
:mod:`~tpsl_flwr.engines.deployment.security`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from tpsl_flwr._util.private_files import make_private_dir, open_private, write_private
from tpsl_flwr.engines.app_bundle import staged_app
from tpsl_flwr.engines.deployment import security
from tpsl_flwr.engines.deployment.certificates import LocalCertificates
from tpsl_flwr.engines.deployment.fleet_proxy import BYPASS_ENV, FleetProxy, find_nginx
from tpsl_flwr.engines.executor.fab_match import install_bundle
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
from tpsl_flwr.engines.superlink_guard import superlink_command
from tpsl_flwr.wire import protocol as P

__all__ = ["DeploymentRuntime", "open_log"]

_SUPERNODE_READY_RE = re.compile(r"SuperNode ID: (\d+)")
_EXECUTOR_READY_RE = re.compile(r"executor ready for ")


def open_log(path: Path) -> TextIO:
    """A process's log file, opened for writing: mode ``0600`` whatever the umask.

    The logs of a deployment are the label party's (the SuperLink's and the
    ``flwr run`` logs hold its per-epoch test metrics); the SuperNodes' and
    executors' are kept the same way. An existing file is truncated.
    """
    return open(open_private(path, "replace"), "w", encoding="utf-8")


EXECUTOR_SECRET = "superexec-secret"
"""The SuperExec secret's file in ``log_dir / "executor"`` (0700 folder, 0600),
removed by :meth:`DeploymentRuntime.stop`."""


def executor_command(address: str, secret_file: Path | None) -> list[str]:
    """The ``tpsl-flwr executor`` command line beside one SuperNode."""
    cmd = [
        sys.executable,
        "-m",
        "tpsl_flwr.cli",
        "executor",
        "--appio-api-address",
        address,
    ]
    if secret_file is not None:
        cmd += ["--superexec-auth-secret-file", str(secret_file)]
    return cmd


@dataclass
class DeploymentRuntime:
    """A SuperLink and N SuperNodes on loopback, as a context manager.

    On entry it starts ``flower-superlink --insecure --host 127.0.0.1 --port P``
    (one HTTP port serves the Fleet, Control and Runtime APIs in 1.42), behind
    the peer-uid guard (only this OS user's processes reach it), and, for
    each party ``i``, ``flower-supernode --insecure --superlink 127.0.0.1:P
    --port Q_i --node-config "partition-id=i num-partitions=N ..."`` (``Q_i`` is
    the SuperNode's own Runtime API port and must differ per SuperNode), with
    ``--isolation process`` and one warm executor beside it (``executor``,
    :mod:`~tpsl_flwr.engines.executor.warm`: ``tpsl-flwr executor
    --appio-api-address 127.0.0.1:Q_i``, which serves the node's tasks in one
    long-lived process; the two share a fresh SuperExec secret, so only that
    executor may take the node's tasks), or with ``executor=False`` the default
    ``--isolation subprocess``: each message runs in a fresh
    ``flwr-clientapp`` process. It waits until the SuperLink answers
    ``/health``, every SuperNode has logged its id and every executor is
    ready, and writes a connection
    ``[superlink.<connection>]`` with ``address``/``insecure`` into
    ``$FLWR_HOME/config.toml`` for :meth:`run` (see ``secure`` for the
    proxy). On exit, even after an exception, every process it started (nginx
    too) and all their descendants are ended by PID (SIGTERM, then SIGKILL
    after ``grace_s``).

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
    secure : bool
        Run over TLS with SuperNode authentication
        (:mod:`~tpsl_flwr.engines.deployment.security`); each SuperNode's key
        is registered over the loopback Control API once the SuperLink
        answers ``/health`` (:attr:`node_ids` holds the ids), and the
        SuperNodes connect to :attr:`fleet_address`, an nginx proxy that
        forwards only ``/v1/fleet/`` (:class:`~tpsl_flwr.engines.deployment.fleet_proxy.
        FleetProxy`, files in ``log_dir / "fleet-proxy"``); without nginx it
        refuses to start. ``False`` (default): everything plaintext, SuperNodes
        straight to the SuperLink.
    certificates_dir : Path | None
        With ``secure``: CA, SuperLink certificate and SuperNode key pairs,
        reused if present for ``num_supernodes``, else created there;
        ``None``: fresh ones in ``log_dir / "certificates"``.
    executor : bool
        A warm executor beside each SuperNode (default); ``False``: Flower's
        process per message (``flower-supernode`` with its default
        isolation: each message in a fresh ``flwr-clientapp`` process).
    executor_args : Sequence[str]
        Extra ``tpsl-flwr executor`` options (e.g. ``--task-timeout 30``).

    Examples
    --------
    ::

        with DeploymentRuntime(2, tmp_path) as runtime:
            result = runtime.run(app_dir, {"num-rounds": 3}, timeout=120)

        with DeploymentRuntime(2, tmp_path, secure=True) as runtime:
            result = runtime.run(app_dir, timeout=120)  # over TLS
            runtime.address  # Control and Runtime: the label party's loopback
            runtime.fleet_address  # the proxy: Fleet API only
    """

    num_supernodes: int
    log_dir: Path
    flwr_home: Path | None = None
    node_configs: Sequence[Mapping[str, object]] | None = None
    startup_timeout: float = 60.0
    grace_s: float = 10.0
    connection: str = "tpsl-deployment"
    secure: bool = False
    certificates_dir: Path | None = None
    executor: bool = True
    executor_args: Sequence[str] = ()
    executors: list[subprocess.Popen[Any]] = field(default_factory=list, init=False)
    executor_commands: list[list[str]] = field(default_factory=list, init=False)
    certificates: LocalCertificates | None = field(default=None, init=False)
    node_ids: list[int] = field(default_factory=list, init=False)
    launch_id: str = field(default_factory=lambda: uuid.uuid4().hex, init=False)
    address: str = field(default="", init=False)
    fleet_address: str = field(default="", init=False)
    proxy: FleetProxy | None = field(default=None, init=False)
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
        if self.certificates_dir is not None:
            self.certificates_dir = Path(self.certificates_dir).resolve()
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
        if self.secure:
            find_nginx()  # never fall back to exposing the Control API
            for name in BYPASS_ENV:  # no gRPC Control/Fleet server past nginx
                self.env.pop(name, None)
        # 0700 when made here, whatever the umask: the logs, the SuperExec
        # secret and the installed bundles Flower reuses (an existing folder is
        # the caller's, taken as it is)
        make_private_dir(self.log_dir, check=False)
        assert self.flwr_home is not None
        make_private_dir(self.flwr_home, check=False)
        deadline = time.monotonic() + self.startup_timeout
        if self.secure:
            self.certificates = security.prepare_certificates(
                self.log_dir, self.certificates_dir, self.num_supernodes
            )
        link_port, proxy_port, *node_ports = free_ports(2 + self.num_supernodes)
        self.address = f"127.0.0.1:{link_port}"
        self.fleet_address = self.address
        security.write_connection(
            self.flwr_home, self.connection, self.address, self.certificates
        )
        self._spawn(
            [
                *superlink_command(),
                *self._superlink_security_args(),
                "--host",
                "127.0.0.1",
                "--port",
                str(link_port),
                "--disable-runtime-dependency-installation",
            ],
            self.log_dir / "superlink.log",
        )
        if self.secure:
            assert self.certificates is not None
            self.proxy = FleetProxy(
                link_port,
                self.certificates,
                self.log_dir / "fleet-proxy",
                proxy_port,
                env=self.env,
            )
            self.proxy.start()
            self.fleet_address = self.proxy.address
            # SuperNodes may only connect once their public key is registered
            self._wait(self.superlink_healthy, deadline)
            self.node_ids = security.register_supernodes(
                self.certificates, self.env, self.connection, deadline
            )
            self._wait(self.proxy.ready, deadline)
        logs = []
        secret = self._executor_secret() if self.executor else None
        for i, port in enumerate(node_ports):
            node_config: dict[str, object] = {
                P.PARTITION_ID: i,
                P.NUM_PARTITIONS: self.num_supernodes,
            }
            if self.node_configs is not None:
                node_config.update(self.node_configs[i])
            logs.append(self.log_dir / f"supernode-{i}.log")
            isolation = []
            if self.executor:
                isolation = ["--isolation", "process"]
                isolation += ["--superexec-auth-secret-file", str(secret)]
            self._spawn(
                [
                    "flower-supernode",
                    *self.supernode_security_args(i),
                    "--superlink",
                    self.fleet_address,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    *isolation,
                    "--node-config",
                    kv_option(node_config),
                ],
                logs[-1],
            )
            if self.executor:
                command = executor_command(f"127.0.0.1:{port}", secret)
                command += list(self.executor_args)
                self.executor_commands.append(command)
                self.executors.append(
                    self._popen(command, self.log_dir / f"executor-{i}.log")
                )
        # Plaintext SuperNodes start alongside the SuperLink (they retry)
        self._wait(self.superlink_healthy, deadline)
        found = security.log_contains
        self._wait(lambda: all(found(x, _SUPERNODE_READY_RE) for x in logs), deadline)
        executor_logs = [self.executor_log(i) for i in range(len(self.executors))]
        self._wait(
            lambda: all(found(x, _EXECUTOR_READY_RE) for x in executor_logs), deadline
        )

    def executor_log(self, index: int) -> Path:
        """The log of SuperNode ``index``'s executor."""
        return self.log_dir / f"executor-{index}.log"

    def _executor_secret(self) -> Path:
        folder = make_private_dir(self.log_dir / "executor")
        return write_private(folder / EXECUTOR_SECRET, os.urandom(32))

    def superlink_healthy(self) -> bool:
        """Whether the guarded SuperLink answers (HTTPS if ``secure``)."""
        return security.superlink_healthy(self.address, self.certificates)

    def supernode_security_args(self, index: int | None = None) -> list[str]:
        """The ``flower-supernode`` arguments that connect it to this SuperLink.

        ``["--insecure"]``, or ``--root-certificates CA`` plus SuperNode
        ``index``'s private key (``secure``; ``None``: the CA only).
        """
        return security.supernode_security_args(self.certificates, index)

    def flwr_cli(
        self, *args: str, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``flwr *args`` with this deployment's ``FLWR_HOME`` and marker.

        E.g. ``"supernode", "list", runtime.connection``; exit code and output.
        """
        return security.run_flwr_cli(self.env, *args, timeout=timeout)

    def list_supernodes(self, timeout: float = 60.0) -> list[dict[str, Any]]:
        """The SuperLink's nodes from ``flwr supernode list <connection>``.

        Flower's JSON dicts (``node-id``, ``status``, ...); raises
        :class:`FlowerLaunchError` unless the CLI reports success.
        """
        return security.list_supernodes(self.env, self.connection, timeout)

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
        check_run_config(app_dir, run_config or {})
        self._runs += 1
        tag = f"run-{self._runs}"
        args = write_run_config(run_config or {}, self.log_dir / f"{tag}-config.toml")
        if self.executor:  # the first message runs warm too (see install_bundle)
            with staged_app(app_dir) as staged:  # the files flwr_run bundles
                install_bundle(staged, Path(str(self.flwr_home)))
        run_id, returncode, output, wall_s = flwr_run(
            app_dir,
            self.connection,
            args,
            self.env,
            self.log_dir / f"flwr-{tag}.log",
            timeout,
        )
        status, details = "unknown", "run was not created"
        if run_id is not None:
            status, details = query_status(self.env, self.connection, run_id)
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
        procs = list(self._procs) + list(self.executors)
        if self.proxy is not None and self.proxy.process is not None:
            procs.append(self.proxy.process)  # nginx's workers: by parentage
            self.proxy.process = None
        ended = terminate_launched(self.launch_id, procs, self.grace_s)
        self._procs.clear()
        self.executors.clear()
        # the SuperExec secret outlives no process that used it
        (self.log_dir / "executor" / EXECUTOR_SECRET).unlink(missing_ok=True)
        return sorted(set(ended))

    # ------------------------------------------------------------- helpers
    def _spawn(self, cmd: list[str], log_path: Path) -> None:
        self._procs.append(self._popen(cmd, log_path))

    def _popen(self, cmd: list[str], log_path: Path) -> subprocess.Popen[Any]:
        with open_log(log_path) as log_file:
            return subprocess.Popen(
                cmd,
                env=self.env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def _wait(self, ready: Callable[[], bool], deadline: float) -> None:
        while not ready():
            named = [*zip(self._procs, self._names(), strict=False)]
            named += [(p, f"executor {i}") for i, p in enumerate(self.executors)]
            for proc, name in named:
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

    def _superlink_security_args(self) -> list[str]:
        return security.superlink_security_args(self.certificates)

    def _names(self) -> list[str]:
        nodes = range(len(self._procs) - 1)
        return ["flower-superlink", *(f"flower-supernode {i}" for i in nodes)]
