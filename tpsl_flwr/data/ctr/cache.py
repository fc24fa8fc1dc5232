"""On-disk cache of encoded CTR arrays: ``.npy`` files written chunk by chunk.

An encoded file is a folder of ``.npy`` arrays (one row per data row) and a
``meta.json``. The arrays are appended to while the source is read, so memory
stays bounded by one chunk; each ``.npy`` header reserves room for the final
shape and is rewritten once the row count is known (the NumPy format: magic,
version 1.0, a little-endian header length, a Python-literal dict padded with
spaces to a multiple of 64 bytes). The folder is built under a temporary name and
renamed into place, so a crashed or concurrent load never leaves a half-written
entry where a reader looks. Reading maps the arrays (``mmap_mode="r"``): a second
load of the same file starts at once.

The entry's name is a hash of the source's resolved path, size and modification
time and of every parameter that changes the encoding; an edited or replaced
file, or a new parameter, misses the cache instead of reading stale arrays.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from tpsl_flwr._util.private_files import check_private, keep_private
from tpsl_flwr.errors import PrivacyError

__all__ = [
    "CacheEntry",
    "NpyAppender",
    "cache_key",
    "check_trusted",
    "missing_folders",
    "open_entry",
    "remove_if_empty",
]

CACHE_VERSION = 2
"""Bump when the encoding changes: older entries are then ignored."""
_HEADER_BYTES = 128
_MAGIC = b"\x93NUMPY\x01\x00"


def cache_key(path: Path, params: Mapping[str, Any]) -> str:
    """Hex digest naming the cache entry of ``path`` encoded with ``params``.

    Parameters
    ----------
    path : Path
        The source file (must exist).
    params : mapping
        JSON-serialisable parameters of the encoding.

    Returns
    -------
    str
        32 hex digits.
    """
    st = path.stat()
    blob = json.dumps(
        {
            "version": CACHE_VERSION,
            "path": str(path.resolve()),
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "params": dict(params),
        },
        sort_keys=True,
    )
    return hashlib.blake2b(blob.encode("utf-8"), digest_size=16).hexdigest()


class NpyAppender:
    """A 2-d (or 1-d) ``.npy`` file grown by appending row blocks.

    Parameters
    ----------
    path : Path
        File to create.
    dtype : numpy dtype
        Element type.
    width : int or None
        Columns per row; None for a 1-d array.
    """

    def __init__(self, path: Path, dtype: np.dtype | type, width: int | None) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self.width = width
        self.rows = 0
        self._file: BinaryIO = path.open("wb")
        self._file.write(b"\0" * _HEADER_BYTES)

    def append(self, block: np.ndarray) -> None:
        """Append rows (``(k, width)`` or ``(k,)``, cast to the file's dtype)."""
        arr = np.ascontiguousarray(block, dtype=self.dtype)
        if arr.size:
            self._file.write(arr.data)  # the array's own buffer: no copy
        self.rows += arr.shape[0]

    def close(self) -> None:
        """Write the final header and close the file."""
        shape = (self.rows,) if self.width is None else (self.rows, self.width)
        text = repr(
            {
                "descr": np.lib.format.dtype_to_descr(self.dtype),
                "fortran_order": False,
                "shape": shape,
            }
        )
        room = _HEADER_BYTES - len(_MAGIC) - 2
        body = text.encode("latin1").ljust(room - 1) + b"\n"
        if len(body) != room:
            raise RuntimeError(f"npy header too long for {shape}")
        self._file.seek(0)
        self._file.write(_MAGIC + struct.pack("<H", room) + body)
        self._file.close()


class CacheEntry:
    """A cache entry being written: a temporary folder renamed into place.

    Parameters
    ----------
    final : Path
        Where the entry lives once committed.
    """

    def __init__(self, final: Path) -> None:
        self.final = final
        final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(
            tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
        )

    def appender(
        self, name: str, dtype: np.dtype | type, width: int | None
    ) -> NpyAppender:
        """A new ``name.npy`` inside the entry."""
        return NpyAppender(self.tmp / f"{name}.npy", dtype, width)

    def commit(self, meta: Mapping[str, Any]) -> Path:
        """Write ``meta.json`` and move the folder into place; return its path.

        The folder is ``0700`` (``mkdtemp``) and every file ``0600``: a label
        party's entry holds its labels and positive count, its own alone.
        """
        (self.tmp / "meta.json").write_text(json.dumps(dict(meta), sort_keys=True))
        for item in self.tmp.iterdir():
            keep_private(item)
        try:
            os.rename(self.tmp, self.final)
        except OSError:
            # Another process committed the same entry first: keep theirs.
            shutil.rmtree(self.tmp, ignore_errors=True)
        return self.final

    def discard(self) -> None:
        """Remove the unfinished folder."""
        shutil.rmtree(self.tmp, ignore_errors=True)


def open_entry(
    folder: Path, names: tuple[str, ...]
) -> tuple[dict[str, np.ndarray], dict]:
    """Map the arrays of a committed entry; ``({}, {})`` if absent or unreadable.

    Parameters
    ----------
    folder : Path
        The entry.
    names : tuple of str
        Arrays expected in it.

    Returns
    -------
    arrays : dict of str to np.ndarray
        Read-only memory maps, one per name.
    meta : dict
        The entry's ``meta.json``.

    Raises
    ------
    PrivacyError
        If the entry, or a file of it, is not this user's own with no
        group/other access (:func:`check_trusted`).
    """
    check_trusted(folder, names)
    try:
        meta = json.loads((folder / "meta.json").read_text())
        arrays = {n: np.load(folder / f"{n}.npy", mmap_mode="r") for n in names}
    except (OSError, ValueError):
        return {}, {}
    if meta.get("version") != CACHE_VERSION:
        return {}, {}
    rows = {a.shape[0] for a in arrays.values()}
    if rows != {meta.get("rows")}:
        return {}, {}
    return arrays, meta


def check_trusted(folder: Path, names: tuple[str, ...]) -> None:
    """Refuse an existing entry that another user owns or may write to.

    Every entry this module commits is ``0700`` with ``0600`` files
    (:meth:`CacheEntry.commit`). Anyone who can stat the source can name its
    entry (:func:`cache_key` hashes public facts), so an entry that is not
    private was not written by this user's loads: in a shared ``cache-dir``
    another local user could plant a label column (or feature columns) that
    would then be trained on. Refused rather than trusted or silently
    re-encoded (fail closed); an absent entry is a miss.

    Raises
    ------
    PrivacyError
        Naming the entry, what is wrong with it and the fix.
    """
    if not (folder.exists() or folder.is_symlink()):
        return
    files = [folder / "meta.json", *(folder / f"{n}.npy" for n in names)]
    try:
        for path in (folder, *(f for f in files if f.exists() or f.is_symlink())):
            check_private(path)
    except PrivacyError as exc:
        raise PrivacyError(
            f"the cache entry {folder} is not this user's own private entry "
            f"({exc}); it is not read. Remove it, or set cache-dir to a folder "
            "only you write to"
        ) from None


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its parents that do not exist yet, deepest first.

    What a load creates; :func:`remove_if_empty` takes them away again if the
    load fails, so no empty ``.tpsl-cache/`` is left beside the user's file.
    """
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def remove_if_empty(folders: list[Path]) -> None:
    """Remove the folders this load created, deepest first, while empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return
