"""Whether an installed app bundle (FAB) may run warm in this interpreter.

A warm load runs the package this process imported, not the FAB's copy
(Flower's ``load_app`` takes a module from ``sys.modules`` when it is there:
``flwr/supercore/object_ref.py``). So a FAB may run warm only when (1) its
``[tool.flwr.app.components] clientapp`` is on the executor's allow-list and
(2) the code it ships is the code imported here: every file of the FAB under
the app's top-level package equals, byte for byte, the imported copy, and no
Python module of the imported package is missing from the FAB (it could be
imported by the app and is not what the FAB ships). Anything else runs in a
stock ``flwr-clientapp`` process, as Flower runs it.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import sys
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from tpsl_flwr.engines.executor.flower_seam import (
    build_fab_from_disk,
    get_flwr_home,
    get_project_config,
    install_from_fab,
)

__all__ = [
    "DEFAULT_WARM_APP",
    "WarmVerdict",
    "code_difference",
    "find_installed",
    "install_bundle",
    "judge_fab",
    "judge_fab_bytes",
    "package_digest",
]

DEFAULT_WARM_APP = "tpsl_flwr.simulations.client_app:app"
"""The project's ClientApp (the FAB's ``clientapp``), warm by default."""
APPS_DIR = "apps"
"""Where Flower installs FABs under ``FLWR_HOME`` (``flwr/common/config.py``)."""
_HASH_PREFIX = 8
"""Characters of the FAB hash in an installed app's folder name."""


@dataclass(frozen=True)
class WarmVerdict:
    """Whether a FAB runs warm, and why not when it does not."""

    app_ref: str | None
    """The FAB's ClientApp reference (``module:attribute``), if read."""
    reason: str | None
    """``None``: it runs warm; else one line saying why not."""

    @property
    def warm(self) -> bool:
        """Whether the FAB's ClientApp may run in this process."""
        return self.reason is None


def find_installed(fab_hash: str, flwr_home: Path | None = None) -> Path | None:
    """The folder Flower installed the FAB ``fab_hash`` in, if exactly one.

    Flower names it ``<publisher>.<name>.<version>.<hash[:8]>`` under
    ``$FLWR_HOME/apps`` (``flwr.common.config.get_project_dir``).
    """
    home = Path(get_flwr_home() if flwr_home is None else flwr_home)
    found = sorted((home / APPS_DIR).glob(f"*.{fab_hash[:_HASH_PREFIX]}"))
    found = [path for path in found if path.is_dir()]
    return found[0] if len(found) == 1 else None


def install_bundle(app_dir: Path, flwr_home: Path) -> str:
    """Install the bundle ``flwr run APP_DIR`` ships, as ``flwr-clientapp`` would.

    Flower builds a FAB deterministically from the app's files
    (``flwr.cli.build.build_fab_from_disk``, fixed zip dates), so the bytes
    built here are the bytes ``flwr run`` sends, with the same hash. Installed
    in the SuperNodes' ``FLWR_HOME`` before the run (Flower's own
    ``install_from_fab``, which keeps an existing install of that hash, as
    ``flwr-clientapp`` does), the executor finds and judges the bundle when the
    run's first task arrives, so the first message runs warm too instead of in
    a stock ``flwr-clientapp`` process (tens of seconds on a loaded machine).
    A bundle that turns out different (another hash) is simply not found, and
    its first task runs stock as before.

    Parameters
    ----------
    app_dir
        The app folder ``flwr run`` is given.
    flwr_home
        The SuperNodes' ``FLWR_HOME``.

    Returns
    -------
    str
        The bundle's SHA-256 (its FAB hash).
    """
    fab = build_fab_from_disk(Path(app_dir))
    install_from_fab(fab, install_dir=Path(flwr_home), skip_prompt=True)
    return hashlib.sha256(fab).hexdigest()


def _package_root(module: str) -> Path:
    """The folder of ``module``'s top-level package as imported here."""
    top = importlib.import_module(module.split(".")[0])
    if getattr(top, "__file__", None) is None:
        raise ImportError(f"{top.__name__} has no file (a namespace package)")
    return Path(str(top.__file__)).resolve().parent


def _files(root: Path, suffixes: Iterable[str] | None = None) -> dict[str, Path]:
    wanted = None if suffixes is None else tuple(suffixes)
    return {
        path.relative_to(root).as_posix(): path
        for path in sorted(root.rglob("*"))
        if path.is_file()
        and "__pycache__" not in path.parts
        and (wanted is None or path.name.endswith(wanted))
    }


def package_digest(module: str) -> dict[str, str]:
    """SHA-256 of every file of ``module``'s top-level package, as it is now.

    Taken when the executor starts (after it imported the warm apps): a bundle
    is then compared with the code this process loaded, not with whatever the
    folder holds later (an upgrade in place would otherwise pass).
    """
    return {
        name: hashlib.sha256(path.read_bytes()).hexdigest()
        for name, path in _files(_package_root(module)).items()
    }


def code_difference(
    app_dir: Path, module: str, imported: Mapping[str, str] | None = None
) -> str | None:
    """The first file where the FAB in ``app_dir`` and the imported code differ.

    Parameters
    ----------
    app_dir
        The installed FAB (its ``pyproject.toml`` and packages).
    module
        The ClientApp's module; its top-level package is compared.
    imported
        :func:`package_digest` of that package when this process imported it;
        ``None``: the package's files as they are now.

    Returns
    -------
    str | None
        ``None`` when they agree; else one line naming the file.
    """
    top = module.split(".")[0]
    shipped = app_dir / top
    theirs = {
        name: hashlib.sha256(path.read_bytes()).hexdigest()
        for name, path in (_files(shipped).items() if shipped.is_dir() else ())
    }
    return _difference(theirs, module, imported)


