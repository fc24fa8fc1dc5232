"""What a Flower app bundle (FAB) built here holds: the app's code, nothing else.

``flwr run <folder>`` packs every ``*.py``, ``*.toml``, ``*.md``, ``*.json``,
``*.jsonl``, ``*.yaml``/``*.yml`` file of the folder that its ``.gitignore`` does
not exclude (``flwr/cli/build.py``, ``build_fab_from_disk``), and every SuperNode
installs the bundle. Run from the source tree's root, that took whatever lay
there: a sweep's ``runs/*/label-party/noise-key.json`` (the label party's secret
noise key: with it a node subtracts the noise and reads every label), its
results and reports.

So :func:`staged_app` builds the folder ``flwr run`` is given: a fresh private
temporary folder (``0700``, removed afterwards) holding only the app's
``pyproject.toml`` and the top-level modules and packages its
``[tool.flwr.app.components]`` name (:func:`bundle_files`); and it refuses,
before anything is sent, a file named like one of the project's private outputs
(:data:`PRIVATE_NAMES`). Everything else that reads the app's folder (its
``[tool.flwr.app.config]``) keeps reading the original.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath
from typing import Any

from tpsl_flwr.engines.flower_env import read_toml
from tpsl_flwr.errors import ConfigError, PrivacyError

__all__ = [
    "PRIVATE_NAMES",
    "bundle_files",
    "check_bundle",
    "check_installed_app",
    "staged_app",
]

PRIVATE_NAMES = (
    "label-party",  # the label party's folder (LABEL_DIR): key, checkpoints, labels
    "noise-key.json",  # its secret noise key (label_store.KEY_FILE)
    "checkpoint.pt",  # its checkpoint (label_store.CHECKPOINT_FILE)
    "new-release.json",  # its acknowledgement of a new release (ACK_FILE)
    "evaluation-train-labels.npy",  # clean labels kept for evaluation
    "secret.key",  # the privacy ledger's key (ledger.SECRET_FILE)
    "*.jsonl",  # the ledger's entries, one file per label set
    "results.json",  # a run's results and reports (run_folder.RUN_ENTRIES)
    "report.md",
    "report.png",
    "summary-public.json",
    "*.previous.*",  # the same, retired by a resume
    "FAILED",
    "flwr-run.log",
    "superlink.log",
    "run-config.toml",
    "checkpoints",  # the nodes' checkpoints, under out-dir
)
"""Names (``fnmatch`` patterns) of the project's private outputs and run folders.

