"""Test metrics computed at the label party (labels never leave it)."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import log_loss

from tpsl_flwr.auc import binary_auc


def classification_metrics(
    labels: np.ndarray, probabilities: np.ndarray
) -> dict[str, float]:
    """Test AUC (binary), accuracy and log-loss from class probabilities.

    Parameters
    ----------
    labels
        ``(n,)`` true labels.
    probabilities
        ``(n, k)`` predicted class probabilities.

    Returns
    -------
    dict
        ``test_accuracy``, ``test_logloss`` and, for two classes, ``test_auc``
        (NaN if the test labels hold a single class).
    """
    y = np.asarray(labels, dtype=np.int64)
    p = np.clip(np.asarray(probabilities, dtype=np.float64), 1e-12, 1.0)
    p = p / p.sum(axis=1, keepdims=True)
    k = p.shape[1]
    out = {
        "test_accuracy": float(np.mean(p.argmax(axis=1) == y)),
        "test_logloss": float(log_loss(y, p, labels=list(range(k)))),
    }
    if k == 2:
        out["test_auc"] = binary_auc(y, p[:, 1])
    return out
