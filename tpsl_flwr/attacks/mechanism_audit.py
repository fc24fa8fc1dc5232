"""``tpsl-flwr audit``: measure a mechanism with the strongest attack.

Pushes labels through the real GradPerturb code (keyed noise, coefficient
sampling, the torch backward pass at the logits), runs the white-box
shortest-distance attack on what would be sent, and compares the attack's
success with the closed forms of :mod:`tpsl_flwr.privacy.closed_forms` and with the
ceiling that ``(epsilon, 0)``-DP puts on any attack.

Every sample sits at the same logits ``z = 0`` (uniform predictions). The SDA
on the binary mechanisms and on k-ary randomized response does not depend on
``z``; for multi-class Laplace and the Gaussian baseline the closed forms are
those of uniform predictions.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from tpsl_flwr._util.checks import check_int
from tpsl_flwr.attacks import sda_predictions, sda_scores
from tpsl_flwr.attacks.ceiling import (
    ABOVE,
    SIGMAS_OF_TOLERANCE,
    STRICT_CONFIDENCE,
    accuracy_standard_error,
    ceiling_test,
    pooled_auc_standard_error,
)
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.metrics.auc import binary_auc
from tpsl_flwr.privacy.accounting import no_op_warning
from tpsl_flwr.privacy.closed_forms import (
    auc_bound,
    top1_bound,
)
from tpsl_flwr.privacy.empirical import epsilon_lower_bound
from tpsl_flwr.privacy.gradient_noise import gradient_noise_stream, perturb_gradients
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms import Mechanism
from tpsl_flwr.privacy.mechanisms.base import one_hot
from tpsl_flwr.privacy.noisy_labels import (
    NoisyLabels,
    draw_noisy_labels,
    realized_noise,
)
from tpsl_flwr.privacy.perturb import candidate_gradients, logits_placement_backward

__all__ = [
    "SIGMAS_OF_TOLERANCE",
    "STRICT_CONFIDENCE",
    "AuditResult",
    "mechanism_gradients",
    "run_audit",
]


@dataclass(frozen=True)
class AuditResult:
    """What ``tpsl-flwr audit`` measured (see :func:`run_audit`)."""

    mechanism: str
    epsilon: float | None
    sigma: float | None
    marvell_power: float | None
    classes: int
    samples: int
    seed: int
    prior: list[float]
    sda_auc: float | None
    sda_top1: float | None
    expected: float
    standard_error: float
    auc_bound: float | None
    top1_bound: float | None
    empirical_epsilon_lower_bound: float
    confidence: float
    violation: bool
    verdict: str
    realized_noise: dict[str, float]
    expected_noise: dict[str, float]
    notes: list[str] = field(default_factory=list)
    ceiling_verdict: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (infinite values become the string ``"inf"``)."""
        out = asdict(self)
        for name, value in out.items():
            if isinstance(value, float) and math.isinf(value):
                out[name] = "inf"
        return out


def _check_prior(prior: list[float] | None, k: int) -> np.ndarray:
    if prior is None:
        return np.full(k, 1.0 / k)
    values = np.asarray(prior, dtype=np.float64)
    if k == 2 and values.size == 1:
        values = np.array([1.0 - values[0], values[0]])
    if values.size != k:
        raise ConfigError(
            f"prior must give the positive rate (binary) or {k} class "
            f"probabilities, got {list(prior)}"
        )
    if np.any(~np.isfinite(values)) or np.any(values <= 0) or np.any(values >= 1):
        raise ConfigError(f"prior probabilities must lie in (0, 1), got {list(prior)}")
    if abs(values.sum() - 1.0) > 1e-6:
        raise ConfigError(f"prior probabilities must sum to 1, got {values.sum():.6g}")
    return values / values.sum()


def mechanism_gradients(
    mechanism: Mechanism, labels: np.ndarray, key: NoiseKey
) -> tuple[np.ndarray, np.ndarray, NoisyLabels]:
    """The logit gradients a batch would produce, and the SDA's candidates.

    Returns
    -------
    tuple
        ``(n, m)`` per-sample perturbed gradients and ``(n, k, m)`` candidate
        gradients, computed with the real perturbation code at ``z = 0``, and
        the noisy labels behind them.
    """
    n = labels.size
    outputs = 1 if mechanism.is_binary else mechanism.num_classes
    ids = np.arange(n, dtype=np.int64)
    top = torch.nn.Identity()
    logits = torch.zeros((n, outputs), dtype=torch.float64)
    candidates = candidate_gradients(top, logits)
    if mechanism.gradient_noise:
        exact = candidates.numpy()[ids, labels]
        received = _batch_noise(mechanism, exact, labels, key)
        return (
            received,
            candidates.numpy(),
            NoisyLabels(one_hot(labels, mechanism.num_classes), received - exact),
        )
    noisy = draw_noisy_labels(mechanism, labels, ids, key)
    sent, _ = logits_placement_backward(top, logits, noisy)
    return (sent * n).numpy(), candidates.numpy(), noisy


AUDIT_BATCH = 256
"""Batch size of the audit's per-batch mechanisms (Marvell, max-norm)."""


