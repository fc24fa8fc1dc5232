"""What the label party reports per epoch: the Flower result, the progress line.

:class:`TPSLResult` is Flower's ``Result`` plus the privacy the run spends, so
a user embedding :class:`~tpsl_flwr.strategies.TPSLStrategy` reads
``result.epsilon_spent`` without calling the accountant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

from flwr.app import MetricRecord
from flwr.common.logger import log
from flwr.serverapp.strategy import Result

from tpsl_flwr.attacks.ceiling import BELOW, ceiling_text
from tpsl_flwr.attacks.report import INVERTED
from tpsl_flwr.parties import LabelParty
from tpsl_flwr.privacy.accounting import PrivacySpent
from tpsl_flwr.privacy.epsilon_text import epsilon_text, total_text
from tpsl_flwr.release.record import LedgerView

__all__ = [
    "NOTHING_TO_DO",
    "TPSLResult",
    "begin_result",
    "log_settings",
    "progress_line",
    "record_epoch",
]

NOTHING_TO_DO = (
    "nothing left to do: the resumed run had already trained all {epochs} "
    "epoch(s): no step was taken and no gradient sent (raise epochs to train "
    "further, or start a new run)"
)
"""The note and log line of a resume that finds every epoch done."""


@dataclass
class TPSLResult(Result):
    """Flower's ``Result`` of a TPSL run, with its privacy accounting.

    Attributes
    ----------
    privacy
        The accounting of the run (epsilon, delta, notes, the attack ceiling).
    epochs_trained
        Epochs this call trained: ``0`` for a resume that found every epoch
        done (:data:`NOTHING_TO_DO` says so in the log and in ``note``).
    note
        A plain-language remark on the run, or ``None``.
    epsilon_total
        Epsilon composed over every release of these labels in the privacy
        ledger, this one included, as of this release: ``inf`` where one of
        them has no pure guarantee (Gaussian) or no protection; ``None`` only
        when the strategy was given no release from ``LabelStore.open_release``.
    """

    privacy: PrivacySpent | None = None
    epochs_trained: int = 0
    note: str | None = None
    epsilon_total: float | None = None

    @property
    def epsilon_spent(self) -> float | None:
        """The run's pure epsilon per label (``inf`` without protection)."""
        return None if self.privacy is None else self.privacy.epsilon

    @property
    def privacy_notes(self) -> tuple[str, ...]:
        """Caveats of the accounting (e.g. a near no-op epsilon)."""
        return () if self.privacy is None else tuple(self.privacy.notes)


def begin_result(
    privacy: PrivacySpent,
    epochs: int,
    start_epoch: int,
    ledger: LedgerView | None = None,
) -> TPSLResult:
    """The result of a run about to train epochs ``start_epoch..epochs-1``.

    A resumed run (``start_epoch > 0``) with no epoch left says so: in the
    log (a warning) and in the result's ``note``; ``epochs_trained`` is 0.
    With ``ledger``, ``epsilon_total`` is its total.
    """
    result = TPSLResult(privacy=privacy, epochs_trained=max(0, epochs - start_epoch))
    if ledger is not None:
        result.epsilon_total = ledger.total.epsilon
    if start_epoch > 0 and result.epochs_trained == 0:
        result.note = NOTHING_TO_DO.format(epochs=epochs)
        log(WARNING, "%s", result.note)
    return result


def record_epoch(result: Result, entry: dict[str, Any]) -> None:
    """Add an epoch's history entry to a Flower ``Result``."""
    epoch = int(entry["epoch"])
    result.train_metrics_clientapp[epoch] = MetricRecord(
        {k: float(entry[k]) for k in ("samples", "seconds", "samples_per_second")}
    )
    evaluated = {
        k: float(v)
        for k, v in entry.items()
        if k.startswith("test_") or (k not in _TRAINING and isinstance(v, int | float))
    }
    if evaluated:
        result.evaluate_metrics_serverapp[epoch] = MetricRecord(dict(evaluated))


_TRAINING = frozenset(
    {"epoch", "seconds", "samples", "samples_per_second", "steps", "steps_cumulative"}
)


