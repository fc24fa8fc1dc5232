"""A release in the privacy ledger: admit it, record it, report it.

:meth:`~tpsl_flwr.label_store.LabelStore.open_release` calls
:func:`admit_release` for a fresh run and :func:`continue_release` for a
resume, each before the key is returned, so before any gradient leaves
(:mod:`tpsl_flwr.ledger` for the ledger itself and the composition).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tpsl_flwr.errors import PrivacyError
from tpsl_flwr.label_set import LabelSet
from tpsl_flwr.ledger import LedgerEntry, LedgerTotal, PrivacyLedger
from tpsl_flwr.noise_binding import NoiseBinding
from tpsl_flwr.privacy.accounting import PrivacySpent
from tpsl_flwr.privacy.keyed_noise import NoiseKey

__all__ = ["LedgerView", "admit_release", "continue_release", "ledger_entry"]


@dataclass(frozen=True)
class LedgerView:
    """What the ledger says of a release, for the results and every summary.

    Attributes
    ----------
    label_set
        Keyed fingerprint of the labels (never leaves the label party).
    epsilon_spent
        This release's pure epsilon.
    total
        Composed over every release of the label set in the ledger, this one
        included.
    earlier
        Releases of the set (other keys) recorded before this one.
    public_labels
        Rehearsal data whose labels are public: recorded, never refused.
    acknowledged
        Whether the label party acknowledged a further release.
    folder
        The ledger's folder.
    """

    label_set: str
    epsilon_spent: float | None
    total: LedgerTotal
    earlier: int
    public_labels: bool
    acknowledged: bool
    folder: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        spent = self.epsilon_spent
        return {
            "label_set": self.label_set,
            "epsilon_spent": "inf"
            if spent is not None and math.isinf(spent)
            else spent,
            "total": self.total.to_dict(),
            "earlier_releases": self.earlier,
            "public_labels": self.public_labels,
            "acknowledged": self.acknowledged,
            "folder": self.folder,
        }


def admit_release(
    book: PrivacyLedger,
    label_set: LabelSet,
    entry: LedgerEntry,
    *,
    acknowledged: bool,
    budget: float | None,
) -> LedgerView:
    """Record a fresh release, or refuse it (nothing is written then).

    Raises
    ------
    PrivacyError
        If the set has releases under other keys and the label party did not
        acknowledge a further one (rehearsal sets excepted), or if the total
        would exceed ``budget``.
    """
    earlier = {e.key_fingerprint for e in book.entries(label_set)}
    earlier.discard(entry.key_fingerprint)
    if earlier and not (acknowledged or label_set.public):
        total = book.total(label_set, extra=entry)
        raise PrivacyError(
            f"these labels (label set {label_set.fingerprint}, {label_set.rows} "
            f"records) were released {len(earlier)} time(s) before under other "
            f"keys (ledger {book.folder}); a new run is a further release and "
            f"the total would be epsilon {_text(total.epsilon)}. Resume the "
            "earlier run, or acknowledge a further release (--new-release, "
            "tpsl-flwr ledger acknowledge, or new_release=True)"
        )
    total = _check_budget(book, label_set, entry, budget)
    book.record(label_set, entry)
    return LedgerView(
        label_set.fingerprint,
        entry.epsilon,
        total,
        len(earlier),
        label_set.public,
        acknowledged,
        str(book.folder),
    )


def continue_release(
    book: PrivacyLedger,
    label_set: LabelSet,
    entry: LedgerEntry,
    *,
    budget: float | None,
) -> LedgerView:
    """The ledger's view of a resumed release; record it first if it grew.

    A release the ledger does not hold yet (a key file from before the
    ledger, or another ledger folder), or one that now spends more (fresh
    noise per epoch and more epochs), is recorded before the run goes on.
    """
    entries = book.entries(label_set)
    recorded = [e for e in entries if e.key_fingerprint == entry.key_fingerprint]
    total = book.total(label_set, extra=entry)
    if not recorded or _order(entry.epsilon) > max(_order(e.epsilon) for e in recorded):
        total = _check_budget(book, label_set, entry, budget)
        book.record(label_set, entry)
    earlier = {e.key_fingerprint for e in entries} - {entry.key_fingerprint}
    return LedgerView(
        label_set.fingerprint,
        entry.epsilon,
        total,
        len(earlier),
        label_set.public,
        True,
        str(book.folder),
    )


def ledger_entry(
    key: NoiseKey,
    origin: str,
    binding: NoiseBinding,
    privacy: PrivacySpent,
    run_name: str,
    acknowledged: bool,
) -> LedgerEntry:
    """The ledger line of a release under ``key`` with ``binding``."""
    settings = binding.settings
    parameter = next(
        (p for p in ("epsilon", "sigma") if settings.get(p) is not None), None
    )
    return LedgerEntry(
        key_fingerprint=key.fingerprint,
        mechanism=str(settings.get("mechanism")),
        parameter=parameter,
        parameter_value=None if parameter is None else float(settings[parameter]),
        num_classes=int(settings.get("num-classes") or 2),
        placement=privacy.placement,
        reuse_noise=privacy.reuse_noise,
        epochs=privacy.epochs,
        releases=privacy.releases,
        epsilon=privacy.epsilon,
        key_origin=origin,
        run=run_name,
        acknowledged=acknowledged,
    )


def _check_budget(
    book: PrivacyLedger, label_set: LabelSet, entry: LedgerEntry, budget: float | None
) -> LedgerTotal:
    total = book.total(label_set, extra=entry)
    if budget is None:
        return total
    if total.epsilon is None or total.epsilon > budget:
        raise PrivacyError(
            f"this release would take label set {label_set.fingerprint} to a total "
            f"epsilon of {_text(total.epsilon)} over {total.releases} release(s), "
            f"above the budget {budget}; nothing was released"
        )
    return total


def _order(epsilon: float | None) -> float:
    return math.inf if epsilon is None else epsilon


def _text(epsilon: float | None) -> str:
    return "unbounded (no pure guarantee)" if epsilon is None else f"{epsilon:g}"
