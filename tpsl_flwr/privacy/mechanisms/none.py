"""No protection: plain split learning, the exact gradient ``g_y`` (Algorithm 1)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import dp_accounting
import numpy as np

from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms.base import Mechanism, NoisyLabels, one_hot, register


@register
@dataclass(frozen=True)
class NoProtection(Mechanism):
    """Plain split learning: the exact gradient ``g_y`` (Algorithm 1)."""

    name: ClassVar[str] = "none"
    listing_order: ClassVar[int] = 0
    parameter: ClassVar[str | None] = None

    @property
    def epsilon(self) -> float:
        """No protection spends an infinite budget."""
        return math.inf

    @property
    def protects(self) -> bool:
        """No noise is added."""
        return False

    def sample(
        self,
        labels: np.ndarray,
        ids: np.ndarray,
        key: NoiseKey,
        stream: int,
        additive_dim: int | None,
    ) -> NoisyLabels:
        """The true labels, one-hot: ``c = e_y``."""
        return NoisyLabels(one_hot(labels, self.num_classes))

    def dp_event(self) -> dp_accounting.DpEvent:
        """No privacy: dp-accounting's non-private event."""
        return dp_accounting.NonPrivateDpEvent()

    def expected_sda(self) -> float:
        """The white-box attack recovers every label."""
        return 1.0

    def expected_noise(self) -> dict[str, float]:
        """No noise at all."""
        return {"flip_rate": 0.0, "mean_abs_noise": 0.0}
