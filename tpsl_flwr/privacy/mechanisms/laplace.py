"""Laplace GradPerturb: exact discrete Laplace noise on the label direction.

Binary (Yang et al., Algorithm 2): ``c = (1 - t, t)`` with ``t = y + u (1 -
2y)``, ``u ~ Lap(1/epsilon)``, so the output is ``g_y + u (g_{1-y} - g_y)``.
Multi-class (Algorithm 4): ``c = e_y + U``, ``U_j`` iid ``Lap(2/epsilon)``.
Both are ``(epsilon, 0)``-DP (Lemmas 3.2 and 4.3). The noise is the discrete
Laplace law on the grid ``2^-20 Z``, sampled exactly
(:mod:`tpsl_flwr.privacy.exact_laplace`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

import dp_accounting
import numpy as np

from tpsl_flwr._util.checks import check_epsilon
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.privacy.closed_forms import sda_auc_laplace, sda_top1_laplace
from tpsl_flwr.privacy.exact_laplace import discrete_laplace_steps
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms.base import Mechanism, NoisyLabels, one_hot, register

LAPLACE_GRID = 2.0**-20
"""Resolution of the discrete Laplace noise (a power of two)."""
_CLAMP_STEPS = 2**51
"""Coefficients are clamped to ``+-2^51`` grid steps (``+-2^31``): exact doubles."""


@register
@dataclass(frozen=True)
class LaplacePerturb(Mechanism):
    """Laplace GradPerturb (Algorithm 2 binary, Algorithm 4 multi-class).

    Binary: ``u ~ Lap(1/epsilon)``; multi-class: ``U_j ~ Lap(2/epsilon)`` iid.
    Both are ``(epsilon, 0)``-DP (Yang et al., Lemmas 3.2 and 4.3).

    The sampler (:mod:`tpsl_flwr.privacy.noisy_labels`) draws the discrete Laplace
    law on the grid ``2^-GRID_BITS Z`` with the integer scale
    :attr:`scale_steps`; epsilons whose scale exceeds ``MAX_SCALE_STEPS``
    grid steps are refused, so every accepted epsilon is sampled exactly.
    """

    name: ClassVar[str] = "laplace"
    listing_order: ClassVar[int] = 1
    parameter: ClassVar[str | None] = "epsilon"
    parameter_field: ClassVar[str | None] = "eps"
    GRID_BITS: ClassVar[int] = 20
    """The noise lives on the grid ``2^-GRID_BITS Z``."""
    MAX_SCALE_STEPS: ClassVar[int] = 2**40
    """Largest integer scale (in grid steps) the exact sampler handles."""
    eps: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "eps", check_epsilon(self.eps))
        if self.scale_steps > self.MAX_SCALE_STEPS:
            smallest = self.sensitivity_steps / self.MAX_SCALE_STEPS
            raise ConfigError(
                f"epsilon {self.eps} is too small for the exact Laplace sampler: "
                f"it needs epsilon >= {smallest!r} (a scale of at most 2^40 "
                "grid steps)"
            )

    @property
    def epsilon(self) -> float:
        """The pure epsilon of one call."""
        return self.eps

    @property
    def sensitivity_steps(self) -> int:
        """The label shift in grid steps: ``2^20`` binary, ``2^21`` (l1) else."""
        return (1 if self.is_binary else 2) << self.GRID_BITS

    @property
    def scale_steps(self) -> int:
        """The sampler's integer scale ``t = ceil(scale * 2^GRID_BITS)``.

        Computed exactly (:class:`fractions.Fraction` holds a float exactly)
        from :attr:`scale`, which is never below ``sensitivity / epsilon``, so
        ``t >= sensitivity_steps / epsilon``, i.e. ``exp(sensitivity_steps /
        t) <= e^epsilon``: rounding up only adds noise (in practice ``t`` is
        ``ceil(sensitivity_steps / epsilon)``, at most one step more).
        """
        return math.ceil(Fraction(self.scale) * (1 << self.GRID_BITS))

    @property
    def scale(self) -> float:
        """The Laplace scale ``b``: ``1/epsilon`` binary, ``2/epsilon`` multi-class.

        Rounded up to the next double when ``sensitivity / epsilon`` is not one,
        so ``b >= sensitivity / epsilon`` holds exactly.
        """
        exact = Fraction(int(self.l1_sensitivity)) / Fraction(self.eps)
        nearest = float(exact)
        return (
            nearest if Fraction(nearest) >= exact else math.nextafter(nearest, math.inf)
        )

    @property
    def l1_sensitivity(self) -> float:
        """The l1 change of the label vector between neighbours (1 or 2)."""
        return 1.0 if self.is_binary else 2.0

    def sample(
        self,
        labels: np.ndarray,
        ids: np.ndarray,
        key: NoiseKey,
        stream: int,
        additive_dim: int | None,
    ) -> NoisyLabels:
        """Coefficients ``c`` with exact discrete Laplace noise, clamped to ``+-2^31``.

        Every value is a whole number of grid steps, so every sum ``y + u`` is
        exact in float64; the clamp is post-processing (probability below
        ``exp(-2^11)``).
        """
        k = self.num_classes
        one = 1 << self.GRID_BITS
        width = 1 if self.is_binary else k
        steps = discrete_laplace_steps(key, ids, stream, self.scale_steps, width)
        if self.is_binary:
            t = labels * one + steps[:, 0] * (1 - 2 * labels)
            steps = np.stack([one - t, t], axis=1)
        else:
            steps = steps + one * one_hot(labels, k).astype(np.int64)
        clamped = np.clip(steps, -_CLAMP_STEPS, _CLAMP_STEPS)
        return NoisyLabels(clamped.astype(np.float64) * LAPLACE_GRID)

    def dp_event(self) -> dp_accounting.DpEvent:
        """``LaplaceDpEvent(b / sensitivity)``, i.e. noise multiplier ``1/epsilon``."""
        return dp_accounting.LaplaceDpEvent(self.scale / self.l1_sensitivity)

    def expected_sda(self) -> float:
        """``1 - (2 + eps) e^-eps / 4`` (binary) or the k-class top-1 integral."""
        if self.is_binary:
            return sda_auc_laplace(self.eps)
        return sda_top1_laplace(self.eps, self.num_classes)

    def expected_noise(self) -> dict[str, float]:
        """Flip rate ``e^(-eps/2) / 2`` (binary) and mean ``|u| = b``."""
        if self.is_binary:
            flip = 0.5 * math.exp(-self.eps / 2.0)
        else:
            flip = 1.0 - sda_top1_laplace(self.eps, self.num_classes)
        return {"flip_rate": flip, "mean_abs_noise": self.scale}
