"""Per-batch gradient noise (Marvell, max-norm) with the label party's key.

The mechanisms of Li et al. 2022 ("Label Leakage and Protection in Two-party
Split Learning", ICLR) shape their noise from the batch's clean cut-layer
gradients and labels, so they have no per-label sampler: the label party
computes the exact per-sample gradients ``g_y``, and
:func:`perturb_gradients` draws the batch's standard normals from the secret
key (one fresh stream per training step, :func:`gradient_noise_stream`) and
hands them to the mechanism's ``perturb_batch``
(:class:`~tpsl_flwr.privacy.mechanisms.base.Mechanism`).
Anything not finite is refused (fail closed: nothing is sent).
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtri

from tpsl_flwr.errors import PrivacyError
from tpsl_flwr.privacy.keyed_noise import NoiseKey, open_uniforms
from tpsl_flwr.privacy.mechanisms.base import BatchReference, Mechanism

__all__ = ["gradient_noise_stream", "keyed_normals", "perturb_gradients"]

_STREAMS = 2**32 - 1


def gradient_noise_stream(step: int) -> int:
    """The keyed stream of training step ``step`` (>= 0): fresh noise every step.

    Examples
    --------
    >>> gradient_noise_stream(0), gradient_noise_stream(41)
    (1, 42)
    """
    return 1 + int(step) % _STREAMS


def keyed_normals(
    key: NoiseKey, ids: np.ndarray, stream: int, width: int
) -> np.ndarray:
    """``(n, width)`` standard normals, a keyed function of (key, id, stream)."""
    return np.asarray(ndtri(open_uniforms(key.words(ids, stream, width))))


def perturb_gradients(
    mechanism: Mechanism,
    grads: np.ndarray,
    labels: np.ndarray,
    *,
    ids: np.ndarray,
    key: NoiseKey,
    stream: int,
    reference: BatchReference | None,
) -> tuple[np.ndarray, BatchReference | None]:
    """A gradient-noise mechanism's output for one batch.

    Parameters
    ----------
    mechanism
        A mechanism with ``gradient_noise`` (Marvell, max-norm).
    grads
        ``(n, d)`` clean per-sample cut-layer gradients ``g_y`` (float64).
    labels
        ``(n,)`` the batch's labels.
    ids
        ``(n,)`` the batch's sample ids (they key the normals).
    key
        The label party's secret noise key.
    stream
        The step's stream (:func:`gradient_noise_stream`).
    reference
        What the previous batch left (Marvell's last two-class solution).

    Returns
    -------
    tuple
        The ``(n, d)`` noisy gradients and the reference for the next batch.

    Raises
    ------
    PrivacyError
        For a mechanism without gradient noise, gradients or output that are
        not finite, or what the mechanism itself refuses.
    """
    if not mechanism.gradient_noise:
        raise PrivacyError(f"mechanism {mechanism.name!r} adds no gradient noise")
    g = np.asarray(grads, dtype=np.float64)
    if g.ndim != 2 or g.shape[0] != np.asarray(labels).size:
        raise PrivacyError(f"gradients of shape {g.shape} do not fit the batch")
    if not np.isfinite(g).all():
        raise PrivacyError("the clean gradients are not finite; nothing sent")
    normals = keyed_normals(key, ids, stream, mechanism.noise_width(g.shape[1]))
    noisy, kept = mechanism.perturb_batch(g, np.asarray(labels), normals, reference)
    if noisy.shape != g.shape or not np.isfinite(noisy).all():
        raise PrivacyError(f"{mechanism.name}: the noisy gradients are not finite")
    return noisy, kept
