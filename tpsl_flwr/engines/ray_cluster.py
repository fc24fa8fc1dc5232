"""Which Ray cluster a Flower simulation joins, and what each node actor asks of it.

Flower 1.42's Ray backend calls ``ray.init()`` without an address
(``flwr/server/superlink/fleet/vce/backend/raybackend.py``), so Ray's own
resolution decides where the node actors run (``ray.init`` in Ray 2.x):

1. ``RAY_ADDRESS`` when set: ``host:port`` joins that cluster's GCS,
   ``local`` starts a new local instance, ``auto`` joins the latest
   ``ray start`` on this host;
2. else the cluster of the latest ``ray start`` on this host (its GCS address
   is recorded in ``<temp>/ray/ray_current_cluster``, ``<temp>`` being
   ``RAY_TMPDIR``, ``TMPDIR`` or ``/tmp``);
3. else a new local instance, stopped when the run ends.

:func:`resolve_ray_target` mirrors that order *before* anything starts, so an
unreachable cluster is one clear error instead of a run that hangs inside
``ray.init``; :func:`client_resources` picks the resources each node actor
asks for (Flower's ``options.backend.client-resources``), which decide how
many actors fit on each raylet and so how they spread over the cluster.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpsl_flwr.engines.flower_env import read_toml
from tpsl_flwr.errors import ConfigError

__all__ = [
    "RAY_ADDRESS_ENV",
    "RayTarget",
    "client_resources",
    "flower_client_resources",
    "resolve_ray_target",
]

RAY_ADDRESS_ENV = "RAY_ADDRESS"
"""Ray's environment variable naming the cluster ``ray.init()`` joins."""

CLUSTER_CLIENT_CPUS = 1
"""CPUs per node actor when joining a cluster and nothing else is configured.

Flower's own default (2) fits no actor on a raylet with one CPU; one CPU per
actor puts one actor on every CPU of every raylet.
"""

_PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class RayTarget:
    """Where the node actors of a simulation will run.

    Parameters
    ----------
    address : str | None
        The GCS address (``host:port``) of the cluster joined, or ``None``
        for a new local Ray instance started (and stopped) by the run.
    source : str
        What chose it: ``"RAY_ADDRESS"``, ``"ray start"`` (the latest one on
        this host) or ``"local"``.
    """

    address: str | None
    source: str

    @property
    def joins_cluster(self) -> bool:
        """Whether the run joins a running cluster (``address`` is set)."""
        return self.address is not None

    def describe(self) -> str:
        """One line for the run's output.

        Examples
        --------
        >>> RayTarget("10.0.0.5:6379", "RAY_ADDRESS").describe()
        'Ray: joining the cluster at 10.0.0.5:6379 (RAY_ADDRESS)'
        >>> RayTarget(None, "local").describe()
        'Ray: a new local instance for this run'
        """
        if self.address is None:
            return "Ray: a new local instance for this run"
        origin = (
            "RAY_ADDRESS"
            if self.source == RAY_ADDRESS_ENV
            else "the latest `ray start` on this host"
        )
        return f"Ray: joining the cluster at {self.address} ({origin})"


def ray_address_file(env: Mapping[str, str]) -> Path:
    """Where ``ray start`` records the latest cluster's address on this host.

    Examples
    --------
    >>> str(ray_address_file({"RAY_TMPDIR": "/scratch"}))
    '/scratch/ray/ray_current_cluster'
    """
    temp = env.get("RAY_TMPDIR") or env.get("TMPDIR") or "/tmp"
    return Path(temp) / "ray" / "ray_current_cluster"


def _split_address(address: str, origin: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as a pair, else a ``ConfigError``."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"{origin} {address!r} is not a Ray GCS address: expected host:port "
            "(the address `ray start --head` prints), `local` or `auto`"
        )
    return host, int(port)


def _check_reachable(address: str, origin: str, timeout: float) -> None:
    """Raise ``ConfigError`` unless a TCP connection to ``address`` opens."""
    host, port = _split_address(address, origin)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"{origin} {address!r} is not reachable ({why}): start the cluster "
            "there (`ray start --head --port PORT`), fix the address, or set "
            "RAY_ADDRESS=local for a new local Ray instance"
        ) from None


def check_record_owner(record: Path) -> None:
    """Refuse a ``ray start`` record another user could have written.

    The record lives in a shared temporary folder; a cluster named there by
    another local user would run the node actors (every message, every
    party's columns) and hand results back to the label party's driver. So a
    record is followed only when it belongs to this user and is not writable
    by group or others; else ``RAY_ADDRESS`` must name the cluster
    explicitly. (Ray makes its folder writable by everyone, so another user
    can only replace the file, which changes its owner; the address checked
    here is then pinned as ``RAY_ADDRESS`` for the run's processes.)

    Raises
    ------
    ConfigError
        Naming the file, its owner and its mode.
    """
    info = record.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise ConfigError(
            f"the `ray start` record {record} belongs to uid {info.st_uid} with "
            f"mode {oct(info.st_mode & 0o777)}: it is followed only when it is "
            f"this user's (uid {os.getuid()}) and not writable by others; set "
            f"{RAY_ADDRESS_ENV}=<head-ip>:<gcs-port> (or local) explicitly"
        )


