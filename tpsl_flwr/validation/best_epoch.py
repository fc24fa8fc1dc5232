"""The best epoch: a paired rule with a margin of the label noise.

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

The epoch kept is post-processing of the noisy validation score
(:mod:`~tpsl_flwr.validation.scores`), so it spends no privacy.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.parties import LabelParty
from tpsl_flwr.validation.noise_margin import label_noise_se

__all__ = ["BestEpoch", "clearly_better"]


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

    The first scored epoch offered is kept (under ``restarts`` only the ends of
    cycles are offered); a later one replaces it only if its
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
