"""TLS and SuperNode authentication for a loopback deployment, and the ``flwr`` CLI.

With ``secure=True``, :class:`~tpsl_flwr.engines.deployment.runtime.DeploymentRuntime`
runs over TLS with authenticated SuperNodes, as Flower 1.42 documents it: the
SuperLink serves HTTPS (``--ssl-ca-certfile/--ssl-certfile/--ssl-keyfile``)
with ``--enable-supernode-auth``; each SuperNode's public key is registered
with ``flwr supernode register`` (Control API, over TLS) before the SuperNode
starts with ``--root-certificates`` and ``--auth-supernode-private-key``; and
the ``flwr`` CLI's connection has ``root-certificates`` instead of
``insecure = true``. The certificates and keys come from
:mod:`~tpsl_flwr.engines.deployment.certificates` (a local CA, for loopback only).
The SuperLink itself listens on 127.0.0.1 only, behind
:mod:`~tpsl_flwr.engines.superlink_guard` (it answers only this OS user's
processes): the connection written here (and so registration and every
``flwr`` call) uses that loopback Control API, and the SuperNodes reach the
Fleet API through :mod:`~tpsl_flwr.engines.deployment.fleet_proxy`.

The readiness probes (:func:`superlink_healthy`, :func:`log_contains`) live
here too. The functions take the few values they need (address,
certificates, ``FLWR_HOME``, environment, connection name);
``certificates=None`` means plaintext (``--insecure``) throughout. The
runtime's methods call them.
"""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import tomli_w

from tpsl_flwr.engines.deployment.certificates import (
    LocalCertificates,
    create_local_certificates,
    load_local_certificates,
)
from tpsl_flwr.engines.flower_env import flwr_executable, read_toml
from tpsl_flwr.engines.processes import FlowerLaunchError
from tpsl_flwr.engines.superlink_guard import guard_ready

__all__ = [
    "list_supernodes",
    "log_contains",
    "prepare_certificates",
    "register_supernodes",
    "run_flwr_cli",
    "superlink_healthy",
    "superlink_security_args",
    "supernode_security_args",
    "write_connection",
]


def prepare_certificates(
    log_dir: Path, certificates_dir: Path | None, num_supernodes: int
) -> LocalCertificates:
    """The deployment's CA, SuperLink certificate and SuperNode key pairs.

    Parameters
    ----------
    log_dir : Path
        Deployment log folder; fresh certificates go to
        ``log_dir / "certificates"`` when ``certificates_dir`` is ``None``.
    certificates_dir : Path | None
        Folder to reuse if it already holds them for ``num_supernodes``
        SuperNodes, else to create them in.
    num_supernodes : int
        Number of SuperNode key pairs.

    Returns
    -------
    LocalCertificates
        Paths of the CA, the SuperLink certificate and the key pairs.
    """
    if certificates_dir is None:
        return create_local_certificates(log_dir / "certificates", num_supernodes)
    try:
        return load_local_certificates(certificates_dir, num_supernodes)
    except FileNotFoundError:
        return create_local_certificates(certificates_dir, num_supernodes)


def superlink_security_args(certificates: LocalCertificates | None) -> list[str]:
    """The ``flower-superlink`` security arguments.

    Parameters
    ----------
    certificates : LocalCertificates | None
        ``None`` for plaintext.

    Returns
    -------
    list[str]
        ``["--insecure"]``, or the ``--ssl-*`` arguments plus
        ``--enable-supernode-auth``.
    """
    if certificates is None:
        return ["--insecure"]
    return [*certificates.superlink_args(), "--enable-supernode-auth"]


def supernode_security_args(
    certificates: LocalCertificates | None, index: int | None = None
) -> list[str]:
    """The ``flower-supernode`` arguments that connect it to the SuperLink.

    Parameters
    ----------
    certificates : LocalCertificates | None
        ``None`` for plaintext.
    index : int | None
        SuperNode whose key pair to use (with certificates only); ``None`` for
        just ``--root-certificates`` (add your own key).

    Returns
    -------
    list[str]
        ``["--insecure"]``, or ``--root-certificates CA`` plus
        ``--auth-supernode-private-key KEY`` with certificates.
    """
    if certificates is None:
        return ["--insecure"]
    args = ["--root-certificates", str(certificates.ca_certfile)]
    if index is not None:
        key = certificates.supernodes[index].private_key
        args += ["--auth-supernode-private-key", str(key)]
    return args


def superlink_healthy(address: str, certificates: LocalCertificates | None) -> bool:
    """Whether the SuperLink answers, behind the peer-uid guard.

    Parameters
    ----------
    address : str
        ``host:port`` of the SuperLink; ``""`` (not started) is never healthy.
    certificates : LocalCertificates | None
        ``None`` for HTTP, else HTTPS verified against the local CA.

    Returns
    -------
    bool
        ``True`` once :func:`~tpsl_flwr.engines.superlink_guard.guard_ready`.

    Raises
    ------
    FlowerLaunchError
        If a server answers there without the guard, or another user's
        socket listens on the port.
    """
    if not address:
        return False
    if certificates is None:
        return guard_ready(address)
    return guard_ready(
        address, ssl.create_default_context(cafile=str(certificates.ca_certfile))
    )


