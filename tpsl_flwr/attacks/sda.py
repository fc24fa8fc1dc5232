"""The white-box shortest-distance attack (SDA), at its optimum.

Yang et al., "Differentially Private Label Protection in Split Learning"
(arXiv:2203.02073), Section 3.1 (after Erdogan et al. 2021): an attacker who
knows the label party's parameters computes the gradient ``g_j`` each label
``j`` would produce for each sample and guesses the label whose gradient lies
closest to the one received.

*Which* distance is optimal depends on the shape of the noise. GradPerturb's
output is ``sum_j c_j g_j`` with random label coefficients ``c`` (Laplace,
randomized response; Algorithms 2 and 4): the noise lies in the span of the
candidates and its scale is set in label units, the same for every sample,
while the candidates' own scale ``||g_1 - g_0||`` varies from sample to sample
(and grows apart as the top model trains). The likelihood ratio of a received
gradient is then a function of its **label coordinates** ``q``
(:func:`label_coordinates`): the coefficients of ``received`` in the affine
span of its candidates, ``received = sum_j q_j g_j`` with ``sum_j q_j = 1``.
Binary: ``q_1 = t = <received - g_0, g_1 - g_0> / ||g_1 - g_0||^2``, the
projection onto ``g_1 - g_0`` normalised by the sample's own scale, which is
exactly ``y~ = y + u (1 - 2y)`` for Laplace (the likelihood ratio ``(|t| - |t -
1|) / b`` is monotone in ``t``) and ``y~`` itself for randomized response; the
Gaussian baseline at the logits gives ``t = y - r`` with ``r ~ N(0,
sigma^2)``, likelihood ratio ``(t - 1/2) / sigma^2``. Each is scored by the
closed forms of :mod:`~tpsl_flwr.privacy.closed_forms` on any model, any epoch.

The pooled squared distance ``||g~ - g_0||^2 - ||g~ - g_1||^2 = ||g_1 -
g_0||^2 (2 t - 1)`` weighs each sample's ``t`` by its own gradient scale: it
is the likelihood ratio only where the noise is isotropic in gradient space
(the Gaussian baseline added at the cut layer, Algorithm 3), and elsewhere it
ranks samples with large gradients ahead of confident ones and loses power
(measured in ``docs/attacks.md``). :func:`sda_statistic` picks the optimal one
for a mechanism and placement; the distance stays available as ``"distance"``.
"""

from __future__ import annotations

import numpy as np

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.privacy.mechanisms import Mechanism

__all__ = [
    "COORDINATE_RESOLUTION",
    "SDA_STATISTICS",
    "label_coordinates",
    "merge_close",
    "sda_predictions",
    "sda_residual_scores",
    "sda_scores",
    "sda_statistic",
]

SDA_STATISTICS = ("coordinate", "distance")
"""The SDA's statistics: label coordinates (optimal for GradPerturb's label
mixing) or the Euclidean distance (optimal for isotropic gradient noise)."""

_CHUNK_ROWS = 4096
"""Rows solved at a time by the multi-class coordinates (bounded memory)."""
COORDINATE_RESOLUTION = 1e-5
"""Label coordinates closer than this are one value (see :func:`sda_scores`)."""


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
    if cand.shape[1] < 2:
        raise ConfigError(f"the SDA needs k >= 2 candidates, got {cand.shape[1]}")
    return got, cand


def _check_statistic(statistic: str) -> None:
    if statistic not in SDA_STATISTICS:
        raise ConfigError(
            f"statistic must be one of {SDA_STATISTICS}, got {statistic!r}"
        )


def _squared_distances(got: np.ndarray, cand: np.ndarray) -> np.ndarray:
    return np.sum((got[:, None, :] - cand) ** 2, axis=2)


