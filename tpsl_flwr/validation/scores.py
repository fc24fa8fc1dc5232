"""The validation score: the top model's log loss against noisy, debiased labels.

The score uses noisy labels only. Validation ids are never trained on.
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

import numpy as np
import torch

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.parties import LabelParty
from tpsl_flwr.parties.label_party import noise_stream
from tpsl_flwr.privacy.mechanisms import Mechanism
from tpsl_flwr.privacy.noisy_labels import STREAM_TRANSCRIPT, draw_noisy_labels
from tpsl_flwr.privacy.perturb import per_class_losses
from tpsl_flwr.privacy.posterior import unbiased_coefficients

__all__ = [
    "check_validation_mechanism",
    "noisy_validation_loss",
    "noisy_validation_losses",
    "unbiased_targets",
    "validation_class_losses",
]


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
    if mechanism.additive or mechanism.gradient_noise:
        raise ConfigError(
            f"validation scores noisy labels, but mechanism {mechanism.name!r} "
            "adds its noise to the gradients and leaves the labels clean; use "
            "validation-fraction = 0 with it"
        )
    if not mechanism.keyed_labels():
        raise ConfigError(
            f"validation scores noisy labels drawn for the held-out ids alone, "
            f"but mechanism {mechanism.name!r} draws each label with a prior "
            "from training; use validation-fraction = 0 with it"
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