def resolve_ray_target(
    env: Mapping[str, str] | None = None, *, timeout: float = _PROBE_TIMEOUT_S
) -> RayTarget:
    """The cluster ``ray.init()`` will join in ``env``, checked reachable.

    Parameters
    ----------
    env : Mapping[str, str] | None
        The environment of the run's processes; ``os.environ`` if ``None``.
    timeout : float
        Seconds to wait for a TCP connection to the cluster's GCS.

    Returns
    -------
    RayTarget
        The address joined (``None``: a new local instance) and its source.

    Raises
    ------
    ConfigError
        If ``RAY_ADDRESS`` is a Ray Client address (``ray://``: Flower's
        driver must run on a node of the cluster), is malformed, or names a
        cluster that does not answer; if ``RAY_ADDRESS=auto`` finds no
        ``ray start`` cluster; or if the latest ``ray start`` recorded on this
        host does not answer (a stale record).

    Examples
    --------
    >>> resolve_ray_target({"RAY_ADDRESS": "local"})
    RayTarget(address=None, source='local')
    >>> resolve_ray_target({"RAY_ADDRESS": "ray://head:10001"})
    Traceback (most recent call last):
    ...
    tpsl_flwr.errors.ConfigError: RAY_ADDRESS 'ray://head:10001' is a Ray Client address; ...
    """  # noqa: E501
    env = os.environ if env is None else env
    address = env.get(RAY_ADDRESS_ENV, "").strip()
    if address == "local":
        return RayTarget(None, "local")
    if "://" in address:
        raise ConfigError(
            f"{RAY_ADDRESS_ENV} {address!r} is a Ray Client address; Flower's Ray "
            "backend runs its driver on a node of the cluster: run there with "
            f"{RAY_ADDRESS_ENV}=<head-ip>:<gcs-port>"
        )
    if address and address != "auto":
        _check_reachable(address, RAY_ADDRESS_ENV, timeout)
        return RayTarget(address, RAY_ADDRESS_ENV)
    record = ray_address_file(env)
    recorded = record.read_text().strip() if record.is_file() else ""
    if recorded:
        check_record_owner(record)
        _check_reachable(
            recorded,
            f"the latest `ray start` on this host (recorded in {record})",
            timeout,
        )
        return RayTarget(recorded, "ray start")
    if address == "auto":
        raise ConfigError(
            f"{RAY_ADDRESS_ENV}=auto but no `ray start` cluster is recorded on this "
            f"host ({record}); set {RAY_ADDRESS_ENV}=<head-ip>:<gcs-port>"
        )
    return RayTarget(None, "local")


def _checked_resources(raw: Mapping[str, Any], origin: str) -> dict[str, object]:
    """``num-cpus`` (int >= 1) and ``num-gpus`` (>= 0) as federation options."""
    unknown = sorted(set(raw) - {"num-cpus", "num-gpus"})
    if unknown:
        raise ConfigError(
            f"{origin}: unknown client resources {unknown} (known: num-cpus, num-gpus)"
        )
    options: dict[str, object] = {}
    if "num-cpus" in raw:
        cpus = raw["num-cpus"]
        if isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1:
            raise ConfigError(
                f"{origin}: num-cpus must be an integer >= 1 (Flower accepts whole "
                f"CPUs only), got {cpus!r}"
            )
        options["client-resources-num-cpus"] = cpus
    if "num-gpus" in raw:
        gpus = raw["num-gpus"]
        if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or gpus < 0:
            raise ConfigError(f"{origin}: num-gpus must be >= 0, got {gpus!r}")
        options["client-resources-num-gpus"] = float(gpus)
    return options


def flower_client_resources(flwr_config: Path) -> dict[str, object]:
    """The ``local`` federation's client resources in a Flower ``config.toml``.

    ``[superlink.local] options.backend.client-resources.num-cpus`` (and
    ``num-gpus``), as ``flwr run . local`` would apply them, returned as
    ``--federation-config`` options; empty when the file or the table is
    absent.

    Raises
    ------
    ConfigError
        If a value is not one Flower accepts.
    """
    if not flwr_config.is_file():
        return {}
    table: Any = read_toml(flwr_config)
    for key in ("superlink", "local", "options", "backend", "client-resources"):
        table = table.get(key) if isinstance(table, dict) else None
    if not isinstance(table, dict):
        return {}
    return _checked_resources(
        table, f"{flwr_config} [superlink.local] options.backend.client-resources"
    )


def client_resources(
    target: RayTarget, env: Mapping[str, str] | None = None
) -> dict[str, object]:
    """The resources each node actor asks for, as ``--federation-config`` options.

    In order: the caller's Flower config (``$FLWR_HOME/config.toml``, else
    ``~/.flwr/config.toml``: ``[superlink.local]
    options.backend.client-resources``); else, when joining a cluster,
    :data:`CLUSTER_CLIENT_CPUS` CPU per actor; else nothing (Flower's default:
    2 CPUs, 0 GPUs per actor). Flower sizes its actor pool raylet by raylet
    (CPUs of each raylet // ``num-cpus``), so these decide how many node
    actors run on each host.

    Parameters
    ----------
    target : RayTarget
        Where the run's actors go (:func:`resolve_ray_target`).
    env : Mapping[str, str] | None
        The caller's environment (for ``FLWR_HOME``); ``os.environ`` if
        ``None``.

    Returns
    -------
    dict[str, object]
        ``client-resources-num-cpus`` / ``client-resources-num-gpus`` entries.

    Examples
    --------
    >>> client_resources(RayTarget("10.0.0.5:6379", "RAY_ADDRESS"), {"HOME": "/no"})
    {'client-resources-num-cpus': 1}
    >>> client_resources(RayTarget(None, "local"), {"HOME": "/no"})
    {}
    """
    env = os.environ if env is None else env
    home = env.get("FLWR_HOME") or str(Path(env.get("HOME", "~")) / ".flwr")
    configured = flower_client_resources(Path(home).expanduser() / "config.toml")
    if configured:
        return configured
    if target.joins_cluster:
        return {"client-resources-num-cpus": CLUSTER_CLIENT_CPUS}
    return {}