def sda_statistic(mechanism: Mechanism, placement: str = "logits") -> str:
    """The SDA statistic that is the likelihood ratio for ``mechanism``.

    ``"distance"`` for the Gaussian baseline at the cut layer (noise
    isotropic in gradient space), ``"coordinate"`` otherwise (noise in label
    units along the candidates, the same for every sample).

    Examples
    --------
    >>> from tpsl_flwr.privacy.mechanisms import make_mechanism
    >>> sda_statistic(make_mechanism("laplace", epsilon=1.0), "cut")
    'coordinate'
    >>> sda_statistic(make_mechanism("gaussian", sigma=1.0), "cut")
    'distance'
    """
    if placement not in ("logits", "cut"):
        raise ConfigError(f"placement must be 'logits' or 'cut', got {placement!r}")
    return "distance" if mechanism.additive and placement == "cut" else "coordinate"


def label_coordinates(received: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Each received gradient's coordinates in the affine span of its candidates.

    The ``q`` with ``sum_j q_j = 1`` whose ``sum_j q_j g_j`` is the least-squares
    fit of ``received`` (Yang et al., Algorithms 2 and 4: GradPerturb sends
    ``sum_j c_j g_j``). Binary: ``q_1 = <received - g_0, g_1 - g_0> / ||g_1 -
    g_0||^2`` (``1/2``, no evidence either way, where ``g_1 = g_0``). k
    classes at the logits, with ``p`` the softmax output and the
    candidates' differences independent: ``q = c - (sum_j c_j - 1) p``, which
    is ``c`` for randomized response (``e_y~``) and for every coefficient
    vector that sums to 1.

    Parameters
    ----------
    received
        ``(n, d)`` per-sample gradients the non-label party received.
    candidates
        ``(n, k, d)`` per-sample gradients for each label.

    Returns
    -------
    numpy.ndarray
        ``(n, k)`` float64 coordinates, each row summing to 1.

    Examples
    --------
    >>> g0, g1 = np.array([0.3, -0.6]), np.array([-0.7, 1.4])
    >>> cand = np.array([[g0, g1], [10 * g0, 10 * g1]])
    >>> got = np.array([0.75 * g0 + 0.25 * g1, 10 * (0.75 * g0 + 0.25 * g1)])
    >>> label_coordinates(got, cand)
    array([[0.75, 0.25],
           [0.75, 0.25]])
    """
    got, cand = _check(received, candidates)
    n, k, _ = cand.shape
    out = np.empty((n, k), dtype=np.float64)
    for start in range(0, n, _CHUNK_ROWS):
        rows = slice(start, start + _CHUNK_ROWS)
        out[rows] = _coordinates(got[rows], cand[rows])
    return out


def _coordinates(got: np.ndarray, cand: np.ndarray) -> np.ndarray:
    base = cand[:, 0, :]
    steps = cand[:, 1:, :] - base[:, None, :]  # (n, k - 1, d)
    offset = got - base
    if cand.shape[1] == 2:
        step = steps[:, 0, :]
        scale = np.einsum("nd,nd->n", step, step)
        along = np.einsum("nd,nd->n", offset, step)
        safe = np.where(scale > 0, scale, 1.0)
        t = np.where(scale > 0, along / safe, 0.5)
        return np.stack([1.0 - t, t], axis=1)
    gram = np.einsum("nid,njd->nij", steps, steps)
    rhs = np.einsum("nid,nd->ni", steps, offset)
    # Least squares through the pseudo-inverse of the Gram matrix: a slice
    # narrower than k - 1, or a dead unit, leaves directions unidentified.
    weights = np.einsum("nij,nj->ni", np.linalg.pinv(gram, hermitian=True), rhs)
    return np.concatenate([1.0 - weights.sum(axis=1, keepdims=True), weights], axis=1)


def sda_scores(
    received: np.ndarray,
    candidates: np.ndarray,
    *,
    statistic: str = "coordinate",
    resolution: float = COORDINATE_RESOLUTION,
) -> np.ndarray:
    """Binary SDA score, high meaning label 1.

    Parameters
    ----------
    received
        ``(n, d)`` per-sample gradients the non-label party received.
    candidates
        ``(n, 2, d)`` per-sample gradients for label 0 and label 1.
    statistic
        ``"coordinate"`` (default): the label coordinate ``t`` of
        :func:`label_coordinates`, the likelihood-ratio statistic of
        GradPerturb's label mixing; ``"distance"``: the pooled
        ``||g~ - g_0||^2 - ||g~ - g_1||^2``, that of isotropic gradient noise
        (:func:`sda_statistic` says which fits a mechanism).
    resolution
        Label coordinates closer than this are one value
        (:func:`merge_close`): float32 rounding must not break a release's
        ties. 0 for exact (float64) gradients.

    Returns
    -------
    numpy.ndarray
        ``(n,)`` scores.

    Examples
    --------
    >>> g = np.array([[0.9], [-0.1]])
    >>> cand = np.array([[[0.9], [-0.1]], [[0.9], [-0.1]]])
    >>> sda_scores(g, cand), sda_scores(g, cand, statistic="distance")
    (array([0., 1.]), array([-1.,  1.]))
    """
    _check_statistic(statistic)
    got, cand = _check(received, candidates)
    if cand.shape[1] != 2:
        raise ConfigError(f"binary SDA needs 2 candidates, got {cand.shape[1]}")
    if statistic == "distance":
        dist = _squared_distances(got, cand)
        return dist[:, 0] - dist[:, 1]
    if resolution < 0 or not np.isfinite(resolution):
        raise ConfigError(f"resolution must be >= 0 and finite, got {resolution}")
    return merge_close(_coordinates(got, cand)[:, 1], resolution)


def merge_close(values: np.ndarray, resolution: float) -> np.ndarray:
    """``values`` with every run of neighbours closer than ``resolution`` made one.

    A label coordinate computed from float32 gradients carries rounding of
    about ``1e-7`` relative (at most ``4.3e-7`` measured through a ReLU top
    model); where releases tie exactly (randomized response's ``y~``, the
    clipped ends of a Laplace release) that rounding would break the ties at
    random and add variance to the AUC (measured: 0.7274 and 0.7253 in the
    two epochs of one run on 7,957 rows at eps 1, the same released labels).
    Sorted values whose gap is below ``resolution`` take the first value of
    their run. A run wider than ``100 * resolution`` is a dense stretch of
    distinct values, not a tie (hundreds of thousands of samples), and is
    left as it is.

    Examples
    --------
    >>> merge_close(np.array([1.0 + 3e-7, 0.25, 1.0, 0.0, 1e-7]), 1e-5).tolist()
    [1.0, 0.25, 1.0, 0.0, 0.0]
    >>> dense = np.arange(1000) * 5e-6  # every gap below the resolution
    >>> bool(np.all(merge_close(dense, 1e-5) == dense))
    True
    """
    flat = np.asarray(values, dtype=np.float64)
    if flat.size < 2:
        return flat.copy()
    order = np.argsort(flat, kind="stable")
    ranked = flat[order]
    starts = np.r_[True, np.diff(ranked) >= resolution]
    first = np.flatnonzero(starts)
    last = np.r_[first[1:], ranked.size] - 1
    tie = (ranked[last] - ranked[first]) <= 100.0 * resolution
    group = np.cumsum(starts) - 1
    merged = np.where(tie[group], ranked[first][group], ranked)
    out = np.empty_like(flat)
    out[order] = merged
    return out


def sda_predictions(
    received: np.ndarray, candidates: np.ndarray, *, statistic: str = "coordinate"
) -> np.ndarray:
    """Multi-class SDA: the most likely label of each sample, ``(n,)`` int64.

    ``"coordinate"`` (default): the largest label coordinate
    (:func:`label_coordinates`), the nearest candidate in label units: the
    released label itself for randomized response (``q = e_y~``), and the
    attack whose top-1 accuracy the closed forms
    (:func:`~tpsl_flwr.privacy.closed_forms.sda_top1_laplace`,
    ``sda_top1_gaussian``) give at uniform predictions. It is the maximum
    likelihood label for the Gaussian baseline at the logits only where the
    top model's Jacobian keeps the logits' geometry (orthonormal rows): the
    noise's component along ``(1, ..., 1)`` is not in the candidates' span.
    ``"distance"``: the nearest candidate in gradient space (the maximum
    likelihood label under isotropic gradient noise).

    Examples
    --------
    >>> cand = np.array([[[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]])
    >>> sda_predictions(np.array([[0.1, 0.8]]), cand)
    array([1])
    """
    _check_statistic(statistic)
    got, cand = _check(received, candidates)
    if statistic == "distance":
        return np.argmin(_squared_distances(got, cand), axis=1).astype(np.int64)
    return np.argmax(label_coordinates(got, cand), axis=1).astype(np.int64)


def sda_residual_scores(received: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """White-box residual attack on one batch: energy outside the label's plane.

    GradPerturb's output lies in the span of the sample's own candidates
    (Yang et al., Algorithms 2 and 4), and so does every label mixer's: the
    part of ``received - g_0`` outside ``g_1 - g_0`` is rounding. A defense
    whose noise *shape* depends on the label leaves more there. Marvell (Li
    et al. 2022, Section 4) adds noise along the batch's ``g1 - g0`` to both
    classes and isotropic noise to the class of smaller gradient variance
    only (its sum-KL optimum), so the energy left outside the plane of the
    sample's ``g_1 - g_0`` and the batch's top principal direction (where
    ``g1 - g0`` lies: the attacker sees the whole batch) is about ``lam2
    (d - 2)`` for one class and near 0 for the other. The score is that
    energy, label-free; which class is high is the report's orientation.

    Parameters
    ----------
    received
        ``(n, d)`` per-sample gradients of one batch.
    candidates
        ``(n, 2, d)`` per-sample gradients for label 0 and label 1.

    Returns
    -------
    numpy.ndarray
        ``(n,)`` float64 residual energies; 0 where the energy is below
        ``COORDINATE_RESOLUTION**2`` of the gradient's own (rounding), and
        for a batch of one row or a width below 3 (the plane is everything).

    Examples
    --------
    Label 0 given isotropic noise (here off the plane), label 1 none:

    >>> j = np.array([[1.0, 0, 0, 0, 0], [0.8, 0.2, 0, 0, 0],
    ...               [0.9, 0, 0.1, 0, 0], [1.0, 0.1, 0, 0, 0]])
    >>> cand = np.stack([0.2 * j, -0.8 * j], axis=1)  # (p - y) dz/de, p = 0.2
    >>> y = np.array([0, 1, 0, 1])
    >>> noise = np.zeros((4, 5))
    >>> noise[0, 3] = noise[2, 4] = 0.5
    >>> sda_residual_scores(cand[np.arange(4), y] + noise, cand).round(4).tolist()
    [0.1312, 0.0, 0.1487, 0.0]
    """
    got, cand = _check(received, candidates)
    if cand.shape[1] != 2:
        raise ConfigError(f"binary SDA needs 2 candidates, got {cand.shape[1]}")
    n, d = got.shape
    if n < 2 or d < 3:
        return np.zeros(n)
    centred = got - got.mean(axis=0)
    top = np.linalg.svd(centred, full_matrices=False)[2][0]  # (d,)
    step = cand[:, 1, :] - cand[:, 0, :]
    step = step - np.outer(step @ top, top)
    norm = np.linalg.norm(step, axis=1, keepdims=True)
    unit = np.divide(step, norm, out=np.zeros_like(step), where=norm > 0)
    offset = got - cand[:, 0, :]
    offset = offset - np.outer(offset @ top, top)
    offset = offset - np.einsum("nd,nd->n", offset, unit)[:, None] * unit
    energy = np.einsum("nd,nd->n", offset, offset)
    # Rounding (float32 transport) is no evidence: below the coordinates'
    # resolution, relative to the gradient itself, the energy is 0.
    floor = COORDINATE_RESOLUTION**2 * np.einsum("nd,nd->n", got, got)
    return np.where(energy > floor, energy, 0.0)
