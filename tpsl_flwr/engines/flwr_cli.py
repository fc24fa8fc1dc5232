"""One ``flwr run --stream`` of an app, and its final status from ``flwr ls``.

Both launchers (:mod:`~tpsl_flwr.engines.simulation`,
:mod:`~tpsl_flwr.engines.deployment.runtime`) run an app on a SuperLink connection
with :func:`flwr_run` and read how it ended with :func:`query_status`:
``flwr run`` exits with 0 even when the ServerApp fails, so the status the
SuperLink records is what tells. :class:`CompletedRun` holds the outcome.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tpsl_flwr._util.private_files import open_private
from tpsl_flwr.engines.app_bundle import staged_app
from tpsl_flwr.engines.flower_env import flwr_executable
from tpsl_flwr.engines.processes import FlowerLaunchError

__all__ = ["CompletedRun", "flwr_run", "query_status"]

_COMPLETED = "finished:completed"
_RUN_ID_RE = re.compile(r"Successfully started run (\d+)")


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
            If the run did not complete; one line: the status, Flower's cause
            (its first line) and the log file, which holds the rest.
        """
        if not self.ok:
            details = self.status_details.strip().splitlines()
            cause = f": {details[0]}" if details else ""
            raise FlowerLaunchError(
                f"Flower run {self.run_id} ended with status {self.status!r}"
                f"{cause} (details: {self.log_path})"
            )
        return self


def query_status(
    env: Mapping[str, str], connection: str, run_id: int, timeout: float = 60.0
) -> tuple[str, str]:
    """Ask the SuperLink for a run's status with ``flwr ls``; wait for the end.

    Retries (until ``timeout``) while the run is not finished or the CLI's
    output is not JSON (e.g. a slow, loaded machine); each ``flwr ls`` costs
    a CLI start-up (~2-3 s).
    """
    cmd = [flwr_executable(), "ls", connection, "--run-id", str(run_id)]
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


def flwr_run(
    app_dir: Path,
    connection: str,
    extra_args: Sequence[str],
    env: Mapping[str, str],
    log_path: Path,
    timeout: float,
) -> tuple[int | None, int, str, float]:
    """Run ``flwr run <app> <connection> --stream``; return id, code, output, s.

    Flower bundles the app from a private staged copy holding only its
    ``pyproject.toml`` and its components' code
    (:func:`~tpsl_flwr.engines.app_bundle.staged_app`), never from ``app_dir``
    itself, whose other files (run folders, keys, results) would otherwise be
    sent to every node. A file named like a private output in that code raises
    :class:`~tpsl_flwr.errors.PrivacyError` before the CLI starts.
    """
    start = time.perf_counter()
    # A new file (new inode), never the last run's truncated: a follower of
    # the old file can never show its lines as this run's.
    log_path.unlink(missing_ok=True)
    with staged_app(app_dir) as staged:
        cmd = [flwr_executable(), "run", str(staged), connection, "--stream"]
        cmd += list(extra_args)
        returncode = _run_cli(cmd, env, log_path, timeout, f"{app_dir} {connection}")
    wall_s = time.perf_counter() - start
    output = log_path.read_text(encoding="utf-8", errors="replace")
    match = _RUN_ID_RE.search(output)
    return (int(match.group(1)) if match else None), returncode, output, wall_s


def _run_cli(
    cmd: list[str], env: Mapping[str, str], log_path: Path, timeout: float, what: str
) -> int:
    """Run ``cmd`` with its output in a new ``log_path`` (0600); its exit code."""
    # 0600: the log holds the label party's per-epoch test metrics.
    fd = open_private(log_path, "new")
    with open(fd, "w", encoding="utf-8") as log_file:
        proc = subprocess.Popen(
            cmd, env=dict(env), stdout=log_file, stderr=subprocess.STDOUT
        )
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise FlowerLaunchError(
                f"`flwr run {what}` did not finish within "
                f"{timeout:g} s (details: {log_path})"
            ) from None
        finally:
            if proc.poll() is None:  # timeout or interrupt: stop the CLI
                proc.kill()
                proc.wait()
    return returncode
