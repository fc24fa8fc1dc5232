"""The isotropic Gaussian baseline ``g_y + r``, ``r ~ N(0, sigma^2 I)``.

No pure epsilon (Yang et al., Section 5.2): an ``(epsilon, delta)`` is reported
at the logits, where the sensitivity is known. Not hardened against
floating-point attacks (plain inverse-CDF sampling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import dp_accounting
import numpy as np
from scipy.special import ndtri

from tpsl_flwr._util.checks import check_sigma
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.privacy.closed_forms import sda_auc_gaussian, sda_top1_gaussian
from tpsl_flwr.privacy.keyed_noise import NoiseKey, open_uniforms
from tpsl_flwr.privacy.mechanisms.base import Mechanism, NoisyLabels, one_hot, register


@register
@dataclass(frozen=True)
class GaussianPerturb(Mechanism):
    """The isotropic Gaussian baseline ``g_y + r``, ``r ~ N(0, sigma^2 I)``.

    ``sigma`` is in units of the per-sample gradient before batch averaging,
    the same scale as the Laplace ``b``, so the mechanisms compare. It has no
    pure epsilon (Yang et al., Section 5.2); :mod:`tpsl_flwr.privacy.accounting`
    reports an ``(epsilon, delta)`` where the sensitivity is known.
    """

    name: ClassVar[str] = "gaussian"
    listing_order: ClassVar[int] = 3
    parameter: ClassVar[str | None] = "sigma"
    additive: ClassVar[bool] = True
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

    def sample(
        self,
        labels: np.ndarray,
        ids: np.ndarray,
        key: NoiseKey,
        stream: int,
        additive_dim: int | None,
    ) -> NoisyLabels:
        """``e_y`` plus ``sigma`` times keyed standard normals of width ``m``.

        ``m`` is ``additive_dim`` (the cut-layer width), else the logit count.
        """
        logits = 1 if self.is_binary else self.num_classes
        width = logits if additive_dim is None else additive_dim
        if width < 1:
            raise ConfigError(f"additive_dim must be >= 1, got {width}")
        normals = ndtri(open_uniforms(key.words(ids, stream, width)))
        return NoisyLabels(one_hot(labels, self.num_classes), self.sigma * normals)

    def dp_event(self) -> dp_accounting.DpEvent:
        """``GaussianDpEvent(sigma / sensitivity)`` at the logits."""
        return dp_accounting.GaussianDpEvent(self.sigma / self.logit_l2_sensitivity)

    def expected_sda(self) -> float:
        """The SDA's AUC (binary) or top-1 accuracy at uniform predictions."""
        if self.is_binary:
            return sda_auc_gaussian(self.sigma)
        return sda_top1_gaussian(self.sigma, self.num_classes)

    def expected_noise(self) -> dict[str, float]:
        """No flips; mean ``|r| = sigma sqrt(2 / pi)``."""
        return {"flip_rate": 0.0, "mean_abs_noise": self.sigma * math.sqrt(2 / math.pi)}