def progress_line(entry: dict[str, Any]) -> str:
    """One log line for an epoch: throughput, test metrics, attack AUCs.

    Each attack shows its standard error over the epoch's samples (the
    ceiling as :func:`~tpsl_flwr.attacks.ceiling.ceiling_text` states it), and
    an AUC above the epsilon-DP ceiling says whether that is within sampling error
    or above the ceiling (:func:`~tpsl_flwr.attacks.ceiling.ceiling_verdict`).

    Examples
    --------
    >>> progress_line({"samples_per_second": 900.0, "attack_auc": {
    ...     "norm": 0.61, "sda": 0.7332, "auc_bound": 0.7311,
    ...     "standard_error": {"norm": 0.026, "sda": 0.0231},
    ...     "ceiling_verdict": {"norm": "below the ceiling",
    ...                         "sda": "within sampling error"}}})
    '900 samples/s, attack norm 0.610 ± 0.026, sda 0.733 ± 0.023 (ceiling 0.731, within sampling error)'

    With a prior-aware ceiling (a posterior-trained top model), the plain
    eps ceiling is printed beside it:

    >>> progress_line({"samples_per_second": 900.0, "attack_auc": {
    ...     "sda": 0.724, "auc_bound": 0.828, "auc_bound_without_prior": 0.7311}})
    '900 samples/s, attack sda 0.724 (ceiling 0.731 at eps 1; 0.828 with the label prior)'

    An attack pointed the wrong way round is reported as ``1 - AUC``, and
    says so (:data:`~tpsl_flwr.attacks.report.INVERTED`):

    >>> progress_line({"samples_per_second": 900.0, "attack_auc": {
    ...     "spectral": 0.613, "standard_error": {"spectral": 0.006},
    ...     "direction": {"spectral": "inverted"}}})
    '900 samples/s, attack spectral 0.613 ± 0.006 inverted'
    """  # noqa: E501
    parts = [f"{entry['samples_per_second']:.0f} samples/s"]
    for key in ("test_auc", "test_accuracy", "test_logloss"):
        if key in entry and not math.isnan(entry[key]):
            parts.append(f"{key} {entry[key]:.4f}")
    attacks = entry.get("attack_auc")
    if attacks:
        errors = attacks.get("standard_error") or {}
        verdicts = attacks.get("ceiling_verdict") or {}
        directions = attacks.get("direction") or {}
        bound = attacks.get("auc_bound")
        if bound is not None:
            ceiling = ceiling_text(bound, attacks.get("auc_bound_without_prior"))
        found, flagged = [], False
        for name in ("norm", "spectral", "sda", "sda_top1"):
            value = attacks.get(name)
            if value is None:
                continue
            text = f"{name} {value:.3f}"
            se = errors.get(name)
            if se is not None and math.isfinite(se):
                text += f" ± {se:.3f}"
            if directions.get(name) == INVERTED:
                text += f" {INVERTED}"
            verdict = verdicts.get(name)
            if verdict is not None and verdict != BELOW:
                text += f" ({ceiling}, {verdict})"
                flagged = True
            found.append(text)
        if not flagged and bound is not None and found:
            found[-1] += f" ({ceiling})"
        parts.append("attack " + ", ".join(found))
    return ", ".join(parts)


def run_kind_text(kind: str) -> str:
    """``kind`` in words, for the progress and summary lines.

    Examples
    --------
    >>> run_kind_text("rehearsal")[:42]
    'rehearsal (every node started by the label'
    """
    if kind == "rehearsal":
        return (
            "rehearsal (every node started by the label party: recorded in the "
            "ledger, not counted in the total)"
        )
    return "release (its transcript reaches nodes the label party did not start)"


def log_settings(
    party: LabelParty,
    spent: PrivacySpent,
    *,
    epochs: int,
    batch_size: int,
    steps_per_message: int,
    ledger: LedgerView | None = None,
) -> None:
    """Log a run's settings as a tree, like Flower's DP wrappers' ``summary``.

    With ``ledger`` (a release from ``LabelStore.open_release``), the label
    set's total over every recorded release; without one, a protected run
    warns that no ledger records it.

    The strategy checked its release before this (in ``__init__``:
    :func:`~tpsl_flwr.strategies.epoch_loop.restore_release`).
    """
    mech = party.mechanism
    param = (
        f"{mech.parameter}={mech.parameter_value}"
        if mech.parameter
        else "no parameter"
        if mech.protects
        else "no noise"
    )
    log(
        INFO, "\t├── Mechanism: %s (%s, classes=%s)", mech.name, param, mech.num_classes
    )
    log(
        INFO,
        "\t├── Placement: %s, noise reused across epochs: %s",
        party.placement,
        party.reuse_noise,
    )
    log(
        INFO,
        "\t├── Epsilon spent per label: %s",
        epsilon_text(spent.epsilon, mech.name),
    )
    if ledger is not None:
        log(
            INFO,
            "\t├── Epsilon total over these labels' releases: %s (%s release%s)",
            total_text(
                ledger.total.epsilon, ledger.total.epsilon_at_delta, ledger.total.delta
            ),
            ledger.total.releases,
            "" if ledger.total.releases == 1 else "s",
        )
        log(INFO, "\t├── This run is a %s", run_kind_text(ledger.kind))
    elif mech.protects:
        log(
            WARNING,
            "this release is recorded in no privacy ledger (no release from "
            "LabelStore.open_release): a further release of the same labels will "
            "be neither refused nor counted; see docs/embedding.md",
        )
    log(
        INFO,
        "\t├── Noise key: %s (fingerprint %s)",
        "secure" if party.key.secure else "SEEDED, NOT SECURE",
        party.key.fingerprint,
    )
    log(
        INFO,
        "\t└── Epochs %s, batch size %s, steps per message %s",
        epochs,
        batch_size,
        steps_per_message,
    )
    for note in spent.notes:
        log(WARNING, "%s", note)