def _difference(
    theirs: Mapping[str, str], module: str, imported: Mapping[str, str] | None
) -> str | None:
    """The first file where a bundle's package (name -> SHA-256) and ours differ."""
    top = module.split(".")[0]
    try:
        ours = package_digest(module) if imported is None else dict(imported)
    except ImportError as err:
        return f"{top} does not import here ({err})"
    if not theirs:
        return f"the FAB has no {top}/ package"
    for name, digest in theirs.items():
        if name not in ours:
            return f"{top}/{name} is in the FAB, not in the imported package"
        if digest != ours[name]:
            return f"{top}/{name} differs from the imported copy"
    for name in ours:
        if name.endswith(".py") and name not in theirs:
            return f"{top}/{name} is imported here but not in the FAB"
    return None


def judge_fab(
    app_dir: Path,
    allowed: Iterable[str],
    imported: Mapping[str, Mapping[str, str]] | None = None,
) -> WarmVerdict:
    """Whether the installed FAB in ``app_dir`` may run warm here.

    Parameters
    ----------
    app_dir
        An installed FAB (:func:`find_installed`).
    allowed
        The ClientApp references allowed warm (``--warm-app``).
    imported
        :func:`package_digest` of each allowed reference's package, taken at
        start; ``None`` (or a reference missing): its files as they are now.

    Returns
    -------
    WarmVerdict
        Warm, or the reason it is not: the ClientApp is not allow-listed, its
        code differs from the imported copy, or its ``pyproject.toml`` does
        not name one.
    """
    try:
        config = get_project_config(app_dir)
        ref = str(config["tool"]["flwr"]["app"]["components"]["clientapp"])
    except (OSError, KeyError, ValueError, TypeError) as err:
        why = " ".join(str(err).split())  # one line
        return WarmVerdict(None, f"no ClientApp reference in {app_dir} ({why})")
    return _verdict(
        ref,
        allowed,
        imported,
        lambda module, digest: code_difference(app_dir, module, digest),
    )


def _verdict(
    ref: str,
    allowed: Iterable[str],
    imported: Mapping[str, Mapping[str, str]] | None,
    difference: Callable[[str, Mapping[str, str] | None], str | None],
) -> WarmVerdict:
    """Warm when ``ref`` is allow-listed and ``difference`` finds no file apart."""
    allowed = list(allowed)
    if ref not in allowed:
        return WarmVerdict(ref, f"ClientApp {ref!r} is not in --warm-app {allowed}")
    digest = None if imported is None else imported.get(ref)
    differs = difference(ref.partition(":")[0], digest)
    if differs is not None:
        return WarmVerdict(ref, f"the FAB's code is not the imported code: {differs}")
    return WarmVerdict(ref, None)


def judge_fab_bytes(
    content: bytes,
    allowed: Iterable[str],
    imported: Mapping[str, Mapping[str, str]] | None = None,
) -> WarmVerdict:
    """:func:`judge_fab` on the bundle's own bytes (the FAB a task brought).

    The installed folder is found by the first 8 hex digits of a hash only
    (Flower's naming), so a task's bundle is judged from the folder when it
    arrives and confirmed here, from the bytes pulled with the task, before
    its ClientApp runs warm: the same allow-list and the same byte-for-byte
    comparison with the imported code.

    Parameters
    ----------
    content
        The FAB (a zip: ``pyproject.toml``, the packages, ``.info/``).
    allowed, imported
        As :func:`judge_fab`.

    Returns
    -------
    WarmVerdict
        Warm, or one line saying why not.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as fab:
            files = {
                info.filename: fab.read(info)
                for info in fab.infolist()
                if not info.is_dir() and not info.filename.startswith(".info/")
            }
        config = tomllib.loads(files["pyproject.toml"].decode("utf-8"))
        ref = str(config["tool"]["flwr"]["app"]["components"]["clientapp"])
    except (zipfile.BadZipFile, KeyError, ValueError, TypeError) as err:
        why = " ".join(str(err).split())
        return WarmVerdict(None, f"no ClientApp reference in the bundle ({why})")
    prefix = f"{ref.partition(':')[0].split('.')[0]}/"
    theirs = {
        name[len(prefix) :]: hashlib.sha256(data).hexdigest()
        for name, data in sorted(files.items())
        if name.startswith(prefix) and "__pycache__" not in name.split("/")
    }
    return _verdict(
        ref,
        allowed,
        imported,
        lambda module, digest: _difference(theirs, module, digest),
    )


def imported_root(ref: str) -> Path:
    """The folder holding ``ref``'s top-level package (for Flower's ``load_app``)."""
    return _package_root(ref.partition(":")[0]).parent


def preload(refs: Iterable[str]) -> None:
    """Import each allow-listed ClientApp now, before any task.

    An app that imports its handlers lazily (the project's
    ``ForwardingClientApp``, whose ``local_app()`` imports torch and the
    party's code) has them imported too.
    """
    for ref in refs:
        module, _, attribute = ref.partition(":")
        app: object = importlib.import_module(module)
        for name in attribute.split("."):
            app = getattr(app, name)
        local = getattr(app, "local_app", None)
        if callable(local):
            local()
