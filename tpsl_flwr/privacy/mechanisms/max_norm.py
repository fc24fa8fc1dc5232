"""Max-norm: every gradient of a batch scaled up to the batch's largest norm.

The heuristic of Li, Sun, Wang, Zhang, Jiang, Chen and Wang, "Label Leakage
and Protection in Two-party Split Learning", ICLR 2022 (Section 4, "max
norm"), aimed at the norm attack. Each sample's cut-layer gradient ``g_i`` is
multiplied by ``1 + sigma_i xi_i``, ``xi_i ~ N(0, 1)``, with

    ``sigma_i = sqrt(||g_max||^2 / ||g_i||^2 - 1)``,

``||g_max||`` the largest norm in the batch: Gaussian noise along ``g_i``
whose expected squared norm brings every gradient to ``E ||g~_i||^2 =
||g_i||^2 (1 + sigma_i^2) = ||g_max||^2``, so the norms carry no label in
expectation. It keeps the direction (a cosine attack is untouched) and
carries **no differential-privacy guarantee**: its epsilon is ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import dp_accounting
import numpy as np

from tpsl_flwr.errors import PrivacyError
from tpsl_flwr.privacy.mechanisms.base import (
    BatchReference,
    Mechanism,
    register,
)

__all__ = ["MaxNormPerturb", "max_norm_scales"]


def max_norm_scales(grads: np.ndarray) -> np.ndarray:
    """Each row's ``sigma_i = sqrt(max_j ||g_j||^2 / ||g_i||^2 - 1)``, ``(n,)``.

    A zero gradient gets 0: it stays zero whatever it is multiplied by.

    Examples
    --------
    >>> max_norm_scales(np.array([[3.0, 4.0], [0.0, 5.0], [1.0, 0.0]])).tolist()
    [0.0, 0.0, 4.898979485566356]
    """
    squared = np.einsum("ij,ij->i", grads, grads)
    top = float(squared.max())
    ratio = np.divide(top, squared, out=np.ones_like(squared), where=squared > 0)
    return np.sqrt(np.maximum(ratio - 1.0, 0.0))


@register
@dataclass(frozen=True)
class MaxNormPerturb(Mechanism):
    """Max-norm (Li et al. 2022): equalize the expected gradient norms of a batch.

    No parameter. The noise is added to the dispatched cut-layer gradient;
    the label party's top model trains on the exact labels. No DP guarantee.
    """

    name: ClassVar[str] = "max-norm"
    listing_order: ClassVar[int] = 5
    parameter: ClassVar[str | None] = None
    gradient_noise: ClassVar[bool] = True
    dp_guarantee: ClassVar[bool] = False

    def noise_width(self, dim: int) -> int:
        """One normal per sample (the noise is along the sample's gradient)."""
        return 1

    def perturb_batch(
        self,
        grads: np.ndarray,
        labels: np.ndarray,
        normals: np.ndarray,
        reference: BatchReference | None,
    ) -> tuple[np.ndarray, BatchReference | None]:
        """``g_i (1 + sigma_i xi_i)`` for every row (see the module docstring)."""
        if normals.shape != (grads.shape[0], 1):
            raise PrivacyError(
                f"max-norm needs ({grads.shape[0]}, 1) normals, got {normals.shape}"
            )
        scales = max_norm_scales(grads)
        return grads * (1.0 + scales * normals[:, 0])[:, None], reference

    def dp_event(self) -> dp_accounting.DpEvent:
        """No DP guarantee: dp-accounting's non-private event."""
        return dp_accounting.NonPrivateDpEvent()

    def expected_sda(self) -> float:
        """At ``z = 0`` every gradient has norm 1/2: no noise, the SDA is exact."""
        return 1.0

    def expected_noise(self) -> dict[str, float]:
        """At ``z = 0`` the norms are already equal: no noise."""
        return {"flip_rate": 0.0, "mean_abs_noise": 0.0}
