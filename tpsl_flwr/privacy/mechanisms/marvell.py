"""Marvell: optimized Gaussian noise per batch under a power constraint.

Li, Sun, Wang, Zhang, Jiang, Chen and Wang, "Label Leakage and Protection in
Two-party Split Learning", ICLR 2022, Section 4 ("Marvell"). A baseline
defense, binary only, with **no differential-privacy guarantee**: it bounds
the sum of the two KL divergences between the perturbed gradients of the
positive and the negative class, modelled as Gaussians, and so (Pinsker) the
detection error of *any* attacker under that model, not a privacy loss.

Per batch, with ``g1``, ``g0`` the mean cut-layer gradients of the positive
and negative samples, ``Delta = g1 - g0``, ``u`` and ``v`` the mean coordinate
variances of the negative and positive gradients, ``p`` the positive fraction
and ``d`` the width, class ``c`` gets the noise

    ``eta = sqrt(lam1c - lam2c) xi Delta/||Delta|| + sqrt(lam2c) z``,
    ``xi ~ N(0, 1)``, ``z ~ N(0, I_d)``,

i.e. covariance ``lam1c`` along ``Delta`` and ``lam2c`` across it. The four
variances minimize the symmetrized KL (Li et al., Theorem 2's structure)

    ``sumKL = 1/2 [A0/A1 + A1/A0 + g/A0 + g/A1 + (d-1)(B0/B1 + B1/B0)] - d``,

``A0 = lam10 + u``, ``A1 = lam11 + v``, ``B0 = lam20 + u``, ``B1 = lam21 + v``,
``g = ||Delta||^2``, subject to the power constraint

    ``p (lam11 + (d-1) lam21) + (1-p) (lam10 + (d-1) lam20) <= P``,
    ``P = power * ||Delta||^2``

(the paper's scale ``s`` of ``P = s ||g1 - g0||^2``: the parameter
``marvell-power``). The class of smaller coordinate variance is the only one
given isotropic noise, and no more than equalizes the variances (more only
raises the ``(d-1)`` term); for a fixed isotropic part the rest of the
objective is convex along the power line, so :func:`solve_marvell` is two
nested bounded one-dimensional minimizations (scipy's Brent), written from
the objective above.

A batch holding one class only has no ``Delta``: it is given the covariance
the last two-class batch solved for (:class:`BatchReference`); a first batch
with one class is refused (fail closed) rather than sent clean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import dp_accounting
import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import ndtr

from tpsl_flwr._util.checks import check_positive_finite
from tpsl_flwr.errors import ConfigError, PrivacyError
from tpsl_flwr.privacy.mechanisms.base import (
    BatchReference,
    Mechanism,
    register,
)

__all__ = ["MarvellPerturb", "MarvellSolution", "solve_marvell", "sum_kl"]

_GRID = 33
"""Points of the coarse grid over the isotropic variance before refining."""
_XATOL = 1e-10
"""Absolute tolerance of each 1-D minimization, in units of ``||Delta||^2``."""


def sum_kl(
    lam10: float,
    lam20: float,
    lam11: float,
    lam21: float,
    *,
    u: float,
    v: float,
    d: int,
    g: float,
) -> float:
    """``KL(N1 || N0) + KL(N0 || N1)`` of the perturbed class Gaussians.

    ``N0 = N(g0, (lam10 + u) e e^T + (lam20 + u)(I - e e^T))`` and ``N1`` with
    ``lam11, lam21, v``, ``e = Delta / ||Delta||``, ``g = ||Delta||^2`` (Li et
    al. 2022, Section 4). A direction where both classes have zero variance
    contributes nothing when they agree (the reference's one-dimensional
    case) and ``inf`` when only one of them has none.

    Examples
    --------
    >>> sum_kl(0, 0, 0, 0, u=1.0, v=1.0, d=4, g=2.0)  # 1/2 (2 + 4 + 3*2) - 4
    2.0
    """
    a0, a1, b0, b1 = lam10 + u, lam11 + v, lam20 + u, lam21 + v
    if a0 <= 0 or a1 <= 0:
        return math.inf
    along = a0 / a1 + a1 / a0 + g / a0 + g / a1
    if d == 1:
        return 0.5 * along - 1.0
    if b0 <= 0 and b1 <= 0:
        across = 2.0 * (d - 1)
    elif b0 <= 0 or b1 <= 0:
        return math.inf
    else:
        across = (d - 1) * (b0 / b1 + b1 / b0)
    return 0.5 * (along + across) - d


@dataclass(frozen=True)
class MarvellSolution:
    """The four noise variances of one batch and the sum-KL they reach.

    Attributes
    ----------
    lam10, lam20
        Negative class: variance along ``Delta`` and across it.
    lam11, lam21
        Positive class: variance along ``Delta`` and across it.
    sum_kl
        The symmetrized KL of :func:`sum_kl` at this solution.
    """

    lam10: float
    lam20: float
    lam11: float
    lam21: float
    sum_kl: float

    def power(self, p: float, d: int) -> float:
        """``p (lam11 + (d-1) lam21) + (1-p)(lam10 + (d-1) lam20)``: E||eta||^2."""
        return p * (self.lam11 + (d - 1) * self.lam21) + (1 - p) * (
            self.lam10 + (d - 1) * self.lam20
        )


def _bounded_min(f: object, lo: float, hi: float) -> tuple[float, float]:
    """The minimizer and minimum of ``f`` on ``[lo, hi]`` (ends included)."""
    assert callable(f)
    if hi <= lo:
        return lo, float(f(lo))
    best = min(((float(f(x)), x) for x in (lo, hi)), key=lambda t: t[0])
    found = minimize_scalar(
        f, bounds=(lo, hi), method="bounded", options={"xatol": _XATOL}
    )
    if found.success and float(found.fun) < best[0]:
        return float(found.x), float(found.fun)
    return best[1], best[0]


def solve_marvell(
    *, u: float, v: float, d: int, g: float, p: float, power: float
) -> MarvellSolution:
    """Marvell's noise variances: minimum sum-KL under the power constraint.

    Parameters
    ----------
    u, v
        Mean coordinate variance of the negative and positive gradients (>= 0).
    d
        Cut-layer width (>= 1).
    g
        ``||g1 - g0||^2`` (>= 0).
    p
        Fraction of positives in the batch, in ``(0, 1)``.
    power
        The power constraint ``P`` (>= 0), in the units of ``g``.

    Returns
    -------
    MarvellSolution
        Variances meeting ``solution.power(p, d) <= power`` (up to float
        rounding) and the sum-KL they reach.

    Examples
    --------
    >>> s = solve_marvell(u=0.0, v=0.0, d=1, g=1.0, p=0.5, power=1.0)
    >>> round(s.power(0.5, 1), 9), s.lam10 == s.lam11
    (1.0, True)
    """
    for name, value in (("u", u), ("v", v), ("g", g), ("power", power)):
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{name} must be >= 0 and finite, got {value!r}")
    if not 0.0 < p < 1.0:
        raise ConfigError(f"p must lie in (0, 1), got {p!r}")
    if d < 1:
        raise ConfigError(f"d must be >= 1, got {d!r}")
    if g == 0.0 or power == 0.0:
        # Equal class means (or no power): the constraint leaves no noise.
        return MarvellSolution(
            0.0, 0.0, 0.0, 0.0, sum_kl(0, 0, 0, 0, u=u, v=v, d=d, g=g)
        )
    # Work in units of g (Marvell is scale-free), and with u <= v.
    swap = u > v
    lo_var, hi_var, q = (v / g, u / g, 1.0 - p) if swap else (u / g, v / g, p)
    budget = power / g

    def objective(a_low: float, b_low: float, a_high: float) -> float:
        # "low" is the class of smaller coordinate variance (share 1 - q).
        return sum_kl(a_low, b_low, a_high, 0.0, u=lo_var, v=hi_var, d=d, g=1.0)

    def along(b_low: float) -> tuple[float, float]:
        rest = budget - (1 - q) * (d - 1) * b_low

        def f(a_low: float) -> float:
            return objective(a_low, b_low, max(rest - (1 - q) * a_low, 0.0) / q)

        return _bounded_min(f, b_low, rest / (1 - q))

    top = 0.0 if d == 1 else min(hi_var - lo_var, budget / ((1 - q) * d))
    grid = np.linspace(0.0, top, _GRID) if top > 0 else np.zeros(1)
    values = [along(float(b))[1] for b in grid]
    i = int(np.argmin(values))
    lo_b, hi_b = float(grid[max(i - 1, 0)]), float(grid[min(i + 1, grid.size - 1)])
    b_low, _ = _bounded_min(lambda b: along(b)[1], lo_b, hi_b)
    if along(b_low)[1] > values[i]:
        b_low = float(grid[i])
    a_low, best = along(b_low)
    rest = budget - (1 - q) * (d - 1) * b_low
    a_high = max(rest - (1 - q) * a_low, 0.0) / q
    low = (a_low * g, b_low * g)
    high = (a_high * g, 0.0)
    (lam10, lam20), (lam11, lam21) = (high, low) if swap else (low, high)
    return MarvellSolution(lam10, lam20, lam11, lam21, best)


@register
@dataclass(frozen=True)
class MarvellPerturb(Mechanism):
    """Marvell (Li et al. 2022): sum-KL-optimal Gaussian noise per batch.

    Binary only. ``power`` is the scale ``s`` of the power constraint ``P = s
    ||g1 - g0||^2`` (the run config's ``marvell-power``). The noise is added to
    the dispatched cut-layer gradient; the label party's top model trains on
    the exact labels, as in the paper. No DP guarantee: epsilon is ``None``.
    """

    name: ClassVar[str] = "marvell"
    listing_order: ClassVar[int] = 4
    parameter: ClassVar[str | None] = "marvell_power"
    parameter_field: ClassVar[str | None] = "power"
    gradient_noise: ClassVar[bool] = True
    dp_guarantee: ClassVar[bool] = False
    power: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.is_binary:
            raise ConfigError(
                f"marvell is binary only (Li et al. 2022), got {self.num_classes} "
                "classes"
            )
        object.__setattr__(
            self, "power", check_positive_finite(self.power, "marvell-power")
        )

    def noise_width(self, dim: int) -> int:
        """One normal along ``Delta`` and ``dim`` across it, per sample."""
        return dim + 1

    def solve(self, grads: np.ndarray, labels: np.ndarray) -> MarvellSolution:
        """The batch's statistics and the variances Marvell adds for them."""
        positive = labels == 1
        g1, g0 = grads[positive].mean(axis=0), grads[~positive].mean(axis=0)
        delta = g1 - g0
        v = float(((grads[positive] - g1) ** 2).mean())
        u = float(((grads[~positive] - g0) ** 2).mean())
        g = float(delta @ delta)
        return solve_marvell(
            u=u,
            v=v,
            d=grads.shape[1],
            g=g,
            p=float(positive.mean()),
            power=self.power * g,
        )

    def perturb_batch(
        self,
        grads: np.ndarray,
        labels: np.ndarray,
        normals: np.ndarray,
        reference: BatchReference | None,
    ) -> tuple[np.ndarray, BatchReference | None]:
        """Add the batch's optimal noise (see the module docstring).

        Raises
        ------
        PrivacyError
            For a batch of one class when no two-class batch came before it
            (nothing to take the covariance from; never sent clean), or
            normals of the wrong shape.
        """
        n, d = grads.shape
        if normals.shape != (n, d + 1):
            raise PrivacyError(
                f"marvell needs ({n}, {d + 1}) normals, got {normals.shape}"
            )
        positive = labels == 1
        if positive.all() or not positive.any():
            if reference is None:
                raise PrivacyError(
                    f"marvell: the first batch ({n} samples) holds label "
                    f"{int(labels[0])} only, so it has no g1 - g0 to shape the "
                    "noise; nothing is sent (raise batch-size)"
                )
            lam10, lam20, lam11, lam21 = reference.values
            direction = reference.direction
        else:
            solution = self.solve(grads, labels)
            lam10, lam20, lam11, lam21 = (
                solution.lam10,
                solution.lam20,
                solution.lam11,
                solution.lam21,
            )
            delta = grads[positive].mean(axis=0) - grads[~positive].mean(axis=0)
            norm = float(np.linalg.norm(delta))
            direction = delta / norm if norm > 0 else np.zeros(d)
            reference = BatchReference((lam10, lam20, lam11, lam21), direction)
        along = np.where(positive, lam11 - lam21, lam10 - lam20)
        across = np.where(positive, lam21, lam20)
        noise = np.sqrt(np.maximum(along, 0.0))[:, None] * normals[:, :1] * direction
        noise = noise + np.sqrt(across)[:, None] * normals[:, 1:]
        return grads + noise, reference

    def dp_event(self) -> dp_accounting.DpEvent:
        """No DP guarantee: dp-accounting's non-private event."""
        return dp_accounting.NonPrivateDpEvent()

    def expected_sda(self) -> float:
        """SDA AUC at ``z = 0``, balanced classes, one logit: ``Phi(1/sqrt(a0+a1))``.

        There every gradient of a class is the same (``u = v = 0``, ``d = 1``,
        ``||Delta|| = 1``), so the noise is along ``Delta`` only and the SDA's
        score is the projection: two Gaussians ``1`` apart with variances
        ``lam10`` and ``lam11``.
        """
        s = solve_marvell(u=0.0, v=0.0, d=1, g=1.0, p=0.5, power=self.power)
        return float(ndtr(1.0 / math.sqrt(s.lam10 + s.lam11)))

    def expected_noise(self) -> dict[str, float]:
        """No flips; mean ``|eta|`` at the audit's point (``z = 0``, balanced)."""
        s = solve_marvell(u=0.0, v=0.0, d=1, g=1.0, p=0.5, power=self.power)
        mean_abs = 0.5 * (math.sqrt(s.lam10) + math.sqrt(s.lam11))
        return {"flip_rate": 0.0, "mean_abs_noise": mean_abs * math.sqrt(2 / math.pi)}
