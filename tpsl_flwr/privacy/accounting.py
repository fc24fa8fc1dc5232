"""Privacy accounting: the epsilon a TPSL run spends.

With each sample's noise drawn once and reused (the default), the whole
transcript is a post-processing of one GradPerturb release per label, so the
budget does not grow with batches or epochs (Yang et al., Lemma 4.1 and
Section 6): ``epsilon`` when the noise is applied once at the logits (Section
4.2), ``2 epsilon`` at the cut layer, where the transcript and the top-model
update are perturbed separately (Algorithm 3).

When the user turns reuse off, every epoch draws fresh noise and the releases
compose; that is accounted for with dp-accounting events (Laplace under
add/remove with the sensitivity folded into the noise multiplier, randomized
response under replace-one), both as pure epsilon (basic composition, tight for
pure DP) and as an ``(epsilon, delta)`` from the PLD accountant. The Gaussian
baseline has no pure epsilon; an ``(epsilon, delta)`` is reported where its
sensitivity is known (the logit placement). The heuristics of Li et al. 2022
(``marvell``, ``max-norm``) have no DP guarantee at all: every epsilon of
their runs is ``None`` (empty), never 0 or ``inf``, and the notes say so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant

from tpsl_flwr._util.checks import check_int, check_placement
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.privacy.closed_forms import auc_bound
from tpsl_flwr.privacy.mechanisms import Mechanism

NO_DP_GUARANTEE_NOTE = (
    "{name}: no DP guarantee (a heuristic defense of Li et al. 2022; its "
    "epsilon is empty, not 0 or inf)"
)
"""The note of a run whose mechanism states no differential privacy at all."""
NO_OP_AUC = 0.99
"""Above this attack-AUC ceiling the protection is reported as a near no-op."""


@dataclass(frozen=True)
class PrivacySpent:
    """What a run spends, per label.

    Attributes
    ----------
    epsilon
        Pure epsilon (``delta = 0``) of the whole run; ``inf`` without
        protection; ``None`` when no pure guarantee exists (Gaussian) or no
        DP guarantee at all (Marvell, max-norm).
    delta
        The delta at which ``epsilon_at_delta`` is stated.
    epsilon_at_delta
        The (possibly tighter) epsilon at ``delta`` from dp-accounting's PLD
        accountant, or ``None`` where the sensitivity is unknown.
    releases
        How many GradPerturb releases per label the run composes.
    auc_bound
        Ceiling on any binary attack's AUC implied by ``epsilon``.
    notes
        Plain-language remarks (no-op warnings, missing guarantees).
    """

    mechanism: str
    placement: str
    epochs: int
    reuse_noise: bool
    epsilon: float | None
    delta: float
    epsilon_at_delta: float | None
    releases: int
    auc_bound: float | None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``inf`` becomes the string ``"inf"``)."""
        out = asdict(self)
        out["notes"] = list(self.notes)
        for name in ("epsilon", "epsilon_at_delta"):
            if out[name] is not None and math.isinf(out[name]):
                out[name] = "inf"
        return out


def dp_event(mechanism: Mechanism) -> dp_accounting.DpEvent:
    """The dp-accounting event of one GradPerturb release of one label.

    Each mechanism declares its own (:meth:`Mechanism.dp_event
    <tpsl_flwr.privacy.mechanisms.base.Mechanism.dp_event>`): Laplace as
    ``LaplaceDpEvent(1/epsilon)`` under add/remove, randomized response as
    ``RandomizedResponseDpEvent`` under replace-one, Gaussian as
    ``GaussianDpEvent(sigma / sensitivity)`` at the logits.
    """
    return mechanism.dp_event()


def composed_epsilon(mechanism: Mechanism, releases: int, delta: float) -> float:
    """Epsilon at ``delta`` of ``releases`` independent releases (PLD accountant).

    The releases are composed as an explicit ``ComposedDpEvent``:
    dp-accounting 0.6's PLD accountant ignores the count of a
    ``SelfComposedDpEvent`` around a randomized-response event.
    """
    per_release = mechanism.epsilon
    interval = 1e-4
    if per_release is not None and math.isfinite(per_release):
        # The PLD's cost grows with epsilon / interval; keep the relative
        # resolution instead of the absolute one.
        interval = max(1e-4, 1e-3 * per_release)
    accountant = pld_privacy_accountant.PLDAccountant(
        mechanism.neighboring, value_discretization_interval=interval
    )
    accountant.compose(dp_accounting.ComposedDpEvent([dp_event(mechanism)] * releases))
    return float(accountant.get_epsilon(delta))


