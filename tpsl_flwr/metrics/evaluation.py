"""Test metrics computed at the label party (labels never leave it)."""

from __future__ import annotations

import numpy as np

from tpsl_flwr.metrics.auc import binary_auc

__all__ = ["classification_metrics", "log_loss"]


def classification_metrics(
    labels: np.ndarray, probabilities: np.ndarray
) -> dict[str, float]:
    """Test AUC (binary), accuracy and log-loss from class probabilities.

    The probabilities are clipped to ``[1e-12, 1]`` and renormalized in one
    float64 copy, changed in place: the metrics' transient memory is a few
    arrays of ``n`` values, not several ``(n, k)`` ones (the test set grows
    with the rows, issue 22).

    Parameters
    ----------
    labels
        ``(n,)`` true labels in ``0..k-1``.
    probabilities
        ``(n, k)`` predicted class probabilities.

    Returns
    -------
    dict
        ``test_accuracy``, ``test_logloss`` and, for two classes, ``test_auc``
        (NaN if the test labels hold a single class).

    Raises
    ------
    ValueError
        For a label outside ``0..k-1``, naming it.
    """
    y = np.asarray(labels, dtype=np.int64)
    p = np.array(probabilities, dtype=np.float64)  # the one copy
    np.clip(p, 1e-12, 1.0, out=p)
    p /= p.sum(axis=1, keepdims=True)
    k = p.shape[1]
    out = {
        "test_accuracy": float(np.mean(p.argmax(axis=1) == y)),
        "test_logloss": log_loss(y, p),
    }
    if k == 2:
        positive = p[:, 1].copy()
        del p  # the AUC's sort needs only the positive column
        out["test_auc"] = binary_auc(y, positive)
    return out


def log_loss(labels: np.ndarray, probabilities: np.ndarray) -> float:
    """Mean negative log-probability of the true class, as scikit-learn's.

    Bitwise ``sklearn.metrics.log_loss(labels, probabilities,
    labels=range(k))`` for float64 probabilities whose rows sum to one (a
    test checks it): each row's true-class probability is clipped to
    ``[eps, 1 - eps]`` (float64 ``eps``) and the losses averaged, but only the
    ``n`` picked probabilities are held, not the one-hot labels and clipped
    copies of the whole ``(n, k)`` matrix.

    Parameters
    ----------
    labels
        ``(n,)`` integer labels in ``0..k-1``.
    probabilities
        ``(n, k)`` float64 class probabilities.

    Raises
    ------
    ValueError
        For a label outside ``0..k-1``, naming it.

    Examples
    --------
    >>> round(log_loss(np.array([0, 1]), np.array([[0.5, 0.5], [0.2, 0.8]])), 4)
    0.4581
    """
    y = np.asarray(labels, dtype=np.int64)
    k = probabilities.shape[1]
    if y.size and (y.min() < 0 or y.max() >= k):
        bad = int(y.min()) if y.min() < 0 else int(y.max())
        raise ValueError(f"test label {bad} is not one of the {k} classes 0..{k - 1}")
    eps = np.finfo(np.float64).eps
    picked = np.take_along_axis(probabilities, y[:, None], axis=1)[:, 0]
    picked = picked.astype(np.float64, copy=False)
    np.clip(picked, eps, 1.0 - eps, out=picked)
    np.log(picked, out=picked)
    np.negative(picked, out=picked)
    return float(np.mean(picked))
