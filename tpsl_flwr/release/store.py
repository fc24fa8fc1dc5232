"""The label party's own folder: its noise key, bound to one release, and checkpoints.

TPSL's guarantee holds for one *release*: every sample's noise is drawn once
from the secret key and reused (Yang et al., Section 6). Two releases under the
same key at different settings are correlated draws of the same words: with
Laplace noise at ``eps = 1`` and then ``eps = 4``, ``t1 - 2 t2 = -y`` recovers
every label. So the key is stored together with its *binding*: every setting
that fixes the noise (mechanism, epsilon or sigma, classes, placement, noise
reuse), the id space (which record each sample id names) and the labels
themselves. A run that resumes must present the same binding and the same
labels, or it is refused with the changed settings named; a run that starts
afresh derives a new key from the key it is given (a fresh OS key, or one left
by ``keygen`` or a seed) and its binding, so two runs at different settings
never share noise words, seeded ones included (:meth:`NoiseKey.derive`).

Every fresh run is recorded in the label party's
:class:`~tpsl_flwr.release.ledger.PrivacyLedger` before the key is returned (so before
any gradient can leave), as a *release* (its transcript reaches processes the
label party did not start: counted and guarded) or a *rehearsal* (the label
party started every node: recorded, never refused, not counted). A release
over labels that already have a counted release with another key is refused
unless the label party acknowledges a further release (``new_release=True``,
or :meth:`LabelStore.acknowledge_new_release`, which the CLI's
``--new-release`` calls); an unprotected release needs its own flag
(``unprotected_release=True``, ``--unprotected-release``); rehearsal data
whose labels are public (``public_labels=True``) is recorded and never
refused. Nothing is written in the folder before the ledger admits the run.

Layout of the folder (``0700``; every file ``0600``, see
:mod:`tpsl_flwr._util.private_files`):

* ``noise-key.json``: the key (hex), whether it is secure (from the OS) or
  seeded, and its binding once a run has used it. JSON, so loading it runs no
  code. A key written by :meth:`LabelStore.provide_key` (``tpsl-flwr keygen``,
  ``simulate --noise-seed``) is unbound until the next fresh run takes it.
* ``new-release.json``: the label party's decisions for the next fresh run:
  a further release acknowledged, an optional budget, an unprotected release
  allowed, or the run counted as a release whatever its engine; consumed by
  that run.
* ``rehearsal.json``: left for a moment by a launcher that started every node
  of the next run itself (the local deployment engine): that run is a
  rehearsal (:meth:`LabelStore.mark_rehearsal`); taken by that run.
* ``checkpoint.pt``: the last finished epoch, the party's tensors and the
  history (as JSON text), read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tpsl_flwr._util.private_files import (
    check_private,
    make_private_dir,
    read_private,
    write_private,
)
from tpsl_flwr.errors import ConfigError, PrivacyError
from tpsl_flwr.privacy.accounting import PrivacySpent
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.release.binding import NOT_NOISE, LabelRecords, NoiseBinding
from tpsl_flwr.release.decisions import (
    ACK_FILE,
    REHEARSAL_FILE,
    acknowledge,
    mark_rehearsal,
    read_decisions,
    take_rehearsal_mark,
)
from tpsl_flwr.release.label_set import LabelSet, label_digest
from tpsl_flwr.release.ledger import REHEARSAL, RELEASE, LedgerEntry, PrivacyLedger
from tpsl_flwr.release.record import (
    LedgerView,
    admit_release,
    continue_release,
    ledger_entry,
)

__all__ = ["LabelRecords", "LabelStore", "LedgerView", "NoiseBinding", "Release"]

KEY_FILE = "noise-key.json"
CHECKPOINT_FILE = "checkpoint.pt"
DECISION_FILES = (KEY_FILE, ACK_FILE, REHEARSAL_FILE)
"""What the label party's folder may hold before its first run (an unbound key)."""
KEY_FORMAT = "tpsl-flwr noise key 2"
ORIGINS = ("os", "seed")


