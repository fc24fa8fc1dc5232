"""The white-box shortest-distance attack (SDA).

Yang et al., Section 3.1 (after Erdogan et al. 2021): an attacker who knows the
label party's parameters computes the gradient ``g_j`` each label ``j`` would
produce and guesses the label whose gradient lies closest to the one received.
"""

from __future__ import annotations

import numpy as np

from tpsl_flwr.errors import ConfigError


def _check(
    received: np.ndarray, candidates: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    got = np.asarray(received, dtype=np.float64)
    cand = np.asarray(candidates, dtype=np.float64)
    if got.ndim == 1:
        got = got[:, None]
    if cand.ndim == 2:
        cand = cand[:, :, None]
    if cand.ndim != 3 or got.ndim != 2 or cand.shape[0] != got.shape[0]:
        raise ConfigError(
            f"received gradients (n, d) and candidates (n, k, d) must agree, got "
            f"{np.shape(received)} and {np.shape(candidates)}"
        )
    if cand.shape[2] != got.shape[1]:
        raise ConfigError(
            f"gradient widths differ: received {got.shape[1]}, "
            f"candidates {cand.shape[2]}"
        )
    return got, cand


def _squared_distances(received: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    got, cand = _check(received, candidates)
    return np.sum((got[:, None, :] - cand) ** 2, axis=2)


def sda_scores(received: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Binary SDA score ``||g~ - g_0||^2 - ||g~ - g_1||^2`` (high means label 1).

    Parameters
    ----------
    received
        ``(n, d)`` gradients the non-label party received.
    candidates
        ``(n, 2, d)`` gradients for label 0 and label 1.

    Returns
    -------
    numpy.ndarray
        ``(n,)`` scores.

    Examples
    --------
    >>> g = np.array([[0.9], [-0.1]])
    >>> cand = np.array([[[0.9], [-0.1]], [[0.9], [-0.1]]])
    >>> sda_scores(g, cand)
    array([-1.,  1.])
    """
    dist = _squared_distances(received, candidates)
    if dist.shape[1] != 2:
        raise ConfigError(f"binary SDA needs 2 candidates, got {dist.shape[1]}")
    return dist[:, 0] - dist[:, 1]


def sda_predictions(received: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Multi-class SDA: the label whose gradient is closest, ``(n,)`` int64."""
    return np.argmin(_squared_distances(received, candidates), axis=1).astype(np.int64)
