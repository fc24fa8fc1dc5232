"""Files only their owner may read or write, as ssh keeps its keys.

The label party's folder holds the secret noise key, its checkpoints and, when
asked, the training labels. Each is written atomically with mode ``0600`` in a
folder of mode ``0700``; reading refuses a file (or folder) that another user
owns or that group or others may read or write, because such a file may have
been read (the key is then no secret) or planted (a checkpoint is code-free
here, but a planted key would make the noise known to whoever planted it).

Every owner-only file of the package is made here: whole files through
:func:`write_private` or :func:`write_atomic` (``mode=FILE_MODE``), logs and
locks a process keeps open through :func:`open_private`, folders through
:func:`make_private_dir`, and a file another step made through
:func:`keep_private` (a test checks that no other module sets these modes by
hand).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tpsl_flwr.errors import PrivacyError

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "PUBLIC_MODE",
    "check_private",
    "check_private_parents",
    "keep_private",
    "make_private_dir",
    "open_private",
    "private_folder",
    "read_private",
    "write_atomic",
    "write_private",
]

DIR_MODE = 0o700
"""A folder only its owner may enter."""
FILE_MODE = 0o600
"""A file only its owner may read or write."""
PUBLIC_MODE = 0o644
"""A file anyone may read (text built from an allow-list only)."""

_OPEN_FLAGS = {
    "new": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
    "replace": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "lock": os.O_RDWR | os.O_CREAT,
}


def make_private_dir(path: str | Path, *, check: bool = True) -> Path:
    """Create ``path`` (and parents) with mode ``0700``; check an existing one.

    ``check=False``: an existing folder is taken as it is (a scratch folder
    this process made earlier, say).

    Raises
    ------
    PrivacyError
        If the folder exists but another user owns it or group/others may use it.
    """
    folder = Path(path)
    if not folder.exists():
        folder.mkdir(parents=True, mode=DIR_MODE)
        os.chmod(folder, DIR_MODE)  # mkdir's mode is filtered by the umask
    if check:
        check_private(folder)
    return folder


def open_private(path: str | Path, how: str = "replace") -> int:
    """A descriptor for writing ``path``; a file it creates or replaces is ``0600``.

    For what a process keeps open (a log, a lock); whole files go through
    :func:`write_private` or :func:`write_atomic`.

    Parameters
    ----------
    path
        The file.
    how
        ``"new"``: refuse an existing file (``FileExistsError``);
        ``"replace"``: truncate one (and take group/other access off it: an
        earlier run's log may have been written under a looser umask);
        ``"lock"``: read and write, keep its content.

    Examples
    --------
    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "run.log"
    >>> os.close(open_private(path, "new"))
    >>> oct(path.stat().st_mode & 0o777)
    '0o600'
    """
    fd = os.open(path, _OPEN_FLAGS[how], FILE_MODE)
    if how == "replace":
        os.fchmod(fd, FILE_MODE)
    return fd


def private_folder(path: str | Path) -> Path:
    """Create ``path`` (mode ``0700``) or take group/other access off it.

    The run's out-dir is the label party's: its results hold clean-label
    statistics. A folder this user owns is tightened to ``0700``; one another
    user owns is refused.

    Raises
    ------
    PrivacyError
        If the folder is a symbolic link or another user owns it.
    """
    folder = Path(path).resolve()
    folder.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    info = folder.stat()
    own = not hasattr(os, "getuid") or info.st_uid == os.getuid()
    if own and stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(folder, DIR_MODE)
    check_private(folder)
    return folder


def keep_private(path: str | Path) -> Path:
    """Set a file this user just made (a socket, a cache file) to mode ``0600``."""
    os.chmod(path, FILE_MODE)
    return Path(path)


def write_atomic(
    path: str | Path, data: str | bytes, *, mode: int | None = None
) -> Path:
    """Write ``data`` to ``path`` through a temporary file renamed over it.

    A reader sees the old file or the whole new one, never a part.

    Parameters
    ----------
    path
        The file.
    data
        Its new content (text as UTF-8).
    mode
        The file's mode (:data:`FILE_MODE`: the owner's alone;
        :data:`PUBLIC_MODE`: anyone may read it), whatever the umask. ``None``
        (default): the mode of the file it replaces, so rewriting a private
        ``results.json`` keeps it private; a new file gets the umask's.
    """
    target = Path(path)
    if mode is None and target.exists():
        mode = stat.S_IMODE(target.stat().st_mode)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    created = FILE_MODE if mode is not None else 0o666  # 0o666: less the umask
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, created)
    try:
        with os.fdopen(fd, "wb") as handle:
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def check_private(path: str | Path) -> None:
    """Raise unless ``path`` is owned by this user with no group/other access.

    Raises
    ------
    PrivacyError
        Naming the path, its mode and what is wrong with it.
    """
    p = Path(path)
    info = p.lstat()
    if stat.S_ISLNK(info.st_mode):
        raise PrivacyError(
            f"{p} is a symbolic link; the label party's files must not be"
        )
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise PrivacyError(
            f"{p} is owned by uid {info.st_uid}, not this user ({os.getuid()}); "
            "the label party refuses files others own"
        )
    loose = stat.S_IMODE(info.st_mode) & 0o077
    if loose:
        raise PrivacyError(
            f"{p} has mode {stat.S_IMODE(info.st_mode):04o}: group or others may "
            f"access it; the label party's files must be private (chmod "
            f"{DIR_MODE if p.is_dir() else FILE_MODE:o} {p})"
        )


def check_private_parents(path: str | Path) -> None:
    """Raise unless no other user can replace ``path`` through a parent folder.

    As ssh's ``StrictModes`` checks a home folder: a folder that another
    user owns, or that group or others may write to without the sticky bit
    (``/tmp`` has it), lets them rename ``path`` away and put their own in
    its place (an empty ledger, say). Folders owned by root are trusted.

    Raises
    ------
    PrivacyError
        Naming the first such parent folder, its owner and mode.
    """
    me = os.getuid() if hasattr(os, "getuid") else 0
    for parent in Path(os.path.abspath(path)).parents:
        try:
            info = parent.stat()
        except FileNotFoundError:
            continue
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid not in (0, me):
            raise PrivacyError(
                f"{parent}, a parent of {path}, is owned by uid {info.st_uid}: "
                "its owner could replace the folder; choose a folder of your own"
            )
        if mode & 0o022 and not mode & stat.S_ISVTX:
            raise PrivacyError(
                f"{parent}, a parent of {path}, has mode {mode:04o}: group or "
                "others may write to it and replace the folder (chmod go-w "
                f"{parent}, or choose another folder)"
            )


def write_private(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically with mode ``0600``.

    The parent folder is created (``0700``) or checked; the bytes go to a
    temporary file in the same folder that is renamed over ``path``, so a
    crash never leaves a half-written file under the final name.
    """
    target = Path(path)
    make_private_dir(target.parent)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, target)
    return target


def read_private(path: str | Path) -> bytes:
    """Read a file after checking it and its folder are private.

    Raises
    ------
    PrivacyError
        If the file or its folder is not private (see :func:`check_private`).
    FileNotFoundError
        If the file does not exist.
    """
    p = Path(path)
    check_private(p.parent)
    check_private(p)
    return p.read_bytes()