A file whose name, or the name of a folder above it in the app, matches one
is never bundled: :func:`check_bundle` refuses it."""

_BUNDLED_SUFFIXES = (".py", ".toml", ".md", ".json", ".jsonl", ".yaml", ".yml")
"""Suffixes Flower 1.42 packs (``flwr.common.constant.FAB_INCLUDE_PATTERNS``)."""
_CONFIG_FILE = "pyproject.toml"


def _component_roots(app_dir: Path, config: Mapping[str, Any]) -> list[str]:
    """The top-level module or package of each component, as paths in the app."""
    try:
        components = config["tool"]["flwr"]["app"]["components"]
    except (KeyError, TypeError):
        raise ConfigError(
            f"{app_dir / _CONFIG_FILE} has no [tool.flwr.app.components]"
        ) from None
    roots = []
    for key, ref in dict(components).items():
        top = str(ref).split(":", 1)[0].split(".", 1)[0]
        if not top.isidentifier():
            raise ConfigError(
                f"component {key} = {ref!r} of {app_dir / _CONFIG_FILE} does not "
                "name a module ('package.module:attribute')"
            )
        if (app_dir / top).is_dir():
            roots.append(top)
        elif (app_dir / f"{top}.py").is_file():
            roots.append(f"{top}.py")
        elif importlib.util.find_spec(top) is None:
            raise ConfigError(
                f"component {key} = {ref!r} of {app_dir / _CONFIG_FILE}: neither "
                f"{app_dir / top}/ nor {app_dir / top}.py exists, and no installed "
                f"module {top!r} either"
            )
        # else: an installed package (this plugin, say), loaded from the
        # environment on every machine, not shipped in the bundle.
    return sorted(set(roots))


def _package_data(config: Mapping[str, Any], root: str) -> dict[str, list[str]]:
    """``[tool.setuptools.package-data]`` of the packages under ``root``."""
    tool = config.get("tool", {})
    setuptools = tool.get("setuptools", {}) if isinstance(tool, dict) else {}
    data = setuptools.get("package-data", {}) if isinstance(setuptools, dict) else {}
    return {
        package.replace(".", "/"): list(patterns)
        for package, patterns in dict(data).items()
        if package == root or package.startswith(f"{root}.")
    }


def _walk(app_dir: Path, root: str, data: Mapping[str, list[str]]) -> Iterator[str]:
    """Files of the package ``root`` that Flower packs, or its package data."""
    for folder, dirs, names in os.walk(app_dir / root):  # symlinks not followed
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and d[0] != ".")
        here = Path(folder).relative_to(app_dir)
        for name in sorted(names):
            path = here / name
            if name[0] == "." or (app_dir / path).is_symlink():
                continue
            declared = any(
                PurePosixPath(path.as_posix()).match(f"{package}/{pattern}")
                for package, patterns in data.items()
                for pattern in patterns
            )
            if name.endswith(_BUNDLED_SUFFIXES) or declared:
                yield path.as_posix()


def bundle_files(app_dir: str | Path) -> dict[str, Path]:
    """The files a bundle of the app at ``app_dir`` holds, by path in the app.

    ``pyproject.toml``, then each top-level module or package that
    ``[tool.flwr.app.components]`` names: a module's file; a package's files
    that Flower packs (``*.py``, ``*.toml``, ``*.md``, ``*.json``, ``*.jsonl``,
    ``*.yaml``, ``*.yml``) and its declared package data
    (``[tool.setuptools.package-data]``), without ``__pycache__``, hidden
    files and folders, or symbolic links. Nothing else of the folder (run
    folders, data, tests, docs) is bundled.

    Parameters
    ----------
    app_dir
        The app's folder (holding its ``pyproject.toml``).

    Returns
    -------
    dict[str, Path]
        POSIX path in the app -> the file on disk, sorted by path.

    Raises
    ------
    ConfigError
        If the folder has no ``pyproject.toml``, or a component names no
        module or package in the folder.
    """
    app = Path(app_dir).resolve()
    if not (app / _CONFIG_FILE).is_file():
        raise ConfigError(f"{app} is not a Flower app folder: it has no {_CONFIG_FILE}")
    config = read_toml(app / _CONFIG_FILE)
    files = {_CONFIG_FILE: app / _CONFIG_FILE}
    for root in _component_roots(app, config):
        if root.endswith(".py"):
            files[root] = app / root
            continue
        data = _package_data(config, root)
        files.update({rel: app / rel for rel in _walk(app, root, data)})
    return dict(sorted(files.items()))


def check_bundle(files: Mapping[str, Path]) -> None:
    """Refuse a bundle holding a file named like a private output.

    Parameters
    ----------
    files
        Path in the app -> file on disk, as :func:`bundle_files` returns.

    Raises
    ------
    PrivacyError
        Naming the first such file and the name it matches
        (:data:`PRIVATE_NAMES`).

    Examples
    --------
    >>> from pathlib import Path
    >>> check_bundle({"app/task.py": Path("app/task.py")})
    >>> leak = "app/runs/label-party/x.py"
    >>> check_bundle({leak: Path("/a", leak)})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tpsl_flwr.errors.PrivacyError: /a/app/runs/label-party/x.py would be sent to ...
    """
    for rel, path in files.items():
        for part in PurePosixPath(rel).parts:
            name = next((p for p in PRIVATE_NAMES if fnmatchcase(part, p)), None)
            if name is not None:
                raise PrivacyError(
                    f"{path} would be sent to every SuperNode in the Flower app "
                    f"bundle, but {part!r} names a private output of this "
                    "project; move it out of the app's packages"
                )


def check_installed_app() -> None:
    """Refuse to start if the bundle Flower installed for this app is not code only.

    A plain ``flwr run .`` (not through the project's launchers, which stage
    the app: :func:`staged_app`) packs the whole folder, run folders and keys
    included. The ServerApp calls this before its first message: Flower puts
    the installed bundle (``$FLWR_HOME/apps/...``) on ``sys.path``, and the
    SuperNodes fetch it only with their first message, so a refusal here
    ships nothing. A ServerApp not started from an installed bundle (the
    in-process engine) has nothing to check.

    Raises
    ------
    PrivacyError
        As :func:`check_bundle`, naming the file.
    """
    from flwr.common.config import get_flwr_home

    installed = (get_flwr_home() / "apps").resolve()
    for entry in dict.fromkeys(sys.path):
        folder = Path(entry or ".").resolve()
        if installed in folder.parents and folder.is_dir():
            check_bundle(
                {
                    path.relative_to(folder).as_posix(): path
                    for path in sorted(folder.rglob("*"))
                    if path.is_file()
                }
            )


@contextmanager
def staged_app(app_dir: str | Path) -> Iterator[Path]:
    """A private copy of the app holding only :func:`bundle_files`; give it to Flower.

    The copy is a fresh temporary folder (mode ``0700``), removed on exit.

    Parameters
    ----------
    app_dir
        The app's folder.

    Yields
    ------
    Path
        The staged folder, for ``flwr run``.

    Raises
    ------
    PrivacyError
        If a bundled file is named like a private output (:func:`check_bundle`),
        before anything is copied.
    ConfigError
        As :func:`bundle_files`.
    """
    files = bundle_files(app_dir)
    check_bundle(files)
    staged = Path(tempfile.mkdtemp(prefix="tpsl-flwr-app-"))  # 0700
    try:
        for rel, source in files.items():
            target = staged / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        yield staged
    finally:
        shutil.rmtree(staged, ignore_errors=True)
