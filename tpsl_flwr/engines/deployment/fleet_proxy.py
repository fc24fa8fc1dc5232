"""An nginx reverse proxy that exposes only a SuperLink's Fleet API.

A Flower 1.42 SuperLink serves the Fleet API (``/v1/fleet/...``, what
SuperNodes call), the Control API (``/v1/control/...``: ``flwr run``, ``ls``,
``log``, ``supernode register``) and the Runtime API (``/v1/runtime/...``,
used by the ServerApp process) as HTTP on one ``--host``/``--port``
(``flwr/superlink/main.py``; the legacy gRPC servers start only when the
internal ``FLWR_INTERNAL_GRPC_*_API`` variables are ``1``). Open-source
Flower does not authenticate the Control API, so whoever reaches that port
can start a run whose ServerApp executes on the SuperLink's host.

The SuperLink therefore binds to ``127.0.0.1`` on the label party's machine,
and the SuperNodes reach it only through nginx, configured from the template
shipped with this package (:data:`TEMPLATE`, ``fleet-proxy.nginx.conf``):
TLS terminates at nginx, ``POST /v1/fleet/*`` is forwarded (normalised) to
the SuperLink over TLS on loopback, and every other path answers 403.
SuperNode authentication keeps working: Flower's signed headers
(``flwr-public-key``, ``flwr-timestamp``, ``flwr-signature``) pass unchanged.

The SuperLink keeps TLS on loopback because ``flower-superlink`` refuses
``--enable-supernode-auth`` together with ``--insecure``; the proxy checks its
certificate (``proxy_ssl_verify``).

:class:`FleetProxy` renders the config into a private prefix folder, starts
``nginx -g 'daemon off;'`` (so the master stays the child that was started)
and ends it by PID (:func:`~tpsl_flwr.engines.processes.terminate_launched`).
"""

from __future__ import annotations

import os
import pwd
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from tpsl_flwr._util.private_files import make_private_dir
from tpsl_flwr.engines.deployment.certificates import LocalCertificates
from tpsl_flwr.engines.processes import FlowerLaunchError, terminate_launched

__all__ = [
    "BYPASS_ENV",
    "FLEET_PREFIX",
    "TEMPLATE",
    "FleetProxy",
    "find_nginx",
    "render_config",
]

TEMPLATE = "fleet-proxy.nginx.conf"
"""Name of the nginx config template in ``tpsl_flwr.engines.deployment``."""

FLEET_PREFIX = "/v1/fleet/"
"""The only path prefix the proxy forwards (Flower 1.42's Fleet API router)."""

BYPASS_ENV = ("FLWR_INTERNAL_GRPC_CONTROL_API", "FLWR_INTERNAL_GRPC_FLEET_API")
"""Variables that make ``flower-superlink`` also start its legacy gRPC Control
and Fleet servers, on ``--control-api-address``/``--fleet-api-address``
(default ``0.0.0.0``), past the proxy: leave them out of its environment."""

_SBIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")
_PLACEHOLDERS = (
    "USER",
    "PREFIX",
    "LISTEN",
    "CERTFILE",
    "KEYFILE",
    "SUPERLINK_PORT",
    "UPSTREAM_CA",
    "UPSTREAM_NAME",
)


def find_nginx(search_path: str | None = None) -> str:
    """The ``nginx`` executable, or an error that says how to install it.

    Parameters
    ----------
    search_path : str | None
        ``os.pathsep``-separated folders to search; ``None``: ``$PATH`` plus
        the ``sbin`` folders (where Debian's package puts it).

    Returns
    -------
    str
        Path of the executable.

    Raises
    ------
    FlowerLaunchError
        If there is none: the secure deployment never falls back to exposing
        the SuperLink's Control API.
    """
    if search_path is None:
        search_path = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN_DIRS])
    found = shutil.which("nginx", path=search_path)
    if found is None:
        raise FlowerLaunchError(
            "nginx not found (searched "
            f"{search_path!r}); the secure deployment exposes only the Fleet API "
            "through an nginx proxy and will not start without it: "
            "apt-get install nginx"
        )
    return found


def _token(name: str, value: object) -> str:
    """``value`` as one bare nginx token; refuse what would change the config."""
    text = str(value)
    if not text or any(ch.isspace() or ch in "\"'\\;{}$#" for ch in text):
        raise ValueError(f"{name} cannot go into an nginx config, got {text!r}")
    return text


