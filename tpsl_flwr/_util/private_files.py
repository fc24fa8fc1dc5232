"""Files only their owner may read or write, as ssh keeps its keys.

The label party's folder holds the secret noise key, its checkpoints and, when
asked, the training labels. Each is written atomically with mode ``0600`` in a
folder of mode ``0700``; reading refuses a file (or folder) that another user
owns or that group or others may read or write, because such a file may have
been read (the key is then no secret) or planted (a checkpoint is code-free
here, but a planted key would make the noise known to whoever planted it).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tpsl_flwr.errors import PrivacyError

__all__ = [
    "check_private",
    "check_private_parents",
    "make_private_dir",
    "read_private",
    "write_private",
]

DIR_MODE = 0o700
FILE_MODE = 0o600


def make_private_dir(path: str | Path) -> Path:
    """Create ``path`` (and parents) with mode ``0700``; check an existing one.

    Raises
    ------
    PrivacyError
        If the folder exists but another user owns it or group/others may use it.
    """
    folder = Path(path)
    if not folder.exists():
        folder.mkdir(parents=True, mode=DIR_MODE)
        os.chmod(folder, DIR_MODE)  # mkdir's mode is filtered by the umask
    check_private(folder)
    return folder


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
