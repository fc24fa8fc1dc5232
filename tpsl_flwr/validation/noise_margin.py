"""How much the label noise alone moves a paired difference of validation scores.

The label party scores each epoch by the mean, over held-out ids, of a loss
against debiased noisy targets ``t`` (:mod:`~tpsl_flwr.validation.best_epoch`):
``s_i = sum_j t_ij l_ij`` with ``l_ij`` the loss of id ``i`` under label ``j``.
Two epochs compared on the same ids differ by ``d_i = sum_j t_ij D_ij``, ``D =
l(candidate) - l(incumbent)``. ``t = e_y + (t - e_y)``: the first part is what
a clean label would give, the second is the mechanism's noise, of mean 0 and a
variance that the mechanism's law fixes:

* ``none``: no noise, variance 0.
* Laplace, two classes: ``t = (1 - t_1, t_1)``, ``t_1`` the release ``y~ = y
  + u (1 - 2 y)``, ``u ~ Lap(b)``, clipped to ``[0, 1]`` and debiased
  (:mod:`~tpsl_flwr.privacy.clipped_release`), of variance ``v(b) = w / (1 -
  2 m)^2`` for either label: ``Var = v(b) (D_i1 - D_i0)^2``.
* Laplace, ``k`` classes: ``t_j`` each coordinate of ``e_y + U``, ``U_j`` iid
  ``Lap(b)``, clipped and debiased alike, independent: ``Var = v(b) sum_j
  D_ij^2``, again whatever the label.
* Randomized response (``q`` keep, ``r = (1 - q)/(k - 1)``): ``t = (e_{y~} -
  r) / (q - r)``, ``Var = Var(D_{i y~}) / (q - r)^2`` with ``y~ = y`` w.p.
  ``q``; it depends on ``y``, so the largest over the ``k`` possible labels.

No label is read: every value is a function of the two epochs' per-class
losses and the public mechanism, so a decision made with it stays
post-processing of the noisy release.
"""

from __future__ import annotations

import math

import numpy as np

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.privacy.clipped_release import clipped_variance
from tpsl_flwr.privacy.mechanisms import LAPLACE_GRID, Mechanism

__all__ = ["label_noise_se", "label_noise_variances"]


def label_noise_variances(mechanism: Mechanism, delta: np.ndarray) -> np.ndarray:
    """Per id, the variance the label noise adds to ``sum_j t_ij delta_ij``.

    Parameters
    ----------
    mechanism
        The run's mechanism (``none``, ``laplace`` or ``discrete``).
    delta
        ``(n, k)`` per-class loss differences of two models on the same ids.

    Returns
    -------
    np.ndarray
        ``(n,)`` variances, ``>= 0`` (the largest over the labels for
        randomized response, whose noise depends on the label).

    Raises
    ------
    ConfigError
        For a mechanism whose noise is not on the labels (the Gaussian
        baseline), or ``delta`` not ``(n, num_classes)``.

    Examples
    --------
    >>> from tpsl_flwr.privacy.mechanisms import make_mechanism
    >>> lap = make_mechanism("laplace", epsilon=1.0)  # b = 1 (2 b^2 = 2 unclipped)
    >>> label_noise_variances(lap, np.array([[0.0, 1.0], [1.0, 1.0]])).round(4)
    array([1.2144, 0.    ])
    >>> rr = make_mechanism("discrete", epsilon=math.log(3.0))  # q = 3/4
    >>> label_noise_variances(rr, np.array([[0.0, 1.0]])).round(6)
    array([0.75])
    """
    d = np.asarray(delta, dtype=np.float64)
    k = mechanism.num_classes
    if d.ndim != 2 or d.shape[1] != k:
        raise ConfigError(
            f"per-class loss differences must be (n, {k}), got shape {d.shape}"
        )
    name = mechanism.name
    if name == "none":
        return np.zeros(d.shape[0])
    if name == "laplace":
        b = float(mechanism.scale_steps) * LAPLACE_GRID  # type: ignore[attr-defined]
        v = clipped_variance(b)
        if mechanism.is_binary:
            return v * (d[:, 1] - d[:, 0]) ** 2
        return v * (d * d).sum(axis=1)
    if name == "discrete":
        eps = float(mechanism.epsilon or 0.0)
        q = 1.0 / (1.0 + (k - 1) * math.exp(-eps))
        r = (1.0 - q) / (k - 1)
        # Var over y~ of d[y~], y~ = y w.p. q else uniform over the others.
        mean_r, square_r = r * d.sum(axis=1), r * (d * d).sum(axis=1)
        means = mean_r[:, None] + (q - r) * d
        squares = square_r[:, None] + (q - r) * d * d
        worst = (squares - means * means).max(axis=1)
        return np.maximum(worst, 0.0) / (q - r) ** 2
    raise ConfigError(
        f"validation scores noisy labels, and mechanism {name!r} releases none"
    )


def label_noise_se(
    mechanism: Mechanism, candidate: np.ndarray, incumbent: np.ndarray
) -> float:
    """Standard error the label noise adds to the mean paired score difference.

    ``sqrt(sum_i Var_i) / n`` over :func:`label_noise_variances` of
    ``candidate - incumbent`` (per-class losses, ``(n, k)`` each, same ids);
    0 for ``none`` and for no ids.
    """
    if candidate.shape != incumbent.shape:
        raise ConfigError(
            f"paired losses need one shape, got {candidate.shape} and {incumbent.shape}"
        )
    n = candidate.shape[0]
    if n == 0:
        return 0.0
    variances = label_noise_variances(mechanism, candidate - incumbent)
    return float(math.sqrt(float(variances.sum())) / n)
