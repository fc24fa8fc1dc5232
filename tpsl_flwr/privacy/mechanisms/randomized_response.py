"""Discrete GradPerturb: randomized response on the label.

Binary (Yang et al., Algorithm 2): the label flips with probability ``1 / (1 +
e^epsilon)``. Multi-class (Algorithm 4): it is kept with probability ``e^eps /
(e^eps + k - 1)``, else replaced by one of the other ``k - 1`` labels
uniformly. Both are ``(epsilon, 0)``-DP. The sampler compares raw 64-bit keyed
words with integer thresholds rounded in the safe direction, so the realized
flip probability is never below the nominal one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import dp_accounting
import numpy as np

from tpsl_flwr.privacy.closed_forms import (
    sda_auc_randomized_response,
    sda_top1_randomized_response,
)
from tpsl_flwr.privacy.keyed_noise import NoiseKey, uniforms53
from tpsl_flwr.privacy.label_noise import NoisyLabels, one_hot
from tpsl_flwr.privacy.mechanisms.base import Mechanism, register
from tpsl_flwr.validation import check_epsilon

_TWO_POW_64 = 2**64


def rr_flip_threshold(flip_probability: float) -> int:
    """Integer threshold ``T``: a 64-bit word ``w`` flips the label iff ``w < T``.

    ``T = ceil(p 2^64)`` so the realized flip probability ``T / 2^64`` is never
    below ``p`` and the realized epsilon never above the nominal one.
    """
    return min(math.ceil(flip_probability * _TWO_POW_64), _TWO_POW_64 - 1)


def rr_keep_threshold(keep_probability: float) -> int:
    """Integer threshold ``T``: a word ``w`` keeps the label iff ``w < T``.

    ``T = floor(q 2^64)``: the realized keep probability is never above ``q``.
    """
    return math.floor(keep_probability * _TWO_POW_64)


@register
@dataclass(frozen=True)
class RandomizedResponse(Mechanism):
    """Discrete GradPerturb: randomized response on the label.

    Binary: ``u ~ Bern(p)`` with ``p = 1 / (1 + e^epsilon)`` (Algorithm 2).
    Multi-class: the label is kept with probability ``e^eps / (e^eps + k - 1)``,
    otherwise replaced by one of the other ``k - 1`` labels uniformly
    (Algorithm 4). Both are ``(epsilon, 0)``-DP.
    """

    name: ClassVar[str] = "discrete"
    listing_order: ClassVar[int] = 2
    parameter: ClassVar[str | None] = "epsilon"
    parameter_field: ClassVar[str | None] = "eps"
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

    def sample(
        self,
        labels: np.ndarray,
        ids: np.ndarray,
        key: NoiseKey,
        stream: int,
        additive_dim: int | None,
    ) -> NoisyLabels:
        """One-hot of the randomized label."""
        k = self.num_classes
        if self.is_binary:
            word = key.words(ids, stream, 1)[:, 0]
            flip = word < np.uint64(rr_flip_threshold(self.flip_probability))
            return NoisyLabels(one_hot(np.where(flip, 1 - labels, labels), k))
        words = key.words(ids, stream, 2)
        keep = words[:, 0] < np.uint64(rr_keep_threshold(self.keep_probability))
        other = np.floor(uniforms53(words[:, 1]) * (k - 1)).astype(np.int64)
        other = other + (other >= labels)
        return NoisyLabels(one_hot(np.where(keep, labels, other), k))

    def dp_event(self) -> dp_accounting.DpEvent:
        """dp-accounting's randomized response (stated under replace-one)."""
        return dp_accounting.RandomizedResponseDpEvent(
            self.uniform_noise_parameter, self.num_classes
        )

    @property
    def neighboring(self) -> dp_accounting.NeighboringRelation:
        """Randomized response neighbours replace one label."""
        return dp_accounting.NeighboringRelation.REPLACE_ONE

    def expected_sda(self) -> float:
        """``e^eps / (1 + e^eps)`` (binary; the ceiling of any attack) or top-1."""
        if self.is_binary:
            return sda_auc_randomized_response(self.eps)
        return sda_top1_randomized_response(self.eps, self.num_classes)

    def expected_noise(self) -> dict[str, float]:
        """Flip rate, and the mean coordinate move it causes."""
        flip = self.flip_probability
        mean_abs = flip if self.is_binary else 2.0 * flip / self.num_classes
        return {"flip_rate": flip, "mean_abs_noise": mean_abs}