@dataclass
class Release:
    """What a run of the label party starts from.

    Attributes
    ----------
    key
        The noise key of the release.
    origin
        ``"os"`` (secure) or ``"seed"`` (reproducible, NOT secure against anyone
        who knows the seed).
    start_epoch
        First epoch to run (0 for a fresh run).
    history
        Per-epoch history of the epochs already run.
    party_state
        :meth:`~tpsl_flwr.parties.LabelParty.state_dict` to restore, or None.
    ledger
        What the privacy ledger says of this release (None for a release
        built by hand, which no ledger records).
    binding
        Everything that fixes its noise; whatever trains under the release
        states the same (:func:`~tpsl_flwr.release.binding.check_bound`).
    privacy
        What it was recorded to spend (epochs, placement, reuse): a strategy
        that would spend more is refused before its first step.
    resumed
        Whether it continues an earlier run (whose gradients may have left).
    entry
        The ledger line written for it (what :meth:`LabelStore.void` voids).
    label_set
        The identity of its labels in the ledger.
    dry_run
        Opened to decide only (``open_release(dry_run=True)``): nothing was
        written and nothing may train under it.
    """

    key: NoiseKey
    origin: str
    start_epoch: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    party_state: dict[str, Any] | None = None
    ledger: LedgerView | None = None
    binding: NoiseBinding | None = None
    privacy: PrivacySpent | None = None
    resumed: bool = False
    entry: LedgerEntry | None = field(default=None, repr=False)
    label_set: LabelSet | None = field(default=None, repr=False)
    dry_run: bool = False

    @property
    def kind(self) -> str:
        """``"release"`` or ``"rehearsal"`` (:mod:`tpsl_flwr.release.ledger`)."""
        return RELEASE if self.entry is None else self.entry.kind


