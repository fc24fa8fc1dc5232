"""Validation at the label party: held-out ids, a noisy-label score, the best epoch.

Noise is reused per sample, so a protected model fits the same noisy labels
harder every epoch and its test AUC can peak and fall. The label party holds out
a validation set, scores each epoch on it and, at the end, restores the best
epoch's models: its own top model, and (by a message naming the epoch) the
nodes' bottom models. "Best" is a paired rule with a margin of one standard
error of the label noise (:func:`clearly_better`,
:func:`~tpsl_flwr.validation.noise_margin.label_noise_se`): the debiased noisy
score's variance grows with the logits' size, so an overconfident late epoch's
mean can read low by chance; a later epoch replaces the kept one only when it
is lower on the same ids by more than the standard error that the mechanism's
noise adds to the mean difference. That error is computed from the mechanism's
law, not estimated from the held-out ids: the ids' own sampling error is common
to every way of choosing and, on a small validation set (``digits``: ~140 ids),
its estimate is dominated by a few confident mistakes, which kept early epochs
the later ones beat (``none``, seed 1: epoch 1 at 0.914 against 0.945). With
clean labels (``none``) the margin is 0: the lowest mean wins.

What the stopping decision reveals, and why the stated epsilon holds:

* **Membership is public.** A training id is held out iff a hash of the id and
  the run's seed falls below ``validation_fraction``
  (:func:`validation_ids`): a function of the id alone, never of a label.
* **The score uses noisy labels only.** Validation ids are never trained on.
  Their labels pass through the run's own mechanism once, with the label
  party's key (the transcript stream of epoch 0, as training draws it: the one
  stream of every epoch with ``reuse_noise``, else epoch 0's fresh one, so a
  held-out label's draw is the one it would get if trained on, and two runs
  differing only in the hold-out release the same draws), and the score is the
  mean log loss against those noisy labels, debiased to be an unbiased
  estimate of the clean log loss (:func:`noisy_validation_loss`). Every
  decision made from it, the epoch kept and the ``keep-best`` messages the
  nodes see, is post-processing of an ``epsilon``-DP release of each
  validation label (Dwork and Roth, Prop. 2.1), on labels disjoint from the
  training labels; so every label, trained on or held out, stays within the
  run's epsilon. Without protection (``none``) the score uses clean labels, as
  there is nothing to keep.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from tpsl_flwr._util.compact_ints import index_dtype, true_positions
from tpsl_flwr.data.membership import hash_uniform
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.parties import LabelParty
from tpsl_flwr.parties.label_party import noise_stream
from tpsl_flwr.privacy.mechanisms import Mechanism
from tpsl_flwr.privacy.noisy_labels import STREAM_TRANSCRIPT, draw_noisy_labels
from tpsl_flwr.privacy.perturb import per_class_losses
from tpsl_flwr.privacy.posterior import unbiased_coefficients
from tpsl_flwr.validation.noise_margin import label_noise_se

__all__ = [
    "BestEpoch",
    "clearly_better",
    "noisy_validation_loss",
    "noisy_validation_losses",
    "unbiased_targets",
    "validation_class_losses",
    "validation_ids",
]

_VALIDATION_DOMAIN = 0x76616C69  # ASCII "vali": apart from the test split's hash


def validation_ids(num_train: int, fraction: float, seed: int) -> np.ndarray:
    """Training ids held out for validation: a hash of the id and seed alone.

    Parameters
    ----------
    num_train
        Training ids are ``0..num_train-1`` (positions in record-id order).
    fraction
        Probability of an id being held out, in ``[0, 0.5)``; 0: none.
    seed
        The run's public seed.

    Returns
    -------
    np.ndarray
        Sorted int64 ids; empty for ``fraction = 0``.

    Examples
    --------
    >>> ids = validation_ids(10_000, 0.1, seed=0)
    >>> 900 < ids.size < 1100, bool((np.diff(ids) > 0).all())
    (True, True)
    """
    if not 0.0 <= fraction < 0.5:
        raise ConfigError(f"validation fraction must be in [0, 0.5), got {fraction}")
    if fraction == 0.0:
        return np.zeros(0, dtype=np.int64)
    positions = np.arange(num_train, dtype=index_dtype(num_train))
    held_out = hash_uniform(positions, seed ^ _VALIDATION_DOMAIN) < fraction
    return positions[held_out].astype(np.int64)


def check_validation_mechanism(mechanism: Mechanism) -> None:
    """Refuse validation for a mechanism that leaves the labels clean.

    Scoring the held-out ids needs an eps-DP release of their labels; the
    Gaussian baseline perturbs gradients only, so a score (and the best-epoch
    messages the nodes see) would reveal clean labels outside the accounting.
    Called before the first step, so the refusal comes before any gradient.

    Raises
    ------
    ConfigError
        Naming the mechanism and the fix.
    """
    if mechanism.additive:
        raise ConfigError(
            f"validation scores noisy labels, but mechanism {mechanism.name!r} "
            "adds its noise to the gradients and leaves the labels clean; use "
            "validation-fraction = 0 with it"
        )


def unbiased_targets(party: LabelParty, ids: np.ndarray) -> np.ndarray:
    """Each validation label's noisy coefficients, debiased: ``E = one_hot(y)``.

    Drawn on epoch 0's transcript stream (:func:`noise_stream`), the draw
    training would give the id. Laplace: ``e_y + noise`` clipped to ``[0, 1]``
    and debiased (:mod:`~tpsl_flwr.privacy.clipped_release`). Randomized
    response's one-hot ``e_{y~}`` has mean ``q e_y + (1 - q)/(k - 1) (1 - e_y)``
    (``q`` the keep probability), so ``(c - r) / (q - r)`` with
    ``r = (1 - q)/(k - 1)`` is unbiased. ``none`` returns the clean labels.

    Raises
    ------
    ConfigError
        For a mechanism that leaves the labels clean while protecting the
        gradients (the Gaussian baseline): scoring on them would reveal the
        labels outside the accounting.
    """
    mechanism = party.mechanism
    check_validation_mechanism(mechanism)
    stream = noise_stream(STREAM_TRANSCRIPT, 0, party.reuse_noise)
    noisy = draw_noisy_labels(mechanism, party.labels[ids], ids, party.key, stream)
    return unbiased_coefficients(mechanism=mechanism, coefficients=noisy.coefficients)


@torch.no_grad()
def validation_class_losses(
    party: LabelParty, embeddings: torch.Tensor | np.ndarray
) -> np.ndarray:
    """Each validation id's loss under each label, ``(n, k)`` float64.

    The top model runs in blocks (:meth:`LabelParty.top_in_blocks`), so
    its activations do not grow with the validation set (issue 22's bounded
    memory: one pass over 50k ids of the DLRM top held ~750 B per row).
    """
    parts = [
        per_class_losses(logits).double().numpy()
        for logits in party.top_in_blocks(embeddings)
    ]
    return np.concatenate(parts, axis=0)


def noisy_validation_losses(
    party: LabelParty, targets: np.ndarray, embeddings: torch.Tensor | np.ndarray
) -> np.ndarray:
    """Each validation id's log loss against its debiased noisy target.

    Each entry is an unbiased estimate of that id's clean log loss; their
    variance grows with the logits' size (the loss of the class not chosen
    multiplies the noise).
    """
    losses = validation_class_losses(party, embeddings)
    return np.asarray((losses * targets).sum(axis=1), dtype=np.float64)


def noisy_validation_loss(
    party: LabelParty, targets: np.ndarray, embeddings: torch.Tensor | np.ndarray
) -> float:
    """Mean log loss of the top model against debiased noisy targets.

    An unbiased estimate of the clean validation log loss; lower is better.
    """
    return float(noisy_validation_losses(party, targets, embeddings).mean())


def clearly_better(
    *,
    candidate: np.ndarray,
    incumbent: np.ndarray,
    num_se: float = 1.0,
    se: float | None = None,
) -> bool:
    """Whether ``candidate``'s losses beat ``incumbent``'s beyond their noise.

    A paired test on the same ids: with ``d = candidate - incumbent``, True iff
    ``mean(d) < -num_se * se``. Pairing removes what the two epochs share (each
    id's noisy target multiplies both losses); what is left grows with how far
    the epochs' logits differ, which is where the debiased score is least
    reliable. The margin keeps the incumbent, the earlier epoch, unless the
    later one is better by more than the noise (the one-standard-error rule of
    Hastie, Tibshirani and Friedman, *The Elements of Statistical Learning*,
    2nd ed., Sec. 7.10).

    Parameters
    ----------
    candidate, incumbent
        Per-id losses of two models on the same ids, in the same order.
    num_se
        The margin in standard errors, ``>= 0``; 0: any lower mean wins.
    se
        The standard error of ``mean(d)`` to use, ``>= 0``: the label noise's
        (:func:`~tpsl_flwr.validation.noise_margin.label_noise_se`). None: the
        sample one, ``std(d) / sqrt(n)``.

    Examples
    --------
    >>> base = np.array([0.2, 0.9, 0.4, 0.7])
    >>> clearly_better(candidate=base - 0.1, incumbent=base)
    True
    >>> clearly_better(candidate=base + [-0.3, 0.3, -0.3, 0.2], incumbent=base)
    False
    >>> clearly_better(candidate=base - 0.1, incumbent=base, se=0.2)
    False
    """
    if not (np.isfinite(num_se) and num_se >= 0):
        raise ConfigError(f"num_se must be >= 0 and finite, got {num_se}")
    if se is not None and not (np.isfinite(se) and se >= 0):
        raise ConfigError(f"se must be >= 0 and finite, got {se}")
    if candidate.shape != incumbent.shape or candidate.ndim != 1:
        raise ConfigError(
            f"paired losses need two vectors of one length, got shapes "
            f"{candidate.shape} and {incumbent.shape}"
        )
    diff = np.asarray(candidate, dtype=np.float64) - incumbent
    mean = float(diff.mean())
    if not np.isfinite(mean) or mean >= 0.0:
        return False
    if se is None:
        se = float(diff.std(ddof=1)) / np.sqrt(diff.size) if diff.size > 1 else 0.0
    return bool(mean < -num_se * se)


class BestEpoch:
    """The epoch kept by the paired rule with a label-noise margin, and its top model.

    The first scored epoch is kept; a later one replaces it only if its
    per-id validation losses are :func:`clearly_better` than the kept epoch's
    on the same held-out ids, by ``num_se`` standard errors of the label noise
    (:func:`~tpsl_flwr.validation.noise_margin.label_noise_se`, from both
    epochs' per-class losses). Without per-class losses on both sides, the
    sample standard error of the differences stands in. The kept epoch's
    losses are part of the state (:meth:`state_dict`), so a resumed run
    decides as one that never stopped.
    """

    def __init__(self, num_se: float = 1.0) -> None:
        self.num_se = num_se
        self.epoch: int | None = None
        self.score = float("inf")
        self.losses: np.ndarray | None = None
        """Per-id validation losses of the kept epoch."""
        self.class_losses: np.ndarray | None = None
        """Per-id, per-class losses ``(n, k)`` of the kept epoch."""
        self.top_state: dict[str, Any] | None = None
        self.pending: np.ndarray | None = None
        """Per-id losses of the latest evaluation, for the next :meth:`update`."""
        self.pending_classes: np.ndarray | None = None
        """Per-class losses of the latest evaluation, for the next :meth:`update`."""

    def update(
        self,
        epoch: int,
        score: float,
        party: LabelParty,
        losses: np.ndarray | None = None,
        class_losses: np.ndarray | None = None,
    ) -> bool:
        """Record ``epoch``'s score; True (and keep the top model) if it wins.

        ``losses`` and ``class_losses`` (else :attr:`pending` and
        :attr:`pending_classes`) are the epoch's per-id losses, whose mean is
        ``score``, and its per-class ones. Without per-id losses on both sides
        (a checkpoint written before they were kept), the lower mean wins.
        """
        if losses is None:
            losses, class_losses = self.pending, self.pending_classes
        self.pending = self.pending_classes = None
        if not np.isfinite(score):
            return False
        if self.epoch is not None:
            if losses is not None and self.losses is not None:
                se = None
                if class_losses is not None and self.class_losses is not None:
                    se = label_noise_se(
                        party.mechanism, class_losses, self.class_losses
                    )
                better = clearly_better(
                    candidate=losses,
                    incumbent=self.losses,
                    num_se=self.num_se,
                    se=se,
                )
            else:
                better = score < self.score
            if not better:
                return False
        self.epoch, self.score = epoch, score
        self.losses = None if losses is None else np.array(losses, dtype=np.float64)
        self.class_losses = (
            None if class_losses is None else np.array(class_losses, dtype=np.float64)
        )
        self.top_state = copy.deepcopy(party.top.state_dict())
        return True

    def restore(self, party: LabelParty) -> None:
        """Load the best epoch's top model into ``party``."""
        if self.top_state is not None:
            party.top.load_state_dict(self.top_state)

    def state_dict(self) -> dict[str, Any]:
        """For the label party's checkpoint (tensors: ``weights_only`` loads it)."""

        def tensor(values: np.ndarray | None) -> torch.Tensor | None:
            return None if values is None else torch.from_numpy(values)

        return {
            "epoch": self.epoch,
            "score": self.score,
            "losses": tensor(self.losses),
            "class_losses": tensor(self.class_losses),
            "top": self.top_state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (one without ``losses`` as well)."""

        def array(values: torch.Tensor | None) -> np.ndarray | None:
            return None if values is None else values.double().numpy().copy()

        self.epoch = None if state["epoch"] is None else int(state["epoch"])
        self.score = float(state["score"])
        self.losses = array(state.get("losses"))
        self.class_losses = array(state.get("class_losses"))
        self.top_state = state["top"]
        self.pending = self.pending_classes = None


class Validation:
    """The held-out ids of a run, their debiased noisy targets and the best epoch.

    Parameters
    ----------
    num_train
        Training ids are ``0..num_train-1``.
    fraction, seed
        As :func:`validation_ids`; ``fraction = 0`` holds out nothing.
    """

    def __init__(self, num_train: int, fraction: float, seed: int) -> None:
        self.fraction = float(fraction)
        self.ids = validation_ids(num_train, fraction, seed)
        trained = np.ones(num_train, dtype=bool)
        trained[self.ids] = False
        self.pool = true_positions(trained)
        """The ids trained on (increasing; int32 below 2**31 ids, held a whole run)."""
        self.best = BestEpoch()
        self._targets: np.ndarray | None = None

    @property
    def active(self) -> bool:
        """Whether any id is held out (else every epoch is kept, the last wins)."""
        return bool(self.ids.size)

    def query(self, num_test: int) -> tuple[list[np.ndarray], list[str]]:
        """The ids an evaluation query embeds (validation, then test), their splits."""
        ids, splits = [], []
        if self.active:
            ids.append(self.ids)
            splits.append("train")
        if num_test:
            ids.append(np.arange(num_test, dtype=np.int64))
            splits.append("test")
        return ids, splits

    def score(self, party: LabelParty, embeddings: torch.Tensor | np.ndarray) -> float:
        """The epoch's validation loss (:func:`noisy_validation_loss`).

        Its per-id losses wait in ``best.pending`` for the epoch's decision.
        """
        return self.score_class_losses(
            party, validation_class_losses(party, embeddings)
        )

    def score_class_losses(self, party: LabelParty, class_losses: np.ndarray) -> float:
        """:meth:`score` from the per-class losses ``(n_val, k)`` of the ids.

        The evaluation query computes them chunk by chunk
        (:mod:`~tpsl_flwr.strategies.evaluation_query`).
        """
        if self._targets is None:
            self._targets = unbiased_targets(party, self.ids)
        losses = (class_losses * self._targets).sum(axis=1)
        self.best.pending, self.best.pending_classes = losses, class_losses
        return float(losses.mean())
