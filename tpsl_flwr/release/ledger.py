"""The label party's privacy-budget ledger: every release over a label set.

One TPSL run is ``(eps, 0)``-DP per label (Yang et al., Theorem 4.2), but a
user runs many times over one label set, and independent releases compose:
pure epsilons add (basic composition, tight for pure DP; Dwork and Roth,
Theorem 3.16), and dp-accounting's PLD accountant gives a tighter
``(eps, delta)``. To print a true total the label party must know every
earlier release, whatever folder, ``out-dir`` or ``--overwrite`` it came from.

The ledger is a folder of the label party's own (``0700``, files ``0600``),
outside every run folder: ``$TPSL_FLWR_LEDGER_DIR``, else
``$XDG_DATA_HOME/tpsl-flwr/ledger``, else ``~/.local/share/tpsl-flwr/ledger``.
It holds

* ``secret.key``: 32 random bytes that key the label-set fingerprints
  (:mod:`tpsl_flwr.release.label_set`); it never leaves the folder;
* ``<fingerprint>.jsonl``: one file per label set, its first line the set's
  identity, then one line per release (key fingerprint, mechanism, parameter,
  placement, reuse, epochs, eps spent, time, run name). Lines are only ever
  appended: under a lock, the file is read, one line is added and the whole
  is written to a temporary file that replaces it (``os.replace``), so a crash
  leaves the old file or the new one, never half a line.

A release is written *before the first gradient leaves*
(:meth:`~tpsl_flwr.release.store.LabelStore.open_release` calls
:meth:`PrivacyLedger.record` before it returns the key).

Each line has a *kind* (:data:`KINDS`). A ``release`` is a run whose
transcript reaches processes the label party did not start: it counts in the
total and is guarded. A ``rehearsal`` is a run whose every node the label
party started itself (the in-process, Ray and local-deployment engines): no
transcript leaves its trust domain, so it is recorded with what it would
spend, never refused and kept out of the total. A ``void`` line marks an
earlier release of the same key that failed before its first gradient left:
nothing was sent, so it no longer counts (a later line of that key, a
resume, counts again).

The folder cannot be reset by accident: a missing ``secret.key`` is never
re-created while ``*.jsonl`` files exist (a new secret would fingerprint the
same labels as a new set), and the folder is refused under a parent that
other users may write to (:func:`~tpsl_flwr._util.private_files.check_private_parents`).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tpsl_flwr._util.private_files import (
    check_private_parents,
    make_private_dir,
    open_private,
    read_private,
    write_private,
)
from tpsl_flwr.errors import PrivacyError
from tpsl_flwr.release.label_set import LabelSet

__all__ = [
    "KINDS",
    "LEDGER_ENV",
    "LedgerEntry",
    "LedgerTotal",
    "PrivacyLedger",
    "compose",
    "compose_latest",
    "counted",
    "default_ledger_dir",
]

LEDGER_ENV = "TPSL_FLWR_LEDGER_DIR"
SECRET_FILE = "secret.key"
LOCK_FILE = ".lock"
FORMAT = "tpsl-flwr ledger 1"
DELTA = 1e-5
"""The delta at which the composed ``(eps, delta)`` total is stated."""
RELEASE, REHEARSAL, VOID = "release", "rehearsal", "void"
KINDS = (RELEASE, REHEARSAL, VOID)
"""What a ledger line records (see the module doc)."""


def default_ledger_dir() -> Path:
    """``$TPSL_FLWR_LEDGER_DIR``, else the user's data folder (see module doc).

    Raises
    ------
    PrivacyError
        If ``$TPSL_FLWR_LEDGER_DIR`` is a relative path: the CLI and a
        ServerApp started by ``flwr run`` have different working folders and
        would keep two ledgers.
    """
    explicit = os.environ.get(LEDGER_ENV)
    if explicit:
        if not Path(explicit).is_absolute():
            raise PrivacyError(
                f"{LEDGER_ENV} must be an absolute path, got {explicit!r}: a "
                "relative one names another ledger in every working folder"
            )
        return Path(explicit)
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "tpsl-flwr" / "ledger"


@dataclass(frozen=True)
class LedgerEntry:
    """One release of a label set (one noise key), as the ledger records it.

    Attributes
    ----------
    key_fingerprint
        The public fingerprint of the release's noise key.
    mechanism, parameter, parameter_value, num_classes, placement, reuse_noise
        What fixes the noise (the key's binding).
    epochs
        Epochs the run was configured for.
    releases
        GradPerturb releases per label (2 at the cut layer; times epochs
        without noise reuse).
    epsilon
        Pure epsilon of this release (``inf`` unprotected, ``None`` Gaussian).
    key_origin
        ``"os"`` or ``"seed"``.
    run
        The run's name (its out-dir), for people reading the ledger.
    time
        When it was written (UTC, ISO 8601).
    acknowledged
        Whether the label party acknowledged it as a further release.
    kind
        ``"release"`` (counted), ``"rehearsal"`` (recorded, not counted) or
        ``"void"`` (the key's release failed before its first gradient left).
    """

    key_fingerprint: str
    mechanism: str
    parameter: str | None
    parameter_value: float | None
    num_classes: int
    placement: str
    reuse_noise: bool
    epochs: int
    releases: int
    epsilon: float | None
    key_origin: str
    run: str = ""
    time: str = ""
    acknowledged: bool = False
    kind: str = RELEASE

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``inf`` as the string ``"inf"``)."""
        out = asdict(self)
        if out["epsilon"] is not None and math.isinf(out["epsilon"]):
            out["epsilon"] = "inf"
        return out

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> LedgerEntry:
        """Inverse of :meth:`to_dict`."""
        values = {
            name: record[name] if name != "kind" else record.get(name, RELEASE)
            for name in cls.__dataclass_fields__
        }
        if values["epsilon"] == "inf":
            values["epsilon"] = math.inf
        return cls(**values)


@dataclass(frozen=True)
class LedgerTotal:
    """The privacy spent on a label set over every release in the ledger.

    Attributes
    ----------
    releases
        Distinct releases (noise keys), this one included.
    epsilon
        Pure epsilon composed over them (their sum); ``inf`` if any release
        was unprotected or has no pure guarantee (Gaussian), never None.
    epsilon_at_delta
        The epsilon at ``delta`` from dp-accounting's PLD accountant over the
        same releases (never above ``epsilon``); ``inf`` where none exists.
    delta
        The delta of ``epsilon_at_delta``.
    """

    releases: int
    epsilon: float
    epsilon_at_delta: float
    delta: float = DELTA

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``inf`` as the string ``"inf"``)."""
        out = asdict(self)
        for name in ("epsilon", "epsilon_at_delta"):
            if math.isinf(out[name]):
                out[name] = "inf"
        return out


class PrivacyLedger:
    """The append-only record of releases per label set (see the module doc).

    Parameters
    ----------
    folder
        The ledger's folder; :func:`default_ledger_dir` when None.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> ledger = PrivacyLedger(Path(tempfile.mkdtemp()) / "ledger")
    >>> labels = ledger.label_set(np.arange(10), np.arange(10) % 2, public=False)
    >>> ledger.entries(labels)
    []
    """

    def __init__(self, folder: str | Path | None = None) -> None:
        self.folder = Path(folder) if folder is not None else default_ledger_dir()

    # ------------------------------------------------------------- identity
    @property
    def secret(self) -> bytes:
        """The key of the label-set fingerprints (created on first use)."""
        path = self.folder / SECRET_FILE
        with self._locked():
            if not path.exists():
                recorded = sorted(p.name for p in self.folder.glob("*.jsonl"))
                if recorded:
                    raise PrivacyError(
                        f"{path} is missing but the ledger holds {len(recorded)} "
                        f"label set file(s) ({recorded[0]}, ...): a new secret "
                        "would fingerprint the same labels as new sets and start "
                        "their totals afresh. Restore secret.key from the backup "
                        "the ledger came from (copy the whole folder, secret "
                        "included)"
                    )
                write_private(path, secrets.token_bytes(32))
            raw = read_private(path)
        if len(raw) != 32:
            raise PrivacyError(f"{path} is not a ledger secret ({len(raw)} bytes)")
        return raw

    def label_set(self, ids: Any, labels: Any, *, public: bool) -> LabelSet:
        """The identity of ``labels`` (one per record id) under this ledger."""
        return LabelSet.of(ids, labels, secret=self.secret, public=public)

    # -------------------------------------------------------------- reading
    def entries(self, label_set: LabelSet) -> list[LedgerEntry]:
        """Every release over this set or one it overlaps, oldest first."""
        found: list[LedgerEntry] = []
        for known, entries in self._files():
            if known.overlaps(label_set):
                found.extend(entries)
        return sorted(found, key=lambda e: e.time)

    def sets(self) -> list[tuple[LabelSet, list[LedgerEntry]]]:
        """Every label set in the ledger with its releases (for ``ledger list``)."""
        return list(self._files())

    def total(
        self, label_set: LabelSet, extra: LedgerEntry | None = None
    ) -> LedgerTotal:
        """The composed spend over the set's releases (and ``extra``, if new)."""
        return compose_latest([*self.entries(label_set), *([extra] if extra else [])])

    def lines_of(self, key_fingerprint: str) -> tuple[LabelSet, LedgerEntry] | None:
        """The label set and the largest line of the key, or None if unknown."""
        for label_set, entries in self._files():
            mine = [e for e in entries if e.key_fingerprint == key_fingerprint]
            mine = [e for e in mine if e.kind != VOID]
            if mine:
                return label_set, max(mine, key=lambda e: e.releases)
        return None

    def total_now(self, fingerprint: str) -> LedgerTotal | None:
        """The current total of the set with this fingerprint (None if unknown)."""
        for label_set, _ in self._files():
            if label_set.fingerprint == fingerprint:
                return self.total(label_set)
        return None

    # -------------------------------------------------------------- writing
    def record(self, label_set: LabelSet, entry: LedgerEntry) -> Path:
        """Append ``entry`` to the set's file, atomically; return the file."""
        return self.admit(label_set, entry, lambda earlier: None)

    def void(self, label_set: LabelSet, entry: LedgerEntry) -> Path:
        """Mark ``entry``'s release void: its run failed before a gradient left.

        Appended like every line (the release line stays): the key no longer
        counts in the set's total, unless a later line of it (a resume) does.
        """
        return self.record(
            label_set, LedgerEntry(**{**asdict(entry), "kind": VOID, "time": ""})
        )

    def admit(
        self,
        label_set: LabelSet,
        entry: LedgerEntry,
        decide: Callable[[list[LedgerEntry]], None],
        *,
        write: bool = True,
    ) -> Path:
        """Append ``entry`` if ``decide(earlier entries)`` does not raise.

        The check and the append happen under one lock, so two runs started
        at once over the same labels cannot both see "no earlier release".
        ``write=False`` only decides (a run's check before it starts).
        """
        make_private_dir(self.folder)
        path = self.folder / f"{label_set.fingerprint}.jsonl"
        stamped = entry if entry.time else _stamp(entry)
        with self._locked():
            decide(self.entries(label_set))
            if not write:
                return path
            old = read_private(path) if path.exists() else b""
            if not old:
                header = {"format": FORMAT, "label_set": label_set.to_dict()}
                old = (json.dumps(header) + "\n").encode()
            new = old + (json.dumps(stamped.to_dict()) + "\n").encode()
            write_private(path, new)
        return path

    # -------------------------------------------------------------- private
    @contextmanager
    def _locked(self) -> Iterator[None]:
        check_private_parents(self.folder)
        make_private_dir(self.folder)
        fd = open_private(self.folder / LOCK_FILE, "lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _files(self) -> Iterator[tuple[LabelSet, list[LedgerEntry]]]:
        if not self.folder.exists():
            return
        for path in sorted(self.folder.glob("*.jsonl")):
            yield _read_file(path)


def _read_file(path: Path) -> tuple[LabelSet, list[LedgerEntry]]:
    try:
        lines = read_private(path).decode().splitlines()
        header = json.loads(lines[0])
        if header.get("format") != FORMAT:
            raise ValueError(f"format {header.get('format')!r}")
        label_set = LabelSet.from_dict(header["label_set"])
        entries = [LedgerEntry.from_dict(json.loads(line)) for line in lines[1:]]
    except (ValueError, KeyError, TypeError, IndexError) as err:
        raise PrivacyError(
            f"{path} is not a ledger file ({err}); the ledger cannot be trusted, "
            "so no release is admitted and no total printed until it is restored "
            "from a backup (moving it aside would forget those releases)"
        ) from None
    return label_set, entries


def _stamp(entry: LedgerEntry) -> LedgerEntry:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return LedgerEntry(**{**asdict(entry), "time": now})


def _larger(old: LedgerEntry | None, new: LedgerEntry) -> LedgerEntry:
    """A release recorded twice (resumed with more epochs) counts at its largest.

    Both lines name one key, so one binding: the spend grows with the number
    of releases per label (fresh noise per epoch), for every mechanism.
    """
    if old is None:
        return new
    return new if new.releases >= old.releases else old


def counted(entries: list[LedgerEntry]) -> list[LedgerEntry]:
    """The releases that count, one per key at its largest recorded spend.

    Rehearsals never count; a key whose last line is ``void`` does not
    either. ``entries`` in the order they were written.

    Examples
    --------
    >>> def line(key, kind="release", releases=1):
    ...     return LedgerEntry(key, "laplace", "epsilon", 1.0, 2, "logits", True,
    ...                        1, releases, 1.0, "os", kind=kind)
    >>> [e.key_fingerprint for e in counted([line("a"), line("b", "rehearsal"),
    ...     line("c"), line("c", "void")])]
    ['a']
    """
    latest: dict[str, LedgerEntry] = {}
    void: set[str] = set()
    for entry in entries:
        fingerprint = entry.key_fingerprint
        if entry.kind == VOID:
            void.add(fingerprint)
        elif entry.kind == RELEASE:
            void.discard(fingerprint)
            latest[fingerprint] = _larger(latest.get(fingerprint), entry)
    return [e for key, e in latest.items() if key not in void]


def compose_latest(entries: list[LedgerEntry]) -> LedgerTotal:
    """:func:`compose` over the releases that count (:func:`counted`)."""
    return compose(counted(entries))


def compose(entries: list[LedgerEntry], delta: float = DELTA) -> LedgerTotal:
    """Compose independent releases: pure eps adds; PLD where it is tighter.

    A release without a pure guarantee (Gaussian) makes the pure total
    ``inf``; its ``(eps, delta)`` comes from dp-accounting's PLD
    (:func:`~tpsl_flwr.privacy.accounting.composed_epsilon_of`), ``inf``
    where none exists (no protection; Gaussian at the cut layer).

    Examples
    --------
    >>> a = LedgerEntry("k1", "laplace", "epsilon", 1.0, 2, "logits", True, 3,
    ...                 1, 1.0, "os")
    >>> b = LedgerEntry("k2", "laplace", "epsilon", 2.0, 2, "logits", True, 1,
    ...                 1, 2.0, "os")
    >>> total = compose([a, b])
    >>> total.releases, total.epsilon, total.epsilon_at_delta <= 3.0
    (2, 3.0, True)
    >>> g = LedgerEntry("k3", "gaussian", "sigma", 1.0, 2, "logits", True, 1,
    ...                 1, None, "os")
    >>> total = compose([a, g])
    >>> total.epsilon, 4.38 < total.epsilon_at_delta < 5.38
    (inf, True)
    """
    if not entries:
        return LedgerTotal(0, 0.0, 0.0, delta)
    pure = math.fsum(math.inf if e.epsilon is None else e.epsilon for e in entries)
    at_delta = min(_pld_epsilon(entries, delta), pure)
    return LedgerTotal(len(entries), pure, at_delta, delta)


def _pld_epsilon(entries: list[LedgerEntry], delta: float) -> float:
    """dp-accounting's PLD epsilon over the releases (``inf`` where none exists)."""
    from tpsl_flwr.privacy.accounting import composed_epsilon_of
    from tpsl_flwr.privacy.mechanisms import make_mechanism

    releases = []
    for entry in entries:
        if entry.parameter is None or entry.parameter_value is None:
            return math.inf  # no noise parameter: unprotected
        if entry.epsilon is None and entry.placement != "logits":
            return math.inf  # Gaussian at the cut layer: sensitivity unbounded
        mechanism = make_mechanism(
            entry.mechanism,
            num_classes=entry.num_classes,
            **{entry.parameter: entry.parameter_value},
        )
        releases.append((mechanism, entry.releases))
    return composed_epsilon_of(releases, delta=delta)
