"""GradPerturb mechanisms as small frozen descriptions.

A mechanism here only *describes* the noise: its parameters and the closed-form
facts that follow from them. Sampling lives in :mod:`tpsl_flwr.noisy_labels`
and privacy accounting in :mod:`tpsl_flwr.accounting` (the split dp-accounting
makes between ``dp_event.py`` and its accountants).

Every mechanism except the Gaussian baseline acts by turning the label ``y``
into a noisy coefficient vector ``c`` over the ``k`` classes; GradPerturb's
output is then ``sum_j c_j g_j`` where ``g_j`` is the gradient for label ``j``
(Yang et al., Algorithms 2 and 4):

* binary Laplace: ``c = (1 - t, t)`` with ``t = y + u (1 - 2y)``,
  ``u ~ Lap(1/epsilon)``, so the output is ``g_y + u (g_{1-y} - g_y)``;
* binary discrete: the same with ``u ~ Bern(1 / (1 + e^epsilon))``;
* multi-class Laplace: ``c = e_y + U`` with ``U_j`` iid ``Lap(2/epsilon)``;
* multi-class discrete: ``c = e_i``, ``i`` drawn by k-ary randomized response;
* Gaussian baseline: ``g_y + r`` with ``r ~ N(0, sigma^2 I)`` (no pure epsilon).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.validation import check_epsilon, check_num_classes, check_sigma

MECHANISMS: tuple[str, ...] = ("none", "laplace", "discrete", "gaussian")
"""Names accepted by :func:`make_mechanism`."""


@dataclass(frozen=True)
class Mechanism:
    """Base description of a GradPerturb mechanism.

    Attributes
    ----------
    num_classes
        The number of classes ``k`` (2 for binary).
    """

    name: ClassVar[str] = ""
    num_classes: int = 2

    def __post_init__(self) -> None:
        check_num_classes(self.num_classes)

    @property
    def is_binary(self) -> bool:
        """Whether the mechanism is the binary (single-logit) variant."""
        return self.num_classes == 2

    @property
    def epsilon(self) -> float | None:
        """The pure ``epsilon`` of one GradPerturb call, or ``None`` if none."""
        return None

    @property
    def protects(self) -> bool:
        """Whether the mechanism adds any noise at all."""
        return True


@dataclass(frozen=True)
class NoProtection(Mechanism):
    """Plain split learning: the exact gradient ``g_y`` (Algorithm 1)."""

    name: ClassVar[str] = "none"

    @property
    def epsilon(self) -> float:
        """No protection spends an infinite budget."""
        return math.inf

    @property
    def protects(self) -> bool:
        """No noise is added."""
        return False


@dataclass(frozen=True)
class LaplacePerturb(Mechanism):
    """Laplace GradPerturb (Algorithm 2 binary, Algorithm 4 multi-class).

    Binary: ``u ~ Lap(1/epsilon)``; multi-class: ``U_j ~ Lap(2/epsilon)`` iid.
    Both are ``(epsilon, 0)``-DP (Yang et al., Lemmas 3.2 and 4.3).

    The sampler (:mod:`tpsl_flwr.noisy_labels`) draws the discrete Laplace
    law on the grid ``2^-GRID_BITS Z`` with the integer scale
    :attr:`scale_steps`; epsilons whose scale exceeds ``MAX_SCALE_STEPS``
    grid steps are refused, so every accepted epsilon is sampled exactly.
    """

    name: ClassVar[str] = "laplace"
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
    def epsilon(self) -> float:
        """The pure epsilon of one call."""
        return self.eps

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


@dataclass(frozen=True)
class RandomizedResponse(Mechanism):
    """Discrete GradPerturb: randomized response on the label.

    Binary: ``u ~ Bern(p)`` with ``p = 1 / (1 + e^epsilon)`` (Algorithm 2).
    Multi-class: the label is kept with probability ``e^eps / (e^eps + k - 1)``,
    otherwise replaced by one of the other ``k - 1`` labels uniformly
    (Algorithm 4). Both are ``(epsilon, 0)``-DP.
    """

    name: ClassVar[str] = "discrete"
    eps: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "eps", check_epsilon(self.eps))

    @property
    def epsilon(self) -> float:
        """The pure epsilon of one call."""
        return self.eps

    @property
    def keep_probability(self) -> float:
        """Probability that the label is kept: ``e^eps / (e^eps + k - 1)``."""
        return 1.0 / (1.0 + (self.num_classes - 1) * math.exp(-self.eps))

    @property
    def flip_probability(self) -> float:
        """Probability that the label is replaced by another one."""
        return (self.num_classes - 1) / (math.exp(self.eps) + self.num_classes - 1)

    @property
    def uniform_noise_parameter(self) -> float:
        """dp-accounting's parameter: the chance of a uniformly random output.

        With probability ``1 - q`` keep the label, else output one of the ``k``
        labels uniformly, so ``q = k / (e^eps + k - 1)``.
        """
        return self.num_classes / (math.exp(self.eps) + self.num_classes - 1)


@dataclass(frozen=True)
class GaussianPerturb(Mechanism):
    """The isotropic Gaussian baseline ``g_y + r``, ``r ~ N(0, sigma^2 I)``.

    ``sigma`` is in units of the per-sample gradient before batch averaging,
    the same scale as the Laplace ``b``, so the mechanisms compare. It has no
    pure epsilon (Yang et al., Section 5.2); :mod:`tpsl_flwr.accounting`
    reports an ``(epsilon, delta)`` where the sensitivity is known.
    """

    name: ClassVar[str] = "gaussian"
    sigma: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "sigma", check_sigma(self.sigma))

    @property
    def logit_l2_sensitivity(self) -> float:
        """The l2 distance between the logit gradients of two labels.

        ``|(s - 0) - (s - 1)| = 1`` for a single sigmoid logit and
        ``||e_i - e_j|| = sqrt(2)`` for softmax logits.
        """
        return 1.0 if self.is_binary else math.sqrt(2.0)


def make_mechanism(
    name: str,
    *,
    epsilon: float | None = None,
    sigma: float | None = None,
    num_classes: int = 2,
) -> Mechanism:
    """Build a mechanism description from its name and parameters.

    Parameters
    ----------
    name
        One of :data:`MECHANISMS`.
    epsilon
        The privacy budget of ``laplace`` and ``discrete``; must be > 0.
    sigma
        The noise standard deviation of ``gaussian``; must be > 0.
    num_classes
        The number of classes ``k >= 2``.

    Returns
    -------
    Mechanism
        The frozen description.

    Raises
    ------
    ConfigError
        For an unknown name (the valid ones are listed), a missing or invalid
        parameter, or a parameter the mechanism does not take.

    Examples
    --------
    >>> make_mechanism("laplace", epsilon=1.0).scale
    1.0
    >>> rr = make_mechanism("discrete", epsilon=2.0, num_classes=10)
    >>> round(rr.keep_probability, 4)
    0.4509
    """
    if name not in MECHANISMS:
        raise ConfigError(
            f"unknown mechanism {name!r}; valid mechanisms: {', '.join(MECHANISMS)}"
        )
    if name in ("laplace", "discrete"):
        if epsilon is None:
            raise ConfigError(f"mechanism {name!r} needs epsilon")
        if sigma is not None:
            raise ConfigError(f"mechanism {name!r} takes epsilon, not sigma={sigma}")
        if name == "laplace":
            return LaplacePerturb(num_classes=num_classes, eps=epsilon)
        return RandomizedResponse(num_classes=num_classes, eps=epsilon)
    if name == "gaussian":
        if sigma is None:
            raise ConfigError("mechanism 'gaussian' needs sigma")
        if epsilon is not None:
            raise ConfigError(
                f"mechanism 'gaussian' takes sigma, not epsilon={epsilon}"
            )
        return GaussianPerturb(num_classes=num_classes, sigma=sigma)
    if epsilon is not None or sigma is not None:
        raise ConfigError(
            "mechanism 'none' takes no epsilon or sigma "
            f"(got epsilon={epsilon}, sigma={sigma})"
        )
    return NoProtection(num_classes=num_classes)