def _batch_noise(
    mechanism: Mechanism, exact: np.ndarray, labels: np.ndarray, key: NoiseKey
) -> np.ndarray:
    """The exact gradients perturbed :data:`AUDIT_BATCH` rows at a time."""
    out = np.empty_like(exact)
    reference = None
    for step, start in enumerate(range(0, labels.size, AUDIT_BATCH)):
        rows = slice(start, start + AUDIT_BATCH)
        out[rows], reference = perturb_gradients(
            mechanism,
            exact[rows],
            labels[rows],
            ids=np.arange(labels.size, dtype=np.int64)[rows],
            key=key,
            stream=gradient_noise_stream(step),
            reference=reference,
        )
    return out


def run_audit(
    mechanism: Mechanism,
    samples: int = 100_000,
    seed: int = 0,
    prior: list[float] | None = None,
) -> AuditResult:
    """Run the SDA on ``samples`` labels protected by ``mechanism``.

    Parameters
    ----------
    mechanism
        The mechanism under audit.
    samples
        Number of labels (>= 1000 for meaningful statistics).
    seed
        Seed of the labels and of the (audit-only) noise key.
    prior
        Positive rate (binary) or class probabilities; balanced by default.

    Returns
    -------
    AuditResult
        Measurements, closed forms, bounds and the verdict.
    """
    check_int(samples, "samples", minimum=1000)
    k = mechanism.num_classes
    probabilities = _check_prior(prior, k)
    rng = np.random.default_rng(seed)
    labels = rng.choice(k, size=samples, p=probabilities).astype(np.int64)
    key = NoiseKey.from_seed(seed)
    received, candidates, noisy = mechanism_gradients(mechanism, labels, key)
    epsilon = mechanism.epsilon
    notes: list[str] = ["audit noise key is seeded (reproducible, not secure)"]
    ceiling = auc_bound(epsilon) if epsilon is not None else None
    if k == 2:
        scores = sda_scores(received, candidates, resolution=0.0)  # float64
        if labels.min() == labels.max():
            raise ConfigError("the audit drew a single label; raise --samples")
        measured = binary_auc(labels, scores)
        n_pos = int(labels.sum())
        se = pooled_auc_standard_error(measured, n_pos, samples - n_pos)
        top_ceiling = None
        attack_scores, attack_labels = scores, labels
    else:
        predictions = sda_predictions(received, candidates)
        measured = float(np.mean(predictions == labels))
        se = accuracy_standard_error(measured, samples)
        top_ceiling = (
            top1_bound(epsilon, float(probabilities.max()))
            if epsilon is not None
            else None
        )
        # Distinguish the two most frequent classes by "predicted = the first".
        first, second = np.argsort(-probabilities, kind="stable")[:2]
        pair = (labels == first) | (labels == second)
        attack_scores = (predictions[pair] == first).astype(np.float64)
        attack_labels = (labels[pair] == first).astype(np.int64)
        notes.append(
            f"epsilon lower bound from the test 'SDA predicts {first}' between "
            f"labels {first} and {second}"
        )
    lower = epsilon_lower_bound(attack_scores, attack_labels, 0.95, seed)
    strict = epsilon_lower_bound(attack_scores, attack_labels, STRICT_CONFIDENCE, seed)
    limit = ceiling if k == 2 else top_ceiling
    reasons: tuple[str, ...] = ()
    verdict_of_ceiling = None
    if epsilon is not None and math.isfinite(epsilon):
        if limit is not None:
            # The one rule of the project (tpsl_flwr.attacks.ceiling).
            test = ceiling_test(
                value=measured,
                standard_error=se,
                ceiling=limit,
                epsilon=epsilon,
                epsilon_lower_bound=strict,
                name="SDA AUC" if k == 2 else "SDA top-1 accuracy",
            )
            reasons = test.reasons if test.verdict == ABOVE else ()
            verdict_of_ceiling = test.verdict
    elif mechanism.additive:
        notes.append("gaussian baseline: no pure epsilon, so no ceiling to check")
    elif not mechanism.dp_guarantee:
        notes.append(
            f"{mechanism.name}: no DP guarantee, so no ceiling to check; its "
            f"closed form is at z = 0 with balanced classes, in batches of "
            f"{AUDIT_BATCH}"
        )
    warning = no_op_warning(ceiling)
    if warning:
        notes.append(warning)
    violation = bool(reasons)
    verdict = "VIOLATION: " + "; ".join(reasons) if violation else "ok"
    return AuditResult(
        mechanism=mechanism.name,
        epsilon=epsilon,
        sigma=getattr(mechanism, "sigma", None),
        marvell_power=getattr(mechanism, "power", None),
        classes=k,
        samples=samples,
        seed=seed,
        prior=[float(p) for p in probabilities],
        sda_auc=measured if k == 2 else None,
        sda_top1=measured if k > 2 else None,
        expected=mechanism.expected_sda(),
        standard_error=se,
        auc_bound=ceiling,
        top1_bound=top_ceiling,
        empirical_epsilon_lower_bound=lower,
        confidence=0.95,
        violation=violation,
        verdict=verdict,
        realized_noise=realized_noise(labels, noisy),
        expected_noise=mechanism.expected_noise(),
        notes=notes,
        ceiling_verdict=verdict_of_ceiling,
    )