def write_connection(
    flwr_home: Path,
    connection: str,
    address: str,
    certificates: LocalCertificates | None,
) -> None:
    """Write ``[superlink.<connection>]`` into ``$FLWR_HOME/config.toml``.

    Parameters
    ----------
    flwr_home : Path
        ``FLWR_HOME``; other entries of its ``config.toml`` are kept.
    connection : str
        Connection name.
    address : str
        ``host:port`` of the SuperLink.
    certificates : LocalCertificates | None
        ``None``: ``insecure = true``; else ``root-certificates`` (the CA).
    """
    path = flwr_home / "config.toml"
    config: dict[str, Any] = {}
    if path.exists():
        config = read_toml(path)
    superlink = config.setdefault("superlink", {})
    if certificates is None:
        superlink[connection] = {"address": address, "insecure": True}
    else:
        superlink[connection] = {
            "address": address,
            "root-certificates": str(certificates.ca_certfile),
        }
    path.write_text(tomli_w.dumps(config), encoding="utf-8")


def run_flwr_cli(
    env: dict[str, str], *args: str, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run ``flwr *args`` in ``env``, capturing its text output.

    Parameters
    ----------
    env : dict[str, str]
        Environment (``FLWR_HOME``, launch marker, offline settings).
    *args : str
        CLI arguments, e.g. ``"supernode", "list", connection``.
    timeout : float
        Seconds before :class:`subprocess.TimeoutExpired`.

    Returns
    -------
    subprocess.CompletedProcess[str]
        Exit code and captured text output.
    """
    return subprocess.run(
        [flwr_executable(), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def list_supernodes(
    env: dict[str, str], connection: str, timeout: float = 60.0
) -> list[dict[str, Any]]:
    """The SuperLink's nodes from ``flwr supernode list <connection>``.

    Parameters
    ----------
    env : dict[str, str]
        Environment for :func:`run_flwr_cli`.
    connection : str
        SuperLink connection in ``$FLWR_HOME/config.toml``.
    timeout : float
        Seconds before :class:`subprocess.TimeoutExpired`.

    Returns
    -------
    list[dict[str, Any]]
        One dict per node (``node-id``, ``status``, ...), as Flower's JSON
        output has them.

    Raises
    ------
    FlowerLaunchError
        If the CLI does not report success.
    """
    res = run_flwr_cli(
        env, "supernode", "list", connection, "--format", "json", timeout=timeout
    )
    payload = _json_payload(res)
    if payload is None or not payload.get("success", False):
        raise FlowerLaunchError(
            f"`flwr supernode list` failed (exit {res.returncode}): "
            f"{(res.stdout + res.stderr).strip()[-2000:]}"
        )
    return list(payload.get("nodes", []))


def register_supernodes(
    certificates: LocalCertificates,
    env: dict[str, str],
    connection: str,
    deadline: float,
) -> list[int]:
    """Register every SuperNode's public key, concurrently; return the ids.

    Parameters
    ----------
    certificates : LocalCertificates
        Key pairs to register, in SuperNode order (named ``partition-<i>``).
    env : dict[str, str]
        Environment for ``flwr supernode register``.
    connection : str
        SuperLink connection in ``$FLWR_HOME/config.toml``.
    deadline : float
        :func:`time.monotonic` time by which every registration must end.

    Returns
    -------
    list[int]
        Node ids, in SuperNode order.

    Raises
    ------
    FlowerLaunchError
        If any registration does not report success.
    """
    procs = []
    for i, pair in enumerate(certificates.supernodes):
        cmd = [flwr_executable(), "supernode", "register", str(pair.public_key)]
        cmd += [connection, "--name", f"partition-{i}", "--format", "json"]
        procs.append(
            subprocess.Popen(
                cmd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        )
    node_ids, errors = [], []
    for i, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        result = subprocess.CompletedProcess(proc.args, proc.returncode, out, "")
        payload = _json_payload(result)
        if payload is not None and payload.get("success") and "node-id" in payload:
            node_ids.append(int(payload["node-id"]))
        else:
            errors.append(f"SuperNode {i} (exit {proc.returncode}): {out[-1000:]}")
    if errors:
        raise FlowerLaunchError(
            "`flwr supernode register` failed for " + "; ".join(errors)
        )
    return node_ids


def log_contains(path: Path, pattern: re.Pattern[str]) -> bool:
    """Whether a process log already holds ``pattern`` (e.g. a SuperNode's id).

    Parameters
    ----------
    path : Path
        Log file; a missing or unreadable one counts as not matching.
    pattern : re.Pattern[str]
        Pattern to search for.

    Returns
    -------
    bool
        ``True`` if ``pattern`` is found.
    """
    try:
        return (
            pattern.search(path.read_text(encoding="utf-8", errors="replace"))
            is not None
        )
    except OSError:
        return False


def _json_payload(res: subprocess.CompletedProcess[str]) -> dict[str, Any] | None:
    """The JSON object in a ``flwr ... --format json`` output, if any."""
    text = res.stdout or ""
    start = text.find("{")
    if start < 0:
        return None
    try:
        payload = json.loads(text[start:])
    except json.JSONDecodeError:
        return None
    return payload if isinstance(payload, dict) else None
