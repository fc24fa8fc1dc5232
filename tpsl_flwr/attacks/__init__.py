"""Label-inference attacks as pure scorers over what a non-label party receives.

Each attack is a numpy function of precomputed signals (the dispatched
gradients and, white-box, the candidate gradients; or, population-level, the
attacker's own embeddings), in the manner of ML Privacy Meter, and returns one
score per sample, high meaning label 1; metrics (AUC, top-1 accuracy) are
computed separately (:mod:`tpsl_flwr.attacks.metrics`).

Gradient attacks (what label DP bounds): :func:`norm_scores`,
:func:`cosine_scores`, :func:`spectral_scores`, :func:`sda_scores` /
:func:`sda_predictions` (white-box, on each sample's :func:`label_coordinates`,
the statistic :func:`sda_statistic` picks for a mechanism),
:func:`sda_residual_scores` (white-box, the energy outside each sample's
label plane), all run on an epoch by :func:`attack_report`.
Population-level attacks (what label DP does not bound, see
:mod:`tpsl_flwr.attacks.population`): :func:`model_completion_scores`,
:func:`clustering_scores`.
"""

from tpsl_flwr.attacks.clustering import clustering_scores
from tpsl_flwr.attacks.completion import (
    model_completion_probabilities,
    model_completion_scores,
)
from tpsl_flwr.attacks.cosine import cosine_scores
from tpsl_flwr.attacks.metrics import (
    BatchStats,
    batch_aucs,
    per_batch_auc,
    per_batch_top1,
    pooled_auc,
    top1_accuracy,
)
from tpsl_flwr.attacks.norm import norm_scores
from tpsl_flwr.attacks.report import BatchRecord, attack_report
from tpsl_flwr.attacks.sda import (
    label_coordinates,
    sda_predictions,
    sda_residual_scores,
    sda_scores,
    sda_statistic,
)
from tpsl_flwr.attacks.signals import per_sample_gradients
from tpsl_flwr.attacks.spectral import spectral_direction, spectral_scores

__all__ = [
    "BatchRecord",
    "BatchStats",
    "attack_report",
    "batch_aucs",
    "clustering_scores",
    "cosine_scores",
    "label_coordinates",
    "model_completion_probabilities",
    "model_completion_scores",
    "norm_scores",
    "per_batch_auc",
    "per_batch_top1",
    "per_sample_gradients",
    "pooled_auc",
    "sda_predictions",
    "sda_residual_scores",
    "sda_scores",
    "sda_statistic",
    "spectral_direction",
    "spectral_scores",
    "top1_accuracy",
]