def composed_epsilon_of(
    releases: Sequence[tuple[Mechanism, int]],
    *,
    delta: float,
    interval: float = 1e-3,
) -> float:
    """Epsilon at ``delta`` of independent releases of one label, any mechanisms.

    Each ``(mechanism, count)`` is ``count`` releases. Events stated under one
    neighbouring relation compose in one dp-accounting PLD accountant
    (``value_discretization_interval=interval``). Randomized response
    (replace-one) shares no accountant with Laplace and Gaussian (add/remove,
    the label change folded into their sensitivity), so each relation's group
    is stated at ``delta / groups`` and the groups' epsilons add: basic
    composition of ``(eps_i, delta_i)``-DP (Dwork and Roth, Theorem 3.16).
    A group is never stated above its pure sum. ``inf`` for a non-private
    release: no finite epsilon exists then.

    Examples
    --------
    >>> from tpsl_flwr.privacy.mechanisms import make_mechanism
    >>> gauss = make_mechanism("gaussian", sigma=1.0)
    >>> round(composed_epsilon_of([(gauss, 1)], delta=1e-5), 2)
    4.38
    >>> rr = make_mechanism("discrete", epsilon=1.0)
    >>> 1.0 < composed_epsilon_of([(gauss, 1), (rr, 1)], delta=1e-5) < math.inf
    True
    >>> composed_epsilon_of([(make_mechanism("none"), 1)], delta=1e-5)
    inf
    """
    if not 0.0 < delta < 1.0:
        raise ConfigError(f"delta must be in (0, 1), got {delta}")
    if any(not m.protects or not m.dp_guarantee for m, _ in releases):
        return math.inf
    groups: dict[Any, list[tuple[Mechanism, int]]] = {}
    for mechanism, count in releases:
        groups.setdefault(mechanism.neighboring, []).append((mechanism, count))
    total = 0.0
    for relation, group in groups.items():
        accountant = pld_privacy_accountant.PLDAccountant(
            relation, value_discretization_interval=interval
        )
        events = [m.dp_event() for m, count in group for _ in range(count)]
        accountant.compose(dp_accounting.ComposedDpEvent(events))
        pure = math.fsum(
            math.inf if m.epsilon is None else m.epsilon * count for m, count in group
        )
        total += min(float(accountant.get_epsilon(delta / len(groups))), pure)
    return total


def privacy_spent(
    *,
    mechanism: Mechanism,
    placement: str = "logits",
    epochs: int = 1,
    reuse_noise: bool = True,
    delta: float = 1e-5,
) -> PrivacySpent:
    """The privacy a TPSL run spends per label.

    Parameters
    ----------
    mechanism
        The GradPerturb mechanism.
    placement
        ``"logits"`` (one perturbation; ``epsilon``) or ``"cut"`` (transcript
        and top update perturbed separately; ``2 epsilon``).
    epochs
        Passes over the training data.
    reuse_noise
        Whether each sample's noise is drawn once and reused (the paper's
        multi-epoch rule). If not, releases compose across epochs.
    delta
        The delta for the ``(epsilon, delta)`` statement (0 < delta < 1).

    Returns
    -------
    PrivacySpent
        The accounting, with notes.

    Examples
    --------
    >>> from tpsl_flwr.privacy.mechanisms import make_mechanism
    >>> laplace = make_mechanism("laplace", epsilon=1.0)
    >>> privacy_spent(mechanism=laplace, epochs=20, reuse_noise=True).epsilon
    1.0
    >>> privacy_spent(mechanism=laplace, placement="cut").epsilon
    2.0
    """
    check_placement(placement)
    check_int(epochs, "epochs")
    if not 0.0 < delta < 1.0:
        raise ConfigError(f"delta must be in (0, 1), got {delta}")
    per_epoch = 2 if placement == "cut" else 1
    releases = per_epoch * (1 if reuse_noise else epochs)
    if mechanism.gradient_noise:  # fresh noise every step: one release an epoch
        releases = epochs
    notes: list[str] = []
    epsilon: float | None
    at_delta: float | None
    if not mechanism.protects:
        epsilon, at_delta = math.inf, math.inf
        notes.append("no protection: gradients reveal the labels (attack AUC ~1)")
    elif not mechanism.dp_guarantee:  # heuristics: nothing to state
        epsilon, at_delta = None, None
        notes.append(NO_DP_GUARANTEE_NOTE.format(name=mechanism.name))
    elif mechanism.epsilon is None:  # no pure epsilon: the Gaussian baseline
        epsilon = None
        if placement == "logits":
            at_delta = composed_epsilon(mechanism, releases, delta)
        else:
            at_delta = None
            notes.append(
                f"{mechanism.name} at the cut layer: the sensitivity ||g_0 - g_1|| is "
                "unbounded, so no (epsilon, delta) is reported"
            )
        notes.append(f"{mechanism.name} baseline: no pure (epsilon, 0) guarantee")
    else:
        assert mechanism.epsilon is not None
        epsilon = releases * mechanism.epsilon
        # One release of a pure epsilon-DP mechanism is (epsilon, delta)-DP
        # for every delta; only a composition can gain from the PLD.
        at_delta = (
            epsilon if releases == 1 else composed_epsilon(mechanism, releases, delta)
        )
    bound = auc_bound(epsilon) if epsilon is not None else None
    warning = no_op_warning(bound)
    if warning:
        notes.append(warning)
    return PrivacySpent(
        mechanism=mechanism.name,
        placement=placement,
        epochs=epochs,
        reuse_noise=reuse_noise,
        epsilon=epsilon,
        delta=delta,
        epsilon_at_delta=at_delta,
        releases=releases,
        auc_bound=bound,
        notes=tuple(notes),
    )


def no_op_warning(ceiling: float | None) -> str | None:
    """A warning when the attack ceiling is so high the protection barely acts."""
    if ceiling is None or math.isinf(ceiling) or ceiling < NO_OP_AUC or ceiling >= 1.0:
        return None
    return (
        f"epsilon is so large that the protection is close to a no-op: "
        f"an attacker may reach AUC {ceiling:.4f} (>= {NO_OP_AUC})"
    )
