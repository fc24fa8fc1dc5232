"""Closed forms the implementation is held to.

Attack success of the white-box shortest-distance attack (SDA, Yang et al.,
Section 3.1) against each mechanism, and the ceilings that ``(epsilon, 0)``-DP
puts on *any* attack. Tests and ``tpsl-flwr audit`` compare measurements with
these numbers.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import integrate, stats


def auc_bound(epsilon: float) -> float:
    """Ceiling on the AUC of any attack on an ``epsilon``-DP binary label.

    An ``epsilon``-DP test has ``TPR <= e^eps FPR`` and ``1 - FPR <= e^eps
    (1 - TPR)``; the ROC curve through the corner ``(1, e^eps) / (1 + e^eps)``
    bounds the area by ``e^eps / (1 + e^eps)``, which randomized response
    attains.

    Examples
    --------
    >>> round(auc_bound(1.0), 4)
    0.7311
    >>> auc_bound(float("inf"))
    1.0
    """
    if math.isinf(epsilon):
        return 1.0
    return 1.0 / (1.0 + math.exp(-epsilon))


def top1_bound(epsilon: float, max_prior: float) -> float:
    """Ceiling on the top-1 accuracy of any attack on an ``epsilon``-DP label.

    For any output ``o`` with most likely label ``m``, ``P(o | y) >= e^-eps
    P(o | m)`` for every ``y``, hence ``P(correct) <= pi e^eps / (pi e^eps + 1 -
    pi)`` with ``pi`` the largest prior; ``e^eps / (e^eps + k - 1)`` for a
    uniform prior over ``k`` labels.

    Examples
    --------
    >>> round(top1_bound(2.0, 0.1), 4)
    0.4509
    """
    if math.isinf(epsilon):
        return 1.0
    scaled = max_prior * math.exp(epsilon)
    return scaled / (scaled + 1.0 - max_prior)


def sda_auc_laplace(epsilon: float) -> float:
    """SDA AUC against binary Laplace GradPerturb: ``1 - (2 + eps) e^-eps / 4``.

    The SDA score is ``2 t - 1`` with ``t = y + u (1 - 2y)``, so the AUC is
    ``P(u + u' < 1)`` for two iid ``Lap(1/eps)`` draws.

    Examples
    --------
    >>> round(sda_auc_laplace(1.0), 4)
    0.7241
    """
    return 1.0 - (2.0 + epsilon) * math.exp(-epsilon) / 4.0


def sda_auc_randomized_response(epsilon: float) -> float:
    """SDA AUC against binary randomized response: ``e^eps / (1 + e^eps)``."""
    return auc_bound(epsilon)


def sda_auc_gaussian(sigma: float) -> float:
    """SDA AUC against the Gaussian baseline at one logit: ``Phi(1/(sigma sqrt 2))``."""
    return float(stats.norm.cdf(1.0 / (sigma * math.sqrt(2.0))))


def sda_top1_randomized_response(epsilon: float, num_classes: int) -> float:
    """SDA top-1 accuracy against k-ary randomized response: ``e^eps/(e^eps+k-1)``."""
    return 1.0 / (1.0 + (num_classes - 1) * math.exp(-epsilon))


def sda_top1_laplace(epsilon: float, num_classes: int) -> float:
    """SDA top-1 accuracy against multi-class Laplace at uniform predictions.

    With all softmax outputs equal the SDA picks ``argmax_j c_j`` of ``c = e_y
    + U``; it is right iff ``1 + U_y > U_j`` for all ``j != y``:
    ``int f(x) F(x + 1)^(k-1) dx`` with ``U ~ Lap(2/eps)``.
    """
    scale = 2.0 / epsilon
    dist = stats.laplace(scale=scale)
    # Beyond 60 scales the integrand is below e^-60: integrate a finite range
    # so the kinks at -1 and 0 can be given as break points.
    value, _ = integrate.quad(
        lambda x: dist.pdf(x) * dist.cdf(x + 1.0) ** (num_classes - 1),
        -60.0 * scale,
        60.0 * scale,
        points=[-1.0, 0.0],
        limit=400,
    )
    return float(value)


def sda_top1_gaussian(sigma: float, num_classes: int) -> float:
    """SDA top-1 accuracy against the Gaussian baseline at uniform predictions.

    The perturbed logit gradient is ``p - e_y + r``; the SDA is right iff ``r_j
    - r_y > -1`` for all ``j != y``: ``int phi(x) (1 - Phi(x - 1))^(k-1) dx``.
    """
    dist = stats.norm(scale=sigma)
    value, _ = integrate.quad(
        lambda x: dist.pdf(x) * dist.sf(x - 1.0) ** (num_classes - 1),
        -np.inf,
        np.inf,
        limit=200,
    )
    return float(value)
