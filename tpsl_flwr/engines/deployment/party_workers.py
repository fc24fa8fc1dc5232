"""Party workers beside local SuperNodes: started by PID, waited for, ended.

:class:`~tpsl_flwr.engines.deployment.runtime.DeploymentRuntime` with
``party_workers=True`` starts one ``tpsl-flwr party`` process per SuperNode
(:mod:`tpsl_flwr.simulations.party_worker`) before the SuperNodes, in one
fresh 0700 socket folder under the system temp folder (a Unix socket path
must stay under ~100 bytes), and gives SuperNode ``i`` the node config
``worker-socket=<folder>/party-<i>.sock``. Each worker imports torch and
builds its party while the SuperLink and SuperNodes start. The workers carry
the launch marker of the runtime, so its stop ends them too; :meth:`stop`
ends them by PID and removes the folder.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpsl_flwr.engines.flower_env import write_run_config
from tpsl_flwr.engines.processes import FlowerLaunchError, terminate_launched
from tpsl_flwr.wire.worker_link import WORKER_SOCKET, socket_path

__all__ = ["WORKER_SOCKET", "PartyWorkers", "party_command"]


def party_command(
    partition_id: int,
    num_partitions: int,
    socket_dir: Path,
    run_config_file: Path | None = None,
) -> list[str]:
    """The ``tpsl-flwr party`` command line of one worker (this interpreter's)."""
    cmd = [
        sys.executable,
        "-m",
        "tpsl_flwr.cli",
        "party",
        "--partition-id",
        str(partition_id),
        "--num-partitions",
        str(num_partitions),
        "--socket-dir",
        str(socket_dir),
    ]
    if run_config_file is not None:
        cmd += ["--run-config", str(run_config_file)]
    return cmd


@dataclass
class PartyWorkers:
    """``num_partitions`` party workers on this machine.

    Parameters
    ----------
    num_partitions : int
        One worker per partition ``0 .. num_partitions - 1``.
    log_dir : Path
        Folder for ``party-worker-<i>.log`` (and the run config file).
    env : Mapping[str, str]
        The workers' environment (the runtime's, with its launch marker).
    run_config : Mapping[str, Any] | None
        The full run config the nodes will see (app defaults plus overrides):
        each worker builds its party for it before the first message.
        ``None``: they build on the first message.
    """

    num_partitions: int
    log_dir: Path
    env: Mapping[str, str]
    run_config: Mapping[str, Any] | None = None
    socket_dir: Path | None = field(default=None, init=False)
    _procs: list[subprocess.Popen[Any]] = field(default_factory=list, init=False)

    @property
    def sockets(self) -> list[Path]:
        """The socket of each worker, by partition."""
        assert self.socket_dir is not None, "PartyWorkers not started"
        return [socket_path(self.socket_dir, i) for i in range(self.num_partitions)]

    @property
    def pids(self) -> list[int]:
        """PIDs of the workers."""
        return [proc.pid for proc in self._procs]

    def start(self) -> None:
        """Start the workers (returns at once; :meth:`wait` for them)."""
        self.socket_dir = Path(tempfile.mkdtemp(prefix="tpsl-party-"))
        config_file = None
        if self.run_config is not None:
            config_file = self.log_dir / "party-worker-config.toml"
            write_run_config(self.run_config, config_file)
        for i in range(self.num_partitions):
            cmd = party_command(i, self.num_partitions, self.socket_dir, config_file)
            with (self.log_dir / f"party-worker-{i}.log").open("w") as log:
                self._procs.append(
                    subprocess.Popen(
                        cmd,
                        env=dict(self.env),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                    )
                )

    def ready(self) -> bool:
        """Whether every worker listens; raise if one has exited."""
        for i, proc in enumerate(self._procs):
            if proc.poll() is not None:
                raise FlowerLaunchError(
                    f"party worker {i} exited with code {proc.returncode}; see "
                    f"{self.log_dir / f'party-worker-{i}.log'}"
                )
        return all(path.is_socket() for path in self.sockets)

    def wait(self, timeout: float) -> None:
        """Wait until every worker listens, at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise FlowerLaunchError(
                    f"party workers not ready within {timeout} s; see "
                    f"{self.log_dir}/party-worker-*.log"
                )
            time.sleep(0.1)

    def stop(self, grace_s: float = 10.0) -> list[int]:
        """End the workers by PID and remove the socket folder; PIDs signalled."""
        ended: list[int] = []
        if self._procs:
            # only these PIDs (and their children): the marker is shared with
            # the SuperLink and SuperNodes, which the runtime ends itself
            ended = terminate_launched("", self._procs, grace_s)
            self._procs.clear()
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
        return ended
