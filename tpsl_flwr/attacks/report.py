"""Every gradient attack on one epoch of what one non-label party received.

:func:`attack_report` takes the batches of one epoch, as the party received
them (ids, its gradient slice averaged over the batch, and for evaluation the
true labels), and runs the norm, cosine, spectral and (given the candidate
gradients) shortest-distance attacks on them.

Decisions, stated once:

* gradients are put back in per-sample units (times the batch size) before
  any attack, so batches of different sizes pool fairly and SDA compares them
  with per-sample candidates (:func:`~tpsl_flwr.privacy.perturb.candidate_gradients`);
* the cosine attack's known positive is the first sample of the epoch (in
  batch order) with label 1 and a non-zero gradient; it stays among the scored
  samples (one of thousands). Under label DP its own gradient is perturbed:
  when its label was effectively flipped, the attack scores the wrong way
  round (an AUC below 0.5);
* an attack whose pooled AUC is below 0.5 is reported the right way round,
  ``max(AUC, 1 - AUC)``, its scores negated for the per-batch AUCs and the
  verdict too, and ``direction[name]`` says ``"inverted"`` (else ``"as
  scored"``): an AUC of 0.387 is an attack of 0.613 pointed the wrong way,
  not a failed one. The ceiling bounds a score and its negation alike;
* the spectral attack is oriented without labels by default (cluster size
  over the whole epoch, right for minority positives as in CTR data; a coin
  flip on balanced data, where ``spectral="known-positive"`` uses the cosine
  attack's known positive instead). Its pooled score is one projection of the
  whole epoch's gradients on their top direction; the per-batch AUC projects
  each batch on its own top direction, signed to agree with the epoch's (a
  batch holds too few positives to orient itself under Laplace noise);
* the white-box SDA scores each sample by its likelihood-ratio statistic
  (:mod:`~tpsl_flwr.attacks.sda`): by default its label coordinate, the
  projection of the received gradient onto ``g_1 - g_0`` normalised by the
  sample's own scale (``sda_statistic="distance"`` for isotropic gradient
  noise, the Gaussian baseline at the cut layer); the pooled squared-distance
  score, which weighs samples by their gradient scale, is reported beside it
  as ``sda_pooled``, and the energy a received gradient holds outside the
  plane of its own ``g_1 - g_0`` and its batch's top direction as
  ``sda_residual`` (:func:`~tpsl_flwr.attacks.sda.sda_residual_scores`: the
  likelihood ratio is not the coordinate where the noise's shape depends on
  the label, as Marvell's does);
* multi-class (``k > 2``): the norm, cosine and spectral attacks are binary
  and are omitted from the report; SDA's top-1 accuracy is reported under
  ``sda_top1``;
* every pooled number carries its standard error over the samples it was
  computed on (``standard_error``: Hanley-McNeil for an AUC, binomial for a
  top-1 accuracy), and, given the epsilon-DP ceiling, every AUC its
  ``ceiling_verdict`` by the project's one rule
  (:func:`~tpsl_flwr.attacks.ceiling.ceiling_verdict`: above the ceiling beyond
  4 standard errors, within sampling error, or below; at an AUC of exactly 1
  or 0, whose standard error is 0, an exact binomial test decides instead,
  :func:`boundary_epsilon_bound`).

The population-level attacks (:mod:`~tpsl_flwr.attacks.completion`,
:mod:`~tpsl_flwr.attacks.clustering`) need embeddings, not gradients, and are
not part of this report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from tpsl_flwr._util.checks import check_int
from tpsl_flwr.attacks.ceiling import (
    STRICT_CONFIDENCE,
    accuracy_standard_error,
    ceiling_verdict,
    pooled_auc_standard_error,
)
from tpsl_flwr.attacks.cosine import cosine_scores
from tpsl_flwr.attacks.metrics import (
    BatchStats,
    batch_aucs,
    per_batch_top1,
    pooled_auc,
    top1_accuracy,
)
from tpsl_flwr.attacks.norm import norm_scores
from tpsl_flwr.attacks.sda import (
    SDA_STATISTICS,
    sda_predictions,
    sda_residual_scores,
    sda_scores,
)
from tpsl_flwr.attacks.signals import per_sample_gradients
from tpsl_flwr.attacks.spectral import spectral_direction, spectral_scores
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.privacy.empirical import epsilon_lower_bound

BINARY_ATTACKS = ("norm", "cosine", "spectral", "sda", "sda_pooled", "sda_residual")
"""Keys of a binary report (pooled AUC) and of its ``per_batch`` entry."""
AS_SCORED = "as scored"
INVERTED = "inverted"
"""``direction[name]`` of an attack whose AUC was below 0.5, reported as ``1 - AUC``."""
SPECTRAL_ORIENTATIONS = ("size", "known-positive")
"""How :func:`attack_report` orients the spectral attack (``size`` default)."""


@dataclass(frozen=True)
class BatchRecord:
    """One batch as a non-label party received it, with its true labels.

    Attributes
    ----------
    ids
        ``(n,)`` sample ids.
    gradient
        ``(n, d)`` the party's slice of the cut-layer gradient, as the message
        carried it (averaged over the batch).
    labels
        ``(n,)`` true labels (for scoring the attacks only).
    candidates
        Optional ``(n, k, d)`` per-sample gradients each label would produce
        for the same slice (white-box SDA).
    batch_size
        The size the label party averaged over; ``len(ids)`` when ``None``.
    """

    ids: ArrayLike
    gradient: ArrayLike
    labels: ArrayLike
    candidates: ArrayLike | None = None
    batch_size: int | None = None


@dataclass
class _Epoch:
    gradients: np.ndarray  # (N, d) per-sample
    labels: np.ndarray  # (N,) int64
    ids: np.ndarray  # (N,) int64
    candidates: np.ndarray | None  # (N, k, d)
    bounds: list[int]  # batch b is rows bounds[b]:bounds[b+1]

    def split(self, values: np.ndarray) -> list[np.ndarray]:
        return [values[a:b] for a, b in pairwise(self.bounds)]


def _gather(batches: Sequence[BatchRecord]) -> _Epoch:
    if len(batches) == 0:
        raise ConfigError("attack_report needs at least one batch, got none")
    grads: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    ids: list[np.ndarray] = []
    cands: list[np.ndarray] = []
    bounds = [0]
    for b, record in enumerate(batches):
        batch_ids = np.asarray(record.ids).reshape(-1)
        size = batch_ids.size if record.batch_size is None else record.batch_size
        grad = per_sample_gradients(record.gradient, check_int(size, "batch_size"))
        lab = np.asarray(record.labels).reshape(-1)
        if not (grad.shape[0] == batch_ids.size == lab.size):
            raise ConfigError(
                f"batch {b}: {batch_ids.size} ids, {lab.size} labels and "
                f"{grad.shape[0]} gradient rows differ"
            )
        if grads and grad.shape[1] != grads[0].shape[1]:
            raise ConfigError(
                f"batch {b}: gradient width {grad.shape[1]}, batch 0 has "
                f"{grads[0].shape[1]}"
            )
        if (record.candidates is None) != (batches[0].candidates is None):
            raise ConfigError(
                f"candidates given for some batches only (batch 0 and batch {b} differ)"
            )
        if record.candidates is not None:
            cand = np.asarray(record.candidates, dtype=np.float64)
            if cand.ndim != 3 or cand.shape[0] != grad.shape[0]:
                raise ConfigError(
                    f"batch {b}: candidates must be (n, k, d) with n = "
                    f"{grad.shape[0]}, got shape {cand.shape}"
                )
            cands.append(cand)
        grads.append(grad)
        labels.append(lab)
        ids.append(batch_ids)
        bounds.append(bounds[-1] + lab.size)
    all_labels = np.concatenate(labels)
    if all_labels.dtype == np.bool_:
        all_labels = all_labels.astype(np.int64)
    if not np.issubdtype(all_labels.dtype, np.integer) or (
        all_labels.size and all_labels.min() < 0
    ):
        raise ConfigError("labels must be integers >= 0")
    return _Epoch(
        np.concatenate(grads),
        all_labels.astype(np.int64),
        np.concatenate(ids).astype(np.int64),
        np.concatenate(cands) if cands else None,
        bounds,
    )


def _classes(epoch: _Epoch, classes: int | None) -> int:
    if classes is not None:
        k = check_int(classes, "classes", minimum=2)
    elif epoch.candidates is not None:
        k = epoch.candidates.shape[1]
    else:
        k = max(2, int(epoch.labels.max(initial=0)) + 1)
    if epoch.labels.size and epoch.labels.max() >= k:
        raise ConfigError(f"labels must be < classes = {k}, got {epoch.labels.max()}")
    if epoch.candidates is not None and epoch.candidates.shape[1] != k:
        raise ConfigError(
            f"candidates hold {epoch.candidates.shape[1]} classes, expected {k}"
        )
    return k


def _known_positive(epoch: _Epoch) -> int | None:
    usable = (epoch.labels == 1) & np.any(epoch.gradients != 0, axis=1)
    hits = np.flatnonzero(usable)
    return int(hits[0]) if hits.size else None


def _binary_report(
    epoch: _Epoch, spectral: str, auc_bound: float | None, sda_statistic: str
) -> dict[str, Any]:
    labels = epoch.split(epoch.labels)
    pooled: dict[str, float | None] = {}
    errors: dict[str, float | None] = {}
    verdicts: dict[str, str | None] = dict.fromkeys(BINARY_ATTACKS)
    directions: dict[str, str | None] = dict.fromkeys(BINARY_ATTACKS)
    per_batch: dict[str, dict[str, float | int]] = {}
    n_pos = int(np.count_nonzero(epoch.labels == 1))
    n_neg = int(epoch.labels.size - n_pos)

    def record(name: str, scores: np.ndarray, batch_scores: list[np.ndarray]) -> None:
        auc = pooled_auc(epoch.labels, scores)
        if math.isfinite(auc):
            directions[name] = AS_SCORED
            if auc < 0.5:  # pointed the wrong way: report the attack turned round
                scores, batch_scores = -scores, [-b for b in batch_scores]
                auc = pooled_auc(epoch.labels, scores)
                directions[name] = INVERTED
        pooled[name] = auc
        errors[name] = pooled_auc_standard_error(auc, n_pos, n_neg)
        per_batch[name] = BatchStats.of(batch_aucs(labels, batch_scores)).to_dict()
        if auc_bound is not None:
            exact = boundary_epsilon_bound(epoch.labels, scores, auc)
            verdicts[name] = oriented_verdict(
                auc, n_pos, n_neg, auc_bound, epsilon_lower_bound=exact
            )

    norm = norm_scores(epoch.gradients)
    record("norm", norm, epoch.split(norm))

    known = _known_positive(epoch)
    reference = None if known is None else epoch.gradients[known]
    if reference is None:
        cosine = np.zeros(epoch.labels.size)
    else:
        cosine = cosine_scores(epoch.gradients, reference)
    record("cosine", cosine, epoch.split(cosine))

    if epoch.labels.size > 1:
        guide = reference if spectral == "known-positive" else None
        direction = spectral_direction(epoch.gradients, guide)
        pooled_spectral = (epoch.gradients - epoch.gradients.mean(axis=0)) @ direction
    else:
        direction, pooled_spectral = None, np.zeros(epoch.labels.size)
    spectral_batches = [
        spectral_scores(g, direction=direction)
        if 0 < y.sum() < y.size
        else np.zeros(y.size)
        for g, y in zip(epoch.split(epoch.gradients), labels, strict=True)
    ]
    record("spectral", pooled_spectral, spectral_batches)

    if epoch.candidates is None:
        for name in ("sda", "sda_pooled", "sda_residual"):
            pooled[name] = errors[name] = None
    else:
        sda = sda_scores(epoch.gradients, epoch.candidates, statistic=sda_statistic)
        record("sda", sda, epoch.split(sda))
        distance = sda_scores(epoch.gradients, epoch.candidates, statistic="distance")
        record("sda_pooled", distance, epoch.split(distance))
        residual = [
            sda_residual_scores(g, c)
            for g, c in zip(
                epoch.split(epoch.gradients), epoch.split(epoch.candidates), strict=True
            )
        ]
        record("sda_residual", np.concatenate(residual), residual)
    verdict = {"ceiling_verdict": verdicts} if auc_bound is not None else {}
    return {
        **pooled,
        "standard_error": errors,
        "direction": directions,
        **verdict,
        "positives": n_pos,
        "cosine_positive_id": None if known is None else int(epoch.ids[known]),
        "per_batch": per_batch,
    }


def oriented_verdict(
    auc: float | None,
    n_pos: int,
    n_neg: int,
    ceiling: float | None,
    *,
    epsilon_lower_bound: float | None = None,
) -> str | None:
    """:func:`~tpsl_flwr.attacks.ceiling.ceiling_verdict` of ``max(AUC, 1 - AUC)``.

    The ceiling bounds an attack's score and its negation alike, so an AUC
    far below 0.5 is as telling as one far above. ``epsilon_lower_bound``:
    the exact test of an AUC of exactly 1 or 0 (:func:`boundary_epsilon_bound`).

    Examples
    --------
    >>> oriented_verdict(0.26, 500, 500, 0.7311), oriented_verdict(0.6, 500, 500, None)
    ('within sampling error', None)
    """
    if auc is None or ceiling is None:
        return None
    if auc < 0.5:
        auc, n_pos, n_neg = 1.0 - auc, n_neg, n_pos
    se = pooled_auc_standard_error(auc, n_pos, n_neg)
    return ceiling_verdict(auc, se, ceiling, epsilon_lower_bound=epsilon_lower_bound)


def boundary_epsilon_bound(
    labels: np.ndarray, scores: np.ndarray, auc: float | None
) -> float | None:
    """The exact test of an AUC of exactly 1 or 0, where its standard error is 0.

    The empirical epsilon lower bound at
    :data:`~tpsl_flwr.attacks.ceiling.STRICT_CONFIDENCE` of the scores,
    oriented (:func:`~tpsl_flwr.privacy.empirical.epsilon_lower_bound`, the
    test of ``tpsl-flwr audit``); ``None`` for any other AUC, or where a half
    of the sample holds one class only.

    Examples
    --------
    >>> y = np.arange(4000) % 2
    >>> round(boundary_epsilon_bound(y, y.astype(float), 1.0), 2)
    4.87
    >>> boundary_epsilon_bound(y, y.astype(float), 0.9) is None
    True
    """
    if auc not in (0.0, 1.0):
        return None
    oriented = scores if auc == 1.0 else -scores
    try:
        return epsilon_lower_bound(oriented, labels, STRICT_CONFIDENCE)
    except ConfigError:
        return None


def _multiclass_report(epoch: _Epoch, sda_statistic: str) -> dict[str, Any]:
    if epoch.candidates is None:
        return {"sda_top1": None, "per_batch": {}}
    predictions = sda_predictions(
        epoch.gradients, epoch.candidates, statistic=sda_statistic
    )
    stats = per_batch_top1(epoch.split(epoch.labels), epoch.split(predictions))
    accuracy = top1_accuracy(epoch.labels, predictions)
    return {
        "sda_top1": accuracy,
        "standard_error": {
            "sda_top1": accuracy_standard_error(accuracy, epoch.labels.size)
        },
        "per_batch": {"sda_top1": stats.to_dict()},
    }


def attack_report(
    batches: Sequence[BatchRecord],
    *,
    classes: int | None = None,
    spectral: str = "size",
    auc_bound: float | None = None,
    sda_statistic: str = "coordinate",
) -> dict[str, Any]:
    """Run every gradient attack on one epoch of one party's transcript.

    Parameters
    ----------
    batches
        The epoch's batches, in the order they were received.
    classes
        Number of classes ``k``; by default the candidates' ``k`` if given,
        else ``max(label) + 1`` (at least 2).
    spectral
        Orientation of the spectral attack: ``"size"`` (default, no label:
        the smaller cluster of the epoch is label 1) or ``"known-positive"``
        (the cosine attack's known positive).
    auc_bound
        The ceiling every AUC is judged against (no verdicts without it).
    sda_statistic
        The SDA's statistic (:data:`~tpsl_flwr.attacks.sda.SDA_STATISTICS`):
        ``"coordinate"`` (default, the likelihood ratio of GradPerturb's
        label mixing) or ``"distance"`` (that of isotropic gradient noise);
        :func:`~tpsl_flwr.attacks.sda.sda_statistic` picks it for a
        mechanism.

    Returns
    -------
    dict
        Always ``classes``, ``samples``, ``batches`` and ``per_batch``.
        Binary: the pooled AUCs ``norm``, ``cosine``, ``spectral``, ``sda``
        ``sda_pooled`` (the squared-distance score) and ``sda_residual``
        (energy outside the label plane; all three ``None`` without
        candidates; NaN where the epoch holds one class), each
        ``max(AUC, 1 - AUC)`` with ``direction[name]``: ``"inverted"`` where
        the scores were negated to get it, else ``"as scored"``,
        ``cosine_positive_id`` (the known positive's sample id, ``None`` if
        the epoch has no positive), and ``per_batch[name] = {"mean", "p95",
        "skipped", "evaluated"}`` over the batches holding both classes;
        ``standard_error[name]``, the Hanley-McNeil standard error of each
        pooled AUC over the epoch's ``positives`` and negatives (NaN where
        the AUC is); with ``auc_bound``, ``ceiling_verdict[name]``: ``"below
        the ceiling"``, ``"within sampling error"`` or ``"above the
        ceiling"`` (:func:`oriented_verdict`; ``None`` where no AUC).
        Multi-class: ``sda_top1`` (``None`` without candidates),
        ``standard_error["sda_top1"]`` (binomial) and
        ``per_batch["sda_top1"]``.

    Raises
    ------
    ConfigError
        If the batches are empty, malformed, inconsistent in width, or carry
        candidates for some batches only.

    Examples
    --------
    >>> w = np.array([1.0, -2.0])
    >>> y = np.array([0, 1, 0, 1])
    >>> g = np.outer([0.3, -0.6, 0.2, -0.9], w) / 4  # (sigmoid(z) - y) w, averaged
    >>> report = attack_report([BatchRecord(np.arange(4), g, y)])
    >>> report["norm"], report["cosine"], report["spectral"], report["sda"]
    (1.0, 1.0, 1.0, None)
    >>> report["standard_error"]["norm"]
    0.0
    """
    if spectral not in SPECTRAL_ORIENTATIONS:
        raise ConfigError(
            f"spectral must be one of {SPECTRAL_ORIENTATIONS}, got {spectral!r}"
        )
    if sda_statistic not in SDA_STATISTICS:
        raise ConfigError(
            f"sda_statistic must be one of {SDA_STATISTICS}, got {sda_statistic!r}"
        )
    epoch = _gather(batches)
    k = _classes(epoch, classes)
    if k == 2:
        body = _binary_report(epoch, spectral, auc_bound, sda_statistic)
    else:
        body = _multiclass_report(epoch, sda_statistic)
    return {
        "classes": k,
        "samples": int(epoch.labels.size),
        "batches": len(batches),
        **body,
    }