def render_config(
    *,
    prefix: Path,
    listen: str,
    superlink_port: int,
    certfile: Path,
    keyfile: Path,
    upstream_ca: Path,
    upstream_name: str = "localhost",
    user: str | None = None,
) -> str:
    """The nginx config from :data:`TEMPLATE`, with its placeholders filled.

    Parameters
    ----------
    prefix : Path
        Folder for the pid file, ``error.log``, ``access.log`` and nginx's
        temporary folders.
    listen : str
        ``host:port`` the SuperNodes connect to.
    superlink_port : int
        The SuperLink's ``--port`` on ``127.0.0.1``.
    certfile, keyfile : Path
        Certificate (signed by the CA the SuperNodes trust) and its key.
    upstream_ca : Path
        CA that signed the SuperLink's certificate (verified by the proxy).
    upstream_name : str
        Name in the SuperLink's certificate that the proxy checks.
    user : str | None
        User for nginx's worker processes (``user`` directive; only needed
        when nginx starts as root); ``None`` leaves the directive out.

    Returns
    -------
    str
        The config text.

    Raises
    ------
    ValueError
        If ``superlink_port`` is not a TCP port, or a value is empty or holds
        whitespace, a quote, ``;``, ``{``, ``}``, ``$`` or ``#``.
    """
    if not 0 < superlink_port < 65536:
        raise ValueError(f"superlink_port must be in 1..65535, got {superlink_port}")
    values = {
        "USER": "" if user is None else f"user {_token('user', user)};",
        "PREFIX": _token("prefix", Path(prefix)),
        "LISTEN": _token("listen", listen),
        "CERTFILE": _token("certfile", certfile),
        "KEYFILE": _token("keyfile", keyfile),
        "SUPERLINK_PORT": str(superlink_port),
        "UPSTREAM_CA": _token("upstream_ca", upstream_ca),
        "UPSTREAM_NAME": _token("upstream_name", upstream_name),
    }
    text = (
        resources.files("tpsl_flwr.engines.deployment")
        .joinpath(TEMPLATE)
        .read_text("utf-8")
    )
    for name in _PLACEHOLDERS:
        text = text.replace(f"@{name}@", values[name])
    return text


@dataclass
class FleetProxy:
    """nginx forwarding only the Fleet API of a SuperLink on 127.0.0.1.

    Parameters
    ----------
    superlink_port : int
        The SuperLink's ``--port`` (it runs with ``--host 127.0.0.1`` and TLS).
    certificates : LocalCertificates
        CA and server certificate: the proxy presents ``server_certfile``
        and verifies the SuperLink against ``ca_certfile``.
    prefix : Path
        Folder (created 0700) for ``nginx.conf``, the pid file, logs and temp
        folders.
    listen_port : int
        Port of the proxy; SuperNodes use ``--superlink`` :attr:`address`.
    listen_host : str
        Interface of the proxy (``127.0.0.1`` for loopback tests; a public
        interface in a real deployment).
    env : Mapping[str, str] | None
        Environment for nginx (e.g. with a launch marker); ``None``: inherit.

    Examples
    --------
    ::

        proxy = FleetProxy(link_port, certs, log_dir / "fleet-proxy", proxy_port)
        proxy.start()
        # flower-supernode --superlink {proxy.address} --root-certificates ca.crt
        proxy.stop()
    """

    superlink_port: int
    certificates: LocalCertificates
    prefix: Path
    listen_port: int
    listen_host: str = "127.0.0.1"
    env: Mapping[str, str] | None = None
    process: subprocess.Popen[Any] | None = field(default=None, init=False)

    @property
    def address(self) -> str:
        """``host:port`` the SuperNodes connect to."""
        return f"{self.listen_host}:{self.listen_port}"

    @property
    def config_path(self) -> Path:
        """The rendered ``nginx.conf``."""
        return Path(self.prefix) / "nginx.conf"

    def render(self) -> str:
        """The config of this proxy (:func:`render_config`)."""
        user = pwd.getpwuid(os.geteuid()).pw_name if os.geteuid() == 0 else None
        certs = self.certificates
        return render_config(
            prefix=Path(self.prefix).resolve(),
            listen=self.address,
            superlink_port=self.superlink_port,
            certfile=certs.server_certfile,
            keyfile=certs.server_keyfile,
            upstream_ca=certs.ca_certfile,
            user=user,
        )

    def start(self) -> None:
        """Write the config and start ``nginx -g 'daemon off;'``.

        Raises
        ------
        FlowerLaunchError
            If nginx is missing or the proxy is already started.
        """
        if self.process is not None:
            raise FlowerLaunchError("FleetProxy is already started")
        nginx = find_nginx()
        prefix = Path(self.prefix).resolve()
        make_private_dir(prefix, check=False)
        self.config_path.write_text(self.render(), encoding="utf-8")
        cmd = [nginx, "-p", str(prefix), "-c", str(self.config_path)]
        cmd += ["-e", str(prefix / "error.log"), "-g", "daemon off;"]
        with (prefix / "nginx.out").open("w", encoding="utf-8") as out:
            self.process = subprocess.Popen(
                cmd,
                env=None if self.env is None else dict(self.env),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def ready(self) -> bool:
        """Whether the proxy answers HTTPS (a 403 for ``/health``).

        Raises
        ------
        FlowerLaunchError
            If nginx has exited (its ``error.log`` says why).
        """
        if self.process is None:
            return False
        if self.process.poll() is not None:
            raise FlowerLaunchError(
                f"nginx exited with code {self.process.returncode}; see "
                f"{Path(self.prefix) / 'error.log'}"
            )
        context = ssl.create_default_context(cafile=str(self.certificates.ca_certfile))
        try:
            urllib.request.urlopen(
                f"https://{self.address}/health", timeout=0.5, context=context
            ).close()
        except urllib.error.HTTPError as err:
            return err.code == 403
        except OSError:
            return False
        raise FlowerLaunchError(f"the proxy at {self.address} forwarded /health")

    def stop(self, grace_s: float = 5.0) -> list[int]:
        """End nginx (master and workers) by PID; return the PIDs signalled.

        Parameters
        ----------
        grace_s : float
            Seconds between SIGTERM and SIGKILL.

        Returns
        -------
        list[int]
            Sorted PIDs signalled (empty if not running).
        """
        if self.process is None:
            return []
        # a fresh marker: only nginx and its workers, not the rest of a launch
        ended = terminate_launched(uuid.uuid4().hex, [self.process], grace_s)
        self.process = None
        return ended
