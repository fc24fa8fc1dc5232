"""A release in the privacy ledger: admit it, record it, report it.

:meth:`~tpsl_flwr.release.store.LabelStore.open_release` calls
:func:`admit_release` for a fresh run and :func:`continue_release` for a
resume, each before the key is returned, so before any gradient leaves
(:mod:`tpsl_flwr.release.ledger` for the ledger itself and the composition).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from tpsl_flwr.errors import ConfigError, PrivacyError, ReleaseRefused
from tpsl_flwr.privacy.accounting import PrivacySpent
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import PARAMETERS, mechanism_class
from tpsl_flwr.release.binding import NoiseBinding
from tpsl_flwr.release.label_set import LabelSet
from tpsl_flwr.release.ledger import (
    REHEARSAL,
    RELEASE,
    LedgerEntry,
    LedgerTotal,
    PrivacyLedger,
    compose,
    compose_latest,
    counted,
)

__all__ = [
    "LedgerView",
    "admit_release",
    "check_spend",
    "continue_release",
    "ledger_entry",
]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(frozen=True)
class LedgerView:
    """What the ledger says of a release, for the results and every summary.

    Attributes
    ----------
    label_set
        Keyed fingerprint of the labels (never leaves the label party).
    epsilon_spent
        This release's pure epsilon (what a rehearsal would spend).
    releases
        GradPerturb releases per label this release was recorded for.
    total
        Composed over every counted release of the label set in the ledger
        when this one was recorded (``as_of``), this one included if it is a
        release (a rehearsal is not counted). A later release raises the
        set's total; ``tpsl-flwr ledger show`` gives it now.
    earlier
        Counted releases of the set (other keys) recorded before this one.
    public_labels
        Rehearsal data whose labels are public: recorded, never refused.
    acknowledged
        Whether the label party acknowledged a further release.
    folder
        The ledger's folder.
    kind
        ``"release"`` or ``"rehearsal"`` (:mod:`tpsl_flwr.release.ledger`).
    as_of
        When ``total`` was read (UTC, ISO 8601).
    """

    label_set: str
    epsilon_spent: float | None
    releases: int
    total: LedgerTotal
    earlier: int
    public_labels: bool
    acknowledged: bool
    folder: str
    kind: str = RELEASE
    as_of: str = field(default_factory=_now)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        spent = self.epsilon_spent
        return {
            "label_set": self.label_set,
            "epsilon_spent": "inf"
            if spent is not None and math.isinf(spent)
            else spent,
            "releases": self.releases,
            "total": self.total.to_dict(),
            "as_of": self.as_of,
            "earlier_releases": self.earlier,
            "public_labels": self.public_labels,
            "acknowledged": self.acknowledged,
            "folder": self.folder,
            "kind": self.kind,
        }


def admit_release(
    book: PrivacyLedger,
    label_set: LabelSet,
    entry: LedgerEntry,
    *,
    acknowledged: bool,
    budget: float | None,
    unprotected: bool = False,
    write: bool = True,
) -> LedgerView:
    """Record a fresh release or rehearsal, or refuse it (nothing is written then).

    The check and the append run under the ledger's lock
    (:meth:`PrivacyLedger.admit`): two runs started at once over the same
    labels are admitted one after the other, the second seeing the first. A
    rehearsal (``entry.kind``) is recorded and never refused. ``write=False``
    only decides.

    Raises
    ------
    ReleaseRefused
        If the set has counted releases under other keys and the label party
        did not acknowledge a further one (rehearsal sets excepted), if an
        unprotected release is not allowed (``unprotected``), or if the total
        would exceed ``budget``.
    """
    seen: dict[str, Any] = {}

    def decide(entries: list[LedgerEntry]) -> None:
        released = counted(entries)
        earlier = {e.key_fingerprint for e in released} - {entry.key_fingerprint}
        seen.update(earlier=len(earlier), total=compose(released))
        if entry.kind == REHEARSAL:
            return
        _check_prior_key(label_set, entry, released)
        total = compose_latest([*entries, entry])
        seen.update(total=total)
        _check_release(label_set, entry, earlier, total, acknowledged, unprotected)
        _check_budget(label_set, total, budget)

    book.admit(label_set, entry, decide, write=write)
    return _view(book, label_set, entry, seen, acknowledged)


def _check_prior_key(
    label_set: LabelSet, entry: LedgerEntry, released: list[LedgerEntry]
) -> None:
    """Refuse a second fresh release of a key whose draws depend on a prior.

    A label randomizer whose draw is a function of (key, id, label) alone
    releases the same noisy labels every time its key is used, so the
    ledger counts a key once. RR-with-prior (Ghazi et al. 2021, Algorithm 2)
    also takes a prior from training, which any other training setting
    changes; with ``k >= 3`` two priors read the same keyed words into
    different labels, and the pair has no finite epsilon (an output pair
    possible under one label is impossible under another). Binary labels
    are safe: both runs read the one keep word the same way.
    """
    if label_set.public or entry.num_classes <= 2:
        return
    if not mechanism_class(entry.mechanism).needs_prior:
        return
    if any(e.key_fingerprint == entry.key_fingerprint for e in released):
        raise ReleaseRefused(
            f"{entry.mechanism} with {entry.num_classes} classes draws each "
            f"label with a prior from training: a second fresh run under key "
            f"{entry.key_fingerprint} (a reused noise seed or noise_key) over "
            f"label set {label_set.fingerprint} would release other labels "
            "from the same keyed words, and the two releases together have no "
            "finite epsilon (the ledger would count one). Nothing is sent: "
            "start it with a fresh key from the OS (no noise-seed), as a "
            "further release (--new-release). (A run already counted as a "
            "release need not be recorded again.)"
        )


def _check_release(
    label_set: LabelSet,
    entry: LedgerEntry,
    earlier: set[str],
    total: LedgerTotal,
    acknowledged: bool,
    unprotected: bool,
) -> None:
    """Refuse a release that is not acknowledged (see :func:`admit_release`)."""
    if label_set.public:
        return
    clear = entry.epsilon is not None and math.isinf(entry.epsilon)
    if clear and not unprotected:
        raise ReleaseRefused(
            f"this run is a release (its nodes are not all the label party's) "
            f"with mechanism {entry.mechanism}: every label of label set "
            f"{label_set.fingerprint} ({label_set.rows} records) reaches them "
            "in the clear. If that is intended, allow it: "
            "--unprotected-release (tpsl-flwr ledger acknowledge LABEL_DIR "
            "--unprotected for flwr run)"
        )
    if not mechanism_class(entry.mechanism).dp_guarantee and not unprotected:
        raise ReleaseRefused(
            f"this run is a release (its nodes are not all the label party's) "
            f"with mechanism {entry.mechanism}, which states no DP guarantee: "
            f"the labels of label set {label_set.fingerprint} "
            f"({label_set.rows} records) reach them protected by a heuristic "
            "only. If that is intended, allow it as an unprotected release: "
            "--unprotected-release (tpsl-flwr ledger acknowledge LABEL_DIR "
            "--unprotected for flwr run)"
        )
    if earlier and not acknowledged:
        raise ReleaseRefused(
            f"these labels (label set {label_set.fingerprint}, "
            f"{label_set.rows} records) were released {len(earlier)} time(s) "
            f"before under other keys; this run is a further release and the "
            f"total would be epsilon {_text(total.epsilon)}. Acknowledge it: "
            "--new-release (tpsl-flwr ledger acknowledge LABEL_DIR for flwr run)"
        )


def _view(
    book: PrivacyLedger,
    label_set: LabelSet,
    entry: LedgerEntry,
    seen: dict[str, Any],
    acknowledged: bool,
) -> LedgerView:
    return LedgerView(
        label_set.fingerprint,
        entry.epsilon,
        entry.releases,
        seen["total"],
        seen["earlier"],
        label_set.public,
        acknowledged,
        str(book.folder),
        kind=entry.kind,
    )


def continue_release(
    book: PrivacyLedger,
    label_set: LabelSet,
    entry: LedgerEntry,
    *,
    budget: float | None,
    acknowledged: bool = False,
    unprotected: bool = False,
    write: bool = True,
) -> LedgerView:
    """The ledger's view of a resumed release; record it first if it grew.

    A release the ledger does not hold yet (a key file from before the
    ledger, or another ledger folder), or one that now spends more (fresh
    noise per epoch and more epochs: more releases per label, for every
    mechanism, Gaussian included), is recorded before the run goes on. A
    rehearsal resumed as a release is admitted as a fresh release would be.
    """
    seen: dict[str, Any] = {}

    def decide(entries: list[LedgerEntry]) -> None:
        released = counted(entries)
        mine = [e for e in entries if e.key_fingerprint == entry.key_fingerprint]
        earlier = {e.key_fingerprint for e in released} - {entry.key_fingerprint}
        seen["earlier"] = len(earlier)
        if entry.kind == REHEARSAL:
            seen["total"] = compose(released)
            if any(e.kind == REHEARSAL and e.releases >= entry.releases for e in mine):
                raise _AlreadyRecorded
            return
        seen["total"] = compose_latest([*entries, entry])
        counted_mine = [e for e in released if e in mine]
        if not counted_mine:
            _check_release(
                label_set, entry, earlier, seen["total"], acknowledged, unprotected
            )
        elif entry.releases <= max(e.releases for e in counted_mine):
            raise _AlreadyRecorded
        _check_budget(label_set, seen["total"], budget)

    try:
        book.admit(label_set, entry, decide, write=write)
    except _AlreadyRecorded:
        pass
    return _view(book, label_set, entry, seen, True)


class _AlreadyRecorded(Exception):
    """The resumed release is in the ledger at this spend: nothing to append."""


def check_spend(view: LedgerView | None, spent: PrivacySpent) -> None:
    """Refuse a strategy that spends more than its release recorded.

    Raises
    ------
    PrivacyError
        If ``spent`` (the strategy's epochs, placement, reuse) composes more
        releases per label than the ledger line written for it.
    """
    if view is not None and spent.releases > view.releases:
        raise PrivacyError(
            f"this strategy spends {spent.releases} release(s) per label "
            f"({spent.epochs} epochs, placement {spent.placement}, reuse-noise "
            f"{spent.reuse_noise}) but its release was recorded for "
            f"{view.releases}: open the release with the strategy's own "
            "privacy_spent(...)"
        )


def ledger_entry(
    key: NoiseKey,
    origin: str,
    binding: NoiseBinding,
    privacy: PrivacySpent,
    run_name: str,
    acknowledged: bool,
    *,
    kind: str = RELEASE,
) -> LedgerEntry:
    """The ledger line of a release (or rehearsal) under ``key`` with ``binding``.

    Raises
    ------
    ConfigError
        If ``privacy`` was computed for another mechanism, placement or
        noise reuse than ``binding`` names (the ledger would record a wrong
        epsilon).
    """
    settings = binding.settings
    for name, theirs in (
        ("mechanism", privacy.mechanism),
        ("placement", privacy.placement),
        ("reuse-noise", privacy.reuse_noise),
    ):
        if name in settings and settings[name] != theirs:
            raise ConfigError(
                f"privacy was computed for {name} {theirs!r} but the binding "
                f"names {settings[name]!r}: pass privacy_spent(...) of the run's "
                "own mechanism, placement, epochs and reuse"
            )
    parameter = next((p for p in PARAMETERS if settings.get(p) is not None), None)
    _check_privacy_of(settings, parameter, privacy)
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
        kind=kind,
    )


def _check_privacy_of(
    settings: Any, parameter: str | None, privacy: PrivacySpent
) -> None:
    """Refuse a ``privacy`` that is not what the binding's mechanism spends.

    The ledger line takes its epsilon from ``privacy``: computed for another
    parameter or number of classes than the binding's, it would record a
    wrong epsilon for the noise the key really releases.
    """
    from tpsl_flwr.privacy.accounting import privacy_spent
    from tpsl_flwr.privacy.mechanisms import make_mechanism

    options = {} if parameter is None else {parameter: settings[parameter]}
    mechanism = make_mechanism(
        str(settings.get("mechanism")),
        num_classes=int(settings.get("num-classes") or 2),
        **options,
    )
    expected = privacy_spent(
        mechanism=mechanism,
        placement=privacy.placement,
        epochs=privacy.epochs,
        reuse_noise=privacy.reuse_noise,
        delta=privacy.delta,
    )
    if (expected.epsilon, expected.releases) != (privacy.epsilon, privacy.releases):
        raise ConfigError(
            f"privacy spends epsilon {privacy.epsilon} over {privacy.releases} "
            f"release(s) but the binding's {mechanism.name} "
            f"({parameter} {options.get(parameter or '')}) spends {expected.epsilon} "
            f"over {expected.releases}: pass privacy_spent(...) of the run's own "
            "mechanism, placement, epochs and reuse"
        )


def _check_budget(
    label_set: LabelSet, total: LedgerTotal, budget: float | None
) -> None:
    if budget is None:
        return
    if total.epsilon is None or total.epsilon > budget:
        raise ReleaseRefused(
            f"this release would take label set {label_set.fingerprint} to a total "
            f"epsilon of {_text(total.epsilon)} over {total.releases} release(s), "
            f"above the budget {budget}; nothing was released"
        )


def _text(epsilon: float | None) -> str:
    return "unbounded (no pure guarantee)" if epsilon is None else f"{epsilon:g}"
