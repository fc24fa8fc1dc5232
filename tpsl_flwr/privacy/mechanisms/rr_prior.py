"""RR-with-prior: randomized response restricted to the labels a prior favours.

Ghazi, Golowich, Kumar, Manurangsi and Zhang, "Deep Learning with Label
Differential Privacy", NeurIPS 2021 (Algorithm 2, RRWithPrior; used by its
multi-stage training LP-2ST / LP-MST). Given a prior ``pi`` over the ``k``
labels of a sample, computed without that sample's label, sort the labels by
``pi`` and take the top ``k*`` of them, ``Y_k*``, where

    ``k* = argmax_{1 <= j <= k} q_j sum_{top j} pi``,  ``q_j = e^eps / (e^eps + j - 1)``

(ties: the smaller set). If the label ``y`` is in ``Y_k*``, output ``y`` with
probability ``q_k*``, else one of the other ``k* - 1`` labels of the set
uniformly; if it is not, output a label of ``Y_k*`` uniformly. Every output
probability changes by at most ``e^eps`` when ``y`` does: ``epsilon``-label-DP
(Ghazi et al., Lemma 3), whatever the prior, as long as the prior does not
depend on ``y``. ``P(output = y) = q_k*`` for ``y`` in the set and 0 outside
(:func:`rr_prior_keep_probabilities`, the closed form the tests hold the
sampler to).

In TPSL the label party is the one training with it: each sample's prior is
the top model's prediction for that sample when it is first trained on (the
model has seen only other samples' randomized labels then; with fresh noise
per epoch, earlier releases of its own label, which the accounting composes),
the nodes get the gradient of the randomized label, and the top model trains
on it. With the noise reused (the default) each label is randomized once, at
its first step, and kept: one release. A uniform prior gives plain k-ary
randomized response.

The sampler decides with 64-bit keyed words and the exact integer thresholds
of :func:`~tpsl_flwr.privacy.mechanisms.randomized_response.rr_thresholds` for
``k*`` labels (realized epsilon never above ``epsilon`` inside the set); the
uniform draw over the set for a label outside it uses the same exact
:func:`~tpsl_flwr.privacy.mechanisms.randomized_response.replacement_index`,
whose bins differ by one word in ``2^64``, far inside the margin ``(e^eps +
k* - 1) / k* > 1`` that those ratios have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import dp_accounting
import numpy as np

from tpsl_flwr._util.checks import check_epsilon
from tpsl_flwr.errors import PrivacyError
from tpsl_flwr.privacy.closed_forms import (
    sda_auc_randomized_response,
    sda_top1_randomized_response,
)
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms.base import Mechanism, NoisyLabels, one_hot, register
from tpsl_flwr.privacy.mechanisms.randomized_response import (
    replacement_index,
    rr_thresholds,
)

__all__ = ["RRWithPrior", "rr_prior_keep_probabilities", "rr_prior_set_sizes"]


def _checked_prior(prior: object, n: int, k: int) -> np.ndarray:
    values = np.asarray(prior, dtype=np.float64)
    if values.shape != (n, k):
        raise PrivacyError(f"the prior must be ({n}, {k}), got {values.shape}")
    if not np.isfinite(values).all() or (values < 0).any():
        raise PrivacyError("the prior must be finite and >= 0")
    return values


def _order(prior: np.ndarray) -> np.ndarray:
    """Labels sorted by decreasing prior, ties by label (``(n, k)``)."""
    return np.argsort(-prior, axis=1, kind="stable")


def rr_prior_set_sizes(prior: np.ndarray, epsilon: float) -> np.ndarray:
    """Each sample's ``k* = argmax_j q_j (sum of the top j prior)``, ``(n,)``.

    Examples
    --------
    >>> rr_prior_set_sizes(np.array([[0.5, 0.5], [0.95, 0.05]]), 1.0).tolist()
    [2, 1]
    """
    k = prior.shape[1]
    top = np.cumsum(np.take_along_axis(prior, _order(prior), axis=1), axis=1)
    sizes = np.arange(1, k + 1)
    keep = 1.0 / (1.0 + (sizes - 1) * math.exp(-epsilon))
    return np.argmax(top * keep, axis=1) + 1


def rr_prior_keep_probabilities(
    prior: np.ndarray, labels: np.ndarray, epsilon: float
) -> np.ndarray:
    """``P(output = y)``: ``e^eps / (e^eps + k* - 1)`` if ``y`` is in the set, else 0.

    Examples
    --------
    >>> p = rr_prior_keep_probabilities(
    ...     np.array([[0.5, 0.5], [0.95, 0.05]]), np.array([1, 1]), math.log(3.0))
    >>> [round(x, 6) for x in p.tolist()]
    [0.75, 0.0]
    """
    sizes = rr_prior_set_sizes(prior, epsilon)
    rank = np.argmax(_order(prior) == labels[:, None], axis=1)
    keep = 1.0 / (1.0 + (sizes - 1) * math.exp(-epsilon))
    return np.where(rank < sizes, keep, 0.0)


@register
@dataclass(frozen=True)
class RRWithPrior(Mechanism):
    """RR-with-prior (Ghazi et al. 2021): ``epsilon``-label-DP given a prior.

    Takes ``epsilon``. The label party randomizes each label with the top
    model's prediction as the prior (:meth:`sample_with_prior`); the nodes get
    the gradient of the randomized label, and the top model trains on it.
    """

    name: ClassVar[str] = "rr-prior"
    listing_order: ClassVar[int] = 6
    parameter: ClassVar[str | None] = "epsilon"
    parameter_field: ClassVar[str | None] = "eps"
    needs_prior: ClassVar[bool] = True
    eps: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "eps", check_epsilon(self.eps))
        for size in range(2, self.num_classes + 1):
            rr_thresholds(self.eps, size)  # refuses an epsilon too small for 2^64

    @property
    def epsilon(self) -> float:
        """The pure epsilon of one release of a label."""
        return self.eps

    def sample(
        self,
        labels: np.ndarray,
        ids: np.ndarray,
        key: NoiseKey,
        stream: int,
        additive_dim: int | None,
    ) -> NoisyLabels:
        """RR-with-prior at a uniform prior: plain ``k``-ary randomized response."""
        uniform = np.full((labels.size, self.num_classes), 1.0 / self.num_classes)
        return self.sample_with_prior(labels, ids, key, stream, uniform)

    def sample_with_prior(
        self,
        labels: np.ndarray,
        ids: np.ndarray,
        key: NoiseKey,
        stream: int,
        prior: np.ndarray,
    ) -> NoisyLabels:
        """One-hot of each label randomized within its prior's top ``k*`` set.

        Word ``w0 < K(k*)`` keeps a label of the set; otherwise ``w1`` picks
        one of the set's other labels (or, for a label outside the set, any of
        its labels) with :func:`replacement_index`.

        Raises
        ------
        PrivacyError
            For a prior of the wrong shape or with negative or non-finite
            entries (nothing is drawn).
        """
        n, k = labels.size, self.num_classes
        pi = _checked_prior(prior, n, k)
        order = _order(pi)
        sizes = rr_prior_set_sizes(pi, self.eps)
        rank = np.argmax(order == labels[:, None], axis=1)
        words = key.words(ids, stream, 2)
        position = np.zeros(n, dtype=np.int64)  # k* = 1: the top label
        for size in np.unique(sizes[sizes > 1]).tolist():
            rows = sizes == size
            keep = words[rows, 0] < np.uint64(rr_thresholds(self.eps, size).keep_count)
            inside = rank[rows] < size
            other = replacement_index(words[rows, 1], size - 1)
            other = other + (other >= rank[rows])
            anywhere = replacement_index(words[rows, 1], size)
            position[rows] = np.where(
                inside, np.where(keep, rank[rows], other), anywhere
            )
        noisy = order[np.arange(n), position]
        return NoisyLabels(one_hot(noisy, k))

    def dp_event(self) -> dp_accounting.DpEvent:
        """Binary randomized response at ``epsilon``, under replace-one.

        Every ``(epsilon, 0)``-DP mechanism's privacy profile is dominated by
        binary randomized response at ``epsilon`` (Kairouz, Oh and Viswanath,
        "The Composition Theorem for Differential Privacy", ICML 2015), so
        composing this event is a valid (possibly loose) account of
        RR-with-prior, whose law depends on the prior.
        """
        return dp_accounting.RandomizedResponseDpEvent(
            2.0 / (math.exp(self.eps) + 1.0), 2
        )

    @property
    def neighboring(self) -> dp_accounting.NeighboringRelation:
        """Label DP: neighbours replace one label."""
        return dp_accounting.NeighboringRelation.REPLACE_ONE

    def expected_sda(self) -> float:
        """At a uniform prior (the audit's ``z = 0``): randomized response's."""
        if self.is_binary:
            return sda_auc_randomized_response(self.eps)
        return sda_top1_randomized_response(self.eps, self.num_classes)

    def expected_noise(self) -> dict[str, float]:
        """At a uniform prior: randomized response's flip rate and mean move."""
        k = self.num_classes
        flip = (k - 1) / (math.exp(self.eps) + k - 1)
        mean_abs = flip if self.is_binary else 2.0 * flip / k
        return {"flip_rate": flip, "mean_abs_noise": mean_abs}
