"""Label-inference attacks as pure scorers over what a non-label party receives.

Each attack is a numpy function of precomputed signals (the dispatched
gradients and, white-box, the candidate gradients), in the manner of ML Privacy
Meter; metrics (AUC, top-1 accuracy) are computed separately with scikit-learn.
"""

from tpsl_flwr.attacks.sda import sda_predictions, sda_scores

__all__ = ["sda_predictions", "sda_scores"]
