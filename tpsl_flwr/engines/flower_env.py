"""Flower's command line, offline: environment, executable, ports, run config.

The pieces both launchers (:mod:`~tpsl_flwr.engines.simulation`,
:mod:`~tpsl_flwr.engines.deployment.runtime`) hand to Flower's CLI: an environment
that runs Flower offline and quietly, the ``flwr`` executable of this
installation, free loopback ports, ``key=value`` options
(``--federation-config``, ``--node-config``) and the ``--run-config`` TOML
file, checked against the app's ``[tool.flwr.app.config]`` first.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomli_w

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]
from flwr.common.config import flatten_dict

from tpsl_flwr._util.private_files import FILE_MODE, write_atomic
from tpsl_flwr.errors import ConfigError

__all__ = [
    "check_run_config",
    "flwr_executable",
    "free_ports",
    "kv_option",
    "offline_flower_env",
    "write_run_config",
]


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


def flwr_executable() -> str:
    """Return the ``flwr`` CLI next to this interpreter, else ``"flwr"``."""
    candidate = Path(sys.executable).parent / "flwr"
    return str(candidate) if candidate.exists() else "flwr"


def free_ports(count: int) -> list[int]:
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


def kv_option(options: Mapping[str, object]) -> str:
    """Format ``options`` as ``"key=value key=value"`` for Flower's CLI.

    Parameters
    ----------
    options : Mapping[str, object]
        Option names and scalar values (bool, int, float, or a string
        without quotes or newlines).

    Returns
    -------
    str
        The value of ``--federation-config`` or ``--node-config``.

    Raises
    ------
    ValueError
        If a value cannot be written as a TOML scalar here.

    Examples
    --------
    >>> kv_option({"num-supernodes": 2, "backend": "ray", "verbose": True})
    'num-supernodes=2 backend="ray" verbose=true'
    """
    return " ".join(f"{key}={_toml_scalar(value)}" for key, value in options.items())


def check_run_config(app_dir: Path, run_config: Mapping[str, Any]) -> None:
    """Raise ``ConfigError`` for keys missing from ``[tool.flwr.app.config]``.

    Flower would otherwise accept the run and fail it on the SuperLink.
    """
    if not run_config:
        return
    known = set(flatten_dict(app_config(app_dir)))
    unknown = sorted(set(flatten_dict(dict(run_config))) - known)
    if unknown:
        raise ConfigError(
            f"run_config keys {unknown} are not in [tool.flwr.app.config] of "
            f"{app_dir / 'pyproject.toml'} (known: {sorted(known)})"
        )


def write_run_config(run_config: Mapping[str, Any], path: Path) -> list[str]:
    """Write ``run_config`` to ``path`` (TOML, 0600) and return the CLI arguments.

    Mode ``0600`` whatever the umask, as every log of a launch: it sits in
    the label party's folders and names them.
    """
    if not run_config:
        return []
    write_atomic(path, tomli_w.dumps(dict(run_config)), mode=FILE_MODE)
    return ["--run-config", str(path)]


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file as a dict (``tomllib``, or ``tomli`` on Python 3.10)."""
    with Path(path).open("rb") as handle:
        return tomllib.load(handle)


def app_config(app_dir: Path) -> dict[str, Any]:
    """The app's ``[tool.flwr.app.config]`` defaults: the one reader of them.

    Raises
    ------
    ConfigError
        If the folder has no ``pyproject.toml`` or it has no such table.
    """
    path = Path(app_dir) / "pyproject.toml"
    if not path.is_file():
        raise ConfigError(
            f"{Path(app_dir).resolve()} is not a Flower app folder: it has no "
            "pyproject.toml with a [tool.flwr.app] table"
        )
    try:
        return dict(read_toml(path)["tool"]["flwr"]["app"]["config"])
    except KeyError:
        raise ConfigError(f"{path} has no [tool.flwr.app.config]") from None
