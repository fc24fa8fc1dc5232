"""The label party's decisions for its next run, kept in its own folder.

Never run config (the nodes receive that): a further release acknowledged,
a budget, an unprotected release allowed, a run counted as a release
whatever its engine (``new-release.json``, used up by the next fresh run),
and a launcher's mark that the run of its launch is a rehearsal
(``rehearsal.json``, taken by that run). :class:`~tpsl_flwr.release.store.LabelStore`
reads and writes them through these functions.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from tpsl_flwr._util.private_files import read_private, write_private
from tpsl_flwr.errors import ConfigError, PrivacyError

__all__ = [
    "ACK_FILE",
    "ACK_LIFETIME_S",
    "REHEARSAL_FILE",
    "REHEARSAL_LIFETIME_S",
    "acknowledge",
    "mark_rehearsal",
    "read_decisions",
    "take_rehearsal_mark",
]

ACK_FILE = "new-release.json"
ACK_LIFETIME_S = 24 * 3600.0
"""An acknowledgement older than this (or from the future) is dropped unused."""
REHEARSAL_FILE = "rehearsal.json"
REHEARSAL_LIFETIME_S = 600.0
"""A rehearsal mark older than this is no launcher's of the run now starting."""
_FLAGS = ("new_release", "unprotected", "release")


def acknowledge(
    folder: Path,
    budget: float | None,
    *,
    new_release: bool,
    unprotected: bool,
    release: bool,
) -> Path:
    """Write the decisions for the next fresh run in ``folder``.

    See :meth:`~tpsl_flwr.release.store.LabelStore.acknowledge_new_release`.
    """
    if budget is not None and not (budget > 0 and math.isfinite(budget)):
        raise ConfigError(f"budget must be > 0 and finite, got {budget}")
    record = {
        "new_release": bool(new_release),
        "budget": budget,
        "unprotected": bool(unprotected),
        "release": bool(release),
        "written": time.time(),
    }
    return write_private(folder / ACK_FILE, json.dumps(record).encode())


def read_decisions(folder: Path) -> dict[str, Any]:
    """The decisions for this run: ``budget`` and the flags (all off if none)."""
    none: dict[str, Any] = {"budget": None, **dict.fromkeys(_FLAGS, False)}
    path = folder / ACK_FILE
    if not path.exists():
        return none
    try:
        record = json.loads(read_private(path))
        budget = record.get("budget")
        if budget is not None and not isinstance(budget, (int, float)):
            raise ValueError(f"budget {budget!r}")
        if not 0 <= time.time() - float(record["written"]) <= ACK_LIFETIME_S:
            # A decision left for a run that never came: not this run's.
            path.unlink()
            return none
        return {
            "budget": budget,
            "new_release": bool(record["new_release"]),
            "unprotected": bool(record.get("unprotected", False)),
            "release": bool(record.get("release", False)),
        }
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise PrivacyError(f"{path} is not an acknowledgement: {err}") from None


def mark_rehearsal(folder: Path, launch: str) -> Path:
    """Mark the run of launch ``launch`` a rehearsal.

    See :meth:`~tpsl_flwr.release.store.LabelStore.mark_rehearsal`.
    """
    if not launch:
        raise ConfigError("a rehearsal mark needs the launch id of its run")
    record = {"written": time.time(), "launch": launch}
    return write_private(folder / REHEARSAL_FILE, json.dumps(record).encode())


def take_rehearsal_mark(folder: Path, launch: str | None) -> bool:
    """Whether a fresh mark for launch ``launch`` was in ``folder``.

    ``launch``: the launch id this process inherited (None: none). A mark is
    removed when it is read, whoever's it was.
    """
    path = folder / REHEARSAL_FILE
    if not path.exists():
        return False
    try:
        record = json.loads(read_private(path))
        written, marked = float(record["written"]), str(record["launch"])
    except (ValueError, KeyError, TypeError) as err:
        raise PrivacyError(f"{path} is not a rehearsal mark: {err}") from None
    finally:
        path.unlink(missing_ok=True)
    fresh = 0 <= time.time() - written <= REHEARSAL_LIFETIME_S
    return fresh and launch is not None and marked == launch