class LabelStore:
    """The label party's private folder (see the module docstring).

    Parameters
    ----------
    folder
        The folder; created with mode ``0700`` on first write. It must not be
        a folder the non-label parties write to.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    @property
    def key_path(self) -> Path:
        """Where the key and its binding are kept."""
        return self.folder / KEY_FILE

    @property
    def checkpoint_path(self) -> Path:
        """Where the last finished epoch's state is kept."""
        return self.folder / CHECKPOINT_FILE

    # ------------------------------------------------------------------ keys
    def provide_key(self, key: NoiseKey, origin: str) -> None:
        """Leave an unbound key for the next fresh run (``keygen``, a seed).

        Raises
        ------
        ConfigError
            If ``origin`` is not ``"os"`` or ``"seed"``, or disagrees with
            ``key.secure``.
        """
        if origin not in ORIGINS or (origin == "os") != key.secure:
            raise ConfigError(
                f"origin must be 'os' for a secure key or 'seed' for a seeded one, "
                f"got {origin!r} for secure={key.secure}"
            )
        make_private_dir(self.folder)
        self._write_key(key, origin, None)

    def acknowledge_new_release(
        self,
        budget: float | None = None,
        *,
        new_release: bool = True,
        unprotected: bool = False,
        release: bool = False,
    ) -> Path:
        """Acknowledge that the next fresh run here is a further release.

        The label party's decision, kept in its own folder (never run config,
        which the nodes receive): ``tpsl-flwr ledger acknowledge`` and every
        ``--new-release`` flag call this. The next fresh run uses it up,
        admitted or refused; a resume drops it; after ``ACK_LIFETIME_S``
        (24 hours) it is dropped unused.

        Parameters
        ----------
        budget
            Optional cap on the label set's total pure epsilon: the run is
            refused if its release would take the total above it.
        new_release
            ``False`` leaves only the other decisions (no acknowledgement).
        unprotected
            An unprotected release (``mechanism = none`` reaching nodes the
            label party did not start) is intended.
        release
            Count the next run as a release whatever its engine (its nodes'
            outputs will be shared, say).
        """
        return acknowledge(
            self.folder,
            budget,
            new_release=new_release,
            unprotected=unprotected,
            release=release,
        )

    def mark_rehearsal(self, launch: str) -> Path:
        """Say that the run of ``launch`` is a rehearsal (every node started here).

        ``launch`` is the launch id the launcher gave every process it started
        (the ServerApp inherits it): a mark counts only for the run whose
        ServerApp carries the same id, so a mark a crashed launcher left
        behind never makes another run (``flwr run`` against someone else's
        SuperNodes) a rehearsal. Taken by that run; stale after
        :data:`REHEARSAL_LIFETIME_S`. Only the label party writes its folder,
        so no node can mark a release as a rehearsal.
        """
        return mark_rehearsal(self.folder, launch)

    def clear_rehearsal_mark(self) -> None:
        """Remove a rehearsal mark the run did not take (a launcher's finally)."""
        (self.folder / REHEARSAL_FILE).unlink(missing_ok=True)

    def take_rehearsal_mark(self, launch: str | None) -> bool:
        """Whether a fresh mark for launch ``launch`` was here (it is taken)."""
        return take_rehearsal_mark(self.folder, launch)

    def void(self, release: Release) -> None:
        """Mark a fresh release void: its run failed before a gradient left.

        Refused for a resumed release, whose earlier run may have sent
        gradients (its line stays counted).
        """
        if release.resumed or release.entry is None or release.label_set is None:
            raise PrivacyError(
                "only a fresh release that sent nothing can be voided; this one "
                f"(key {release.key.fingerprint}) stays in the ledger"
            )
        PrivacyLedger(release.ledger.folder if release.ledger else None).void(
            release.label_set, release.entry
        )

    def record_shared(
        self,
        *,
        new_release: bool = False,
        unprotected_release: bool = False,
        ledger: PrivacyLedger | None = None,
    ) -> LedgerView:
        """Count this folder's rehearsal as a release: its outputs were shared.

        A rehearsal's nodes computed their bottom models (and anything else
        they keep) from the perturbed gradients; handing those to someone
        else releases the labels at the run's epsilon under its key. The
        rehearsal's ledger line is appended again as a release, admitted as a
        fresh release would be (a further release needs ``new_release``, an
        unprotected one ``unprotected_release``).

        Raises
        ------
        PrivacyError
            If the folder holds no bound key or the ledger no line of it.
        ReleaseRefused
            As :func:`~tpsl_flwr.release_record.admit_release`.
        """
        if not self.key_path.exists():
            raise PrivacyError(f"no noise key in {self.folder}: no run to record")
        key, _, bound, _ = self._read_key()
        if bound is None:
            raise PrivacyError(f"the key in {self.key_path} was never used by a run")
        book = ledger if ledger is not None else PrivacyLedger()
        found = book.lines_of(key.fingerprint)
        if found is None:
            raise PrivacyError(
                f"the ledger {book.folder} holds no line of key {key.fingerprint}"
            )
        label_set, line = found
        entry = dataclasses.replace(
            line, kind=RELEASE, time="", acknowledged=new_release
        )
        return admit_release(
            book,
            label_set,
            entry,
            acknowledged=new_release,
            budget=None,
            unprotected=unprotected_release,
        )

    def open_release(
        self,
        binding: NoiseBinding,
        *,
        resume: bool,
        labels: LabelRecords,
        privacy: PrivacySpent,
        public_labels: bool = False,
        new_release: bool = False,
        budget: float | None = None,
        ledger: PrivacyLedger | None = None,
        run_name: str = "",
        rehearsal: bool = False,
        unprotected_release: bool = False,
        dry_run: bool = False,
    ) -> Release:
        """The key (and saved state) a run with ``binding`` may use.

        A fresh run derives its key from an unbound key left by
        :meth:`provide_key` (else a fresh OS key), its binding and its labels;
        records the release in ``ledger`` (before returning, so before any
        gradient leaves); binds the key and drops any older checkpoint. A
        resumed run needs this folder's bound key, the same binding and the
        same labels; with no checkpoint yet (a crash in the first epoch) it
        starts from epoch 0 under the same key.

        Parameters
        ----------
        binding
            Everything that fixes the noise (:meth:`NoiseBinding.of`).
        resume
            Continue the run bound in this folder instead of starting one.
        labels
            Every label the party holds for the run, with record ids.
        privacy
            What the run spends (:func:`~tpsl_flwr.privacy.accounting.privacy_spent`).
        public_labels
            Rehearsal data whose labels are public anyway: record, never refuse.
        new_release
            The label party acknowledges a further release of labels that
            already have one (as does :meth:`acknowledge_new_release`).
        budget
            Refuse a release that takes the label set's pure total above this.
        ledger
            The ledger (:class:`~tpsl_flwr.release.ledger.PrivacyLedger` at its
            default folder when None).
        run_name
            Recorded with the release, for people reading the ledger.
        rehearsal
            The label party started every node of this run itself (no
            transcript reaches anyone else): recorded, never refused, not
            counted. A label party's request to count the run
            (:meth:`acknowledge_new_release` with ``release=True``) wins.
        unprotected_release
            Allow an unprotected release (as ``--unprotected-release``).
        dry_run
            Decide only: raise what a run would raise, write nothing, use up
            no decision (the CLI's check before it touches a run folder).

        Raises
        ------
        PrivacyError
            On resume without a key, with a changed binding or changed labels
            (named); on a fresh run over labels released before under another
            key without acknowledgement; over the budget; if a file is not
            private.
        """
        if self.folder.exists():
            check_private(self.folder)
        book = ledger if ledger is not None else PrivacyLedger()
        label_set = book.label_set(labels.ids, labels.labels, public=public_labels)
        decisions = self._read_decisions()
        kind = REHEARSAL if rehearsal and not decisions["release"] else RELEASE
        if resume:
            return self._resume(
                binding, labels, privacy, book, label_set, run_name, kind, dry_run
            )
        acknowledged = decisions["new_release"] or new_release
        saved = self._read_key() if self.key_path.exists() else None
        if saved is not None and saved[2] is None:
            root, origin = saved[0], saved[1]
        else:
            root, origin = NoiseKey.from_os(), "os"
        check = label_digest(root.key, labels.ids, labels.labels)
        key = root.derive(binding.context(check))
        entry = ledger_entry(
            key, origin, binding, privacy, run_name, acknowledged, kind=kind
        )
        try:
            view = admit_release(
                book,
                label_set,
                entry,
                acknowledged=acknowledged,
                budget=budget if budget is not None else decisions["budget"],
                unprotected=unprotected_release or decisions["unprotected"],
                write=not dry_run,
            )
        finally:
            # The decisions are for one run: a refused run uses them up too,
            # so that they cannot admit some later run by surprise.
            if not dry_run:
                (self.folder / ACK_FILE).unlink(missing_ok=True)
        if dry_run:
            return Release(
                key, origin, ledger=view, binding=binding, privacy=privacy, dry_run=True
            )
        make_private_dir(self.folder)
        self.checkpoint_path.unlink(missing_ok=True)
        self._write_key(key, origin, binding, self._label_check(key, labels))
        return Release(
            key.bound_to(binding.settings),
            origin,
            ledger=view,
            binding=binding,
            privacy=privacy,
            entry=entry,
            label_set=label_set,
        )

    def _resume(
        self,
        binding: NoiseBinding,
        labels: LabelRecords,
        privacy: PrivacySpent,
        book: PrivacyLedger,
        label_set: LabelSet,
        run_name: str,
        kind: str,
        dry_run: bool = False,
    ) -> Release:
        if not self.key_path.exists():
            raise PrivacyError(
                f"cannot resume: no noise key in {self.folder} (a new key would "
                "make a second release reported as one); start a new run"
            )
        key, origin, bound, check = self._read_key()
        if bound is None:
            raise PrivacyError(
                f"cannot resume: the key in {self.key_path} was never used by a run"
            )
        changed = bound.changes(binding)
        if check != self._label_check(key, labels):
            changed.append("labels (the label column or its records changed)")
        if changed:
            hold_out = [c for c in changed if c.split(" (")[0] in NOT_NOISE]
            why = (
                f". The same key (fingerprint {key.fingerprint}) would release a "
                "second, correlated draw for the same labels; start a new run instead"
                if len(hold_out) < len(changed)
                else ": ids trained on would be held out (or held-out ids, whose "
                "noisy labels the validation used, trained on); resume with the "
                "checkpoint's value (e.g. --validation-fraction "
                f"{bound.settings.get('validation-fraction')}) or start a new run"
            )
            raise PrivacyError(
                "cannot resume: changed since the checkpoint: "
                + ", ".join(changed)
                + why
            )
        decisions = self._read_decisions()
        entry = ledger_entry(key, origin, binding, privacy, run_name, True, kind=kind)
        try:
            view = continue_release(
                book,
                label_set,
                entry,
                budget=decisions["budget"],
                acknowledged=decisions["new_release"],
                unprotected=decisions["unprotected"],
                write=not dry_run,
            )
        finally:
            # The decisions are for one run; a resume uses them up too, so
            # that they cannot apply to some later fresh run by surprise.
            if not dry_run:
                (self.folder / ACK_FILE).unlink(missing_ok=True)
        resumed: dict[str, Any] = dict(
            key=key.bound_to(binding.settings),
            origin=origin,
            ledger=view,
            binding=binding,
            privacy=privacy,
            resumed=True,
            entry=entry,
            label_set=label_set,
            dry_run=dry_run,
        )
        if not self.checkpoint_path.exists():
            # Stopped before its first checkpoint: gradients may have left
            # under this key, so the same release goes on from epoch 0.
            return Release(**resumed)
        state = torch.load(
            io.BytesIO(read_private(self.checkpoint_path)), weights_only=True
        )
        if state.get("key_fingerprint") != key.fingerprint:
            raise PrivacyError(
                f"cannot resume: {self.checkpoint_path} was written under another key "
                f"({state.get('key_fingerprint')}, key file {key.fingerprint})"
            )
        return Release(
            start_epoch=int(state["epoch"]) + 1,
            history=list(json.loads(state["history"])),
            party_state=state["party"],
            **resumed,
        )

    @staticmethod
    def _label_check(key: NoiseKey, labels: LabelRecords) -> str:
        return label_digest(key.key, labels.ids, labels.labels).hex()[:32]

    def _read_decisions(self) -> dict[str, Any]:
        """The label party's decisions for this run (see acknowledge_new_release)."""
        return read_decisions(self.folder)

    def _write_key(
        self,
        key: NoiseKey,
        origin: str,
        binding: NoiseBinding | None,
        label_check: str | None = None,
    ) -> None:
        record = {
            "format": KEY_FORMAT,
            "key": key.to_hex(),
            "secure": key.secure,
            "origin": origin,
            "fingerprint": key.fingerprint,
            "binding": None if binding is None else dict(binding.settings),
            "labels": label_check,
        }
        write_private(self.key_path, json.dumps(record, indent=2).encode())

    def _read_key(self) -> tuple[NoiseKey, str, NoiseBinding | None, str | None]:
        try:
            record = json.loads(read_private(self.key_path))
            if record.get("format") != KEY_FORMAT:
                raise ValueError(f"format {record.get('format')!r}")
            origin = record["origin"]
            if origin not in ORIGINS:
                raise ValueError(f"origin {origin!r}")
            key = NoiseKey.from_hex(record["key"], secure=origin == "os")
            bound = record["binding"]
            check = record.get("labels")
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise PrivacyError(
                f"{self.key_path} is not a noise key file: {err}"
            ) from None
        return key, origin, None if bound is None else NoiseBinding(bound), check

    # ----------------------------------------------------------- checkpoints
    def save_checkpoint(
        self,
        epoch: int,
        history: list[dict[str, Any]],
        party_state: dict[str, Any],
    ) -> None:
        """Keep the state after ``epoch`` (0-based) finished, atomically."""
        record = {
            "epoch": int(epoch),
            "party": party_state,
            "history": json.dumps(history, default=_jsonable),
            **_key_of(party_state),
        }
        buffer = io.BytesIO()
        torch.save(record, buffer)
        write_private(self.checkpoint_path, buffer.getvalue())

    def save_labels(self, name: str, labels: np.ndarray) -> Path:
        """Write an array of labels (the experimenter's ground truth) privately."""
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(labels), allow_pickle=False)
        return write_private(self.folder / name, buffer.getvalue())


def _key_of(party_state: Mapping[str, Any]) -> dict[str, Any]:
    fingerprint = party_state.get("key_fingerprint")
    if not isinstance(fingerprint, str):
        raise PrivacyError("the label party's state names no key fingerprint")
    return {"key_fingerprint": fingerprint}


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")
