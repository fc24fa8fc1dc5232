"""Discrete GradPerturb: randomized response on the label.

Binary (Yang et al., Algorithm 2): the label flips with probability ``1 / (1 +
e^epsilon)``. Multi-class (Algorithm 4): it is kept with probability ``e^eps /
(e^eps + k - 1)``, else replaced by one of the other ``k - 1`` labels
uniformly. Both are ``(epsilon, 0)``-DP.

The sampler decides with integers on the scale of one 64-bit keyed word
(``N = 2^64``), never with rounded floats. Word ``w0 < K`` keeps the label
(binary: ``w0 < N - K`` flips it); the replacement is the ``i``-th other label,
``i = floor(w1 (k - 1) / N)``, so bin ``i`` holds ``c_i`` words with
``floor(N / (k - 1)) <= c_i <= ceil(N / (k - 1))``. The realized channel is

* ``P(y | y) = K / N`` and ``P(j | y) = (1 - K / N) c_i / N`` for ``j != y``;
* ``e^eps_r = max(K N / ((N - K) c_min), (N - K) c_max / (K N), c_max / c_min)``
  (keep vs. the rarest replacement, its inverse, and two replacements; the
  last only for ``k >= 3``).

:func:`rr_thresholds` takes ``K`` as the **largest** integer with ``K N <=
e^eps (N - K) c_min``, i.e. ``K = floor(e^eps N c_min / (N + e^eps c_min))``,
decided exactly from rational bounds of ``e^eps``
(:func:`~tpsl_flwr.privacy.exact_laplace.exp_neg_bounds`), and checks the two
other ratios exactly. Hence ``eps_r <= eps`` always, and since ``K + 1``
violates the rule, ``eps - eps_r < 1/K + 1/(N - K - 1)`` (about ``2^-64 (1/q +
1/(1 - q))`` for the nominal keep probability ``q``: below ``(k + 1 + e^eps)
2^-64``, e.g. ``1.2e-15`` for ``eps <= 10`` and ``k <= 100``). Only when
``K = N - 1`` (``eps`` above about 44-47) is the realized epsilon the sampler's
maximum rather than close to the nominal one.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import ClassVar

import dp_accounting
import numpy as np

from tpsl_flwr._util.checks import check_epsilon
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.privacy.closed_forms import (
    sda_auc_randomized_response,
    sda_top1_randomized_response,
)
from tpsl_flwr.privacy.exact_laplace import exp_neg_bounds
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.privacy.mechanisms.base import Mechanism, NoisyLabels, one_hot, register

WORD_SCALE = 2**64
"""``N``: the number of values of one keyed word; thresholds live on this scale."""
MAX_REPLACEMENTS = 2**32 - 1
"""Largest ``k - 1`` the exact 64x32-bit replacement index supports."""
_EPS_CAP = 128.0
"""Above this ``e^eps c_min > N^2``, so ``K = N - 1`` already (see below)."""
_EXP_BITS = 192
"""First relative precision (bits) of the bounds of ``e^eps``; doubled if needed."""
_MAX_REFINE = 6
_LN_DIGITS = 80
"""Decimal digits used to turn the exact realized ratio into a float epsilon."""


def rr_flip_threshold(flip_probability: float | Fraction) -> int:
    """Integer ``T = ceil(p 2^64)``: the safe rounding of an *exact* ``p``.

    A word ``w`` flips iff ``w < T``; ``T / 2^64 >= p`` for the ``p`` given.
    The mechanism does not use this: a float ``p`` is already a rounded
    ``1 / (1 + e^eps)``, so its thresholds come from :func:`rr_thresholds`.
    """
    return min(math.ceil(Fraction(flip_probability) * WORD_SCALE), WORD_SCALE - 1)


def rr_keep_threshold(keep_probability: float | Fraction) -> int:
    """Integer ``T = floor(q 2^64)``: the safe rounding of an *exact* ``q``.

    See :func:`rr_flip_threshold`; the mechanism uses :func:`rr_thresholds`.
    """
    return math.floor(Fraction(keep_probability) * WORD_SCALE)


def replacement_index(words: np.ndarray, replacements: int) -> np.ndarray:
    """Return ``floor(w n / 2^64)`` exactly for ``uint64`` words, ``n < 2^32``.

    The 128-bit product is formed from 32-bit halves: with ``w = h 2^32 +
    l``, ``floor(w n / 2^64) = floor((h n + floor(l n / 2^32)) / 2^32)`` and
    no partial sum reaches ``2^64``. Bin ``i`` then holds exactly
    ``ceil((i + 1) N / n) - ceil(i N / n)`` words, ``floor(N / n)`` or
    ``ceil(N / n)`` of them.

    Examples
    --------
    >>> w = np.array([0, 2**63, 2**64 - 1], dtype=np.uint64)
    >>> replacement_index(w, 9).tolist()
    [0, 4, 8]
    """
    n = np.uint64(replacements)
    half = np.uint64(32)
    high = words >> half
    low = words & np.uint64(0xFFFFFFFF)
    return ((high * n + ((low * n) >> half)) >> half).astype(np.int64)


def _exp_bounds(epsilon: float, bits: int) -> tuple[Fraction, Fraction]:
    """Rationals ``lo <= e^epsilon <= hi``, relative width about ``2^-bits``.

    ``exp_neg_bounds`` brackets ``e^-eps 2^prec`` by integers ``a <= b``
    with ``b - a <= 2``; ``prec`` is chosen so that ``a >= 2^bits``.
    """
    num, den = epsilon.as_integer_ratio()
    prec = bits + 2 + math.ceil(epsilon * 1.4427)  # 1.4427 > log2(e)
    low, high = exp_neg_bounds(num, den, prec)
    return Fraction(1 << prec, high), Fraction(1 << prec, low)


def _largest_keep(exp_eps: Fraction, c_min: int) -> int:
    """``floor(E N c / (N + E c))``: the largest ``K`` with ``K N <= E (N - K) c``."""
    a, b = exp_eps.numerator, exp_eps.denominator
    return (a * WORD_SCALE * c_min) // (b * WORD_SCALE + a * c_min)


def _keep_count(epsilon: float, c_min: int) -> tuple[int, Fraction]:
    """Return ``K`` for ``e^epsilon`` and a rational lower bound of ``e^epsilon``.

    ``K`` is increasing in ``E``; when the bounds ``lo <= E <= hi`` give the
    same ``K`` it is exactly ``floor(g(E))``. ``g(E)`` is irrational (``E``
    is, for a rational ``eps != 0``, by Lindemann), so refining terminates;
    after :data:`_MAX_REFINE` rounds the bound from ``lo`` is kept (still
    safe, possibly one word short). Above :data:`_EPS_CAP`, ``E c_min >
    N^2`` so ``g > N - 1`` and ``K = N - 1``, the sampler's maximum, whatever
    the exact ``E``.
    """
    eps = min(epsilon, _EPS_CAP)
    bits = _EXP_BITS
    for _ in range(_MAX_REFINE):
        low, high = _exp_bounds(eps, bits)
        keep = _largest_keep(low, c_min)
        if keep == _largest_keep(high, c_min):
            break
        bits *= 2
    return keep, low


@dataclass(frozen=True)
class RRThresholds:
    """The integer thresholds of randomized response and its realized channel.

    Attributes
    ----------
    keep_count
        ``K``: a keep word ``w0 < K`` keeps the label (binary: ``w0 >= N - K``).
    num_classes
        ``k``.
    """

    keep_count: int
    num_classes: int

    @property
    def flip_threshold(self) -> int:
        """Binary: a word ``w < N - K`` flips the label."""
        return WORD_SCALE - self.keep_count

    @property
    def bin_counts(self) -> tuple[int, int]:
        """``(c_min, c_max)``: fewest and most words of one replacement bin."""
        c_min, rest = divmod(WORD_SCALE, self.num_classes - 1)
        return c_min, c_min + (rest != 0)

    @property
    def realized_keep_probability(self) -> Fraction:
        """Exact ``K / N``."""
        return Fraction(self.keep_count, WORD_SCALE)

    @property
    def realized_ratio(self) -> Fraction:
        """Exact ``e^eps_r``, the largest likelihood ratio of the channel."""
        keep, flip = self.keep_count, WORD_SCALE - self.keep_count
        c_min, c_max = self.bin_counts
        ratios = [
            Fraction(keep * WORD_SCALE, flip * c_min),
            Fraction(flip * c_max, keep * WORD_SCALE),
        ]
        if self.num_classes > 2:
            ratios.append(Fraction(c_max, c_min))
        return max(ratios)

    @property
    def realized_epsilon(self) -> float:
        """``eps_r = ln(realized_ratio)`` (to float from 80 decimal digits)."""
        ratio = self.realized_ratio
        with localcontext() as ctx:
            ctx.prec = _LN_DIGITS
            return float((Decimal(ratio.numerator) / ratio.denominator).ln())


@functools.lru_cache(maxsize=256)
def rr_thresholds(epsilon: float, num_classes: int) -> RRThresholds:
    """Exact thresholds whose realized epsilon never exceeds ``epsilon``.

    ``K = floor(e^eps N c_min / (N + e^eps c_min))``, ``N = 2^64``,
    ``c_min = floor(N / (k - 1))``, decided exactly (see the module
    docstring for the channel and the bound ``eps - eps_r < 1/K + 1/(N - K
    - 1)``).

    Parameters
    ----------
    epsilon
        The nominal epsilon (> 0, finite).
    num_classes
        ``k``, ``2 <= k <= 2^32``.

    Returns
    -------
    RRThresholds
        ``K`` and the realized channel.

    Raises
    ------
    ConfigError
        If ``k - 1 >= 2^32``, or ``epsilon`` is too small for 64-bit words
        (below about ``(k - 1) / 2^64`` when ``k - 1`` is not a power of two).

    Examples
    --------
    >>> t = rr_thresholds(1.0, 10)
    >>> t.realized_epsilon <= 1.0, round(float(t.realized_keep_probability), 6)
    (True, 0.231969)
    """
    if num_classes - 1 > MAX_REPLACEMENTS:
        raise ConfigError(
            f"randomized response supports at most {MAX_REPLACEMENTS + 1} classes, "
            f"got {num_classes}"
        )
    c_min = WORD_SCALE // (num_classes - 1)
    keep, exp_low = _keep_count(epsilon, c_min)
    thresholds = RRThresholds(keep, num_classes)
    if not 0 < keep < WORD_SCALE or thresholds.realized_ratio > exp_low:
        raise ConfigError(
            f"epsilon {epsilon!r} is below what 64-bit randomized response over "
            f"{num_classes} classes can realize (about {num_classes - 1} / 2^64)"
        )
    return thresholds


@register
@dataclass(frozen=True)
class RandomizedResponse(Mechanism):
    """Discrete GradPerturb: randomized response on the label.

    Binary: ``u ~ Bern(p)`` with ``p = 1 / (1 + e^epsilon)`` (Algorithm 2).
    Multi-class: the label is kept with probability ``e^eps / (e^eps + k - 1)``,
    otherwise replaced by one of the other ``k - 1`` labels uniformly
    (Algorithm 4). Both are ``(epsilon, 0)``-DP. The sampler realizes these
    up to integer thresholds on the 64-bit word scale (:func:`rr_thresholds`):
    :attr:`realized_epsilon` is never above ``eps``.
    """

    name: ClassVar[str] = "discrete"
    listing_order: ClassVar[int] = 2
    parameter: ClassVar[str | None] = "epsilon"
    parameter_field: ClassVar[str | None] = "eps"
    eps: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "eps", check_epsilon(self.eps))
        rr_thresholds(self.eps, self.num_classes)

    @property
    def thresholds(self) -> RRThresholds:
        """The sampler's exact integer thresholds (cached per ``(eps, k)``)."""
        return rr_thresholds(self.eps, self.num_classes)

    @property
    def realized_epsilon(self) -> float:
        """The epsilon the 64-bit sampler realizes exactly; ``<= eps``."""
        return self.thresholds.realized_epsilon

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
        """One-hot of the randomized label.

        Binary: word ``w < N - K`` flips. Else ``w0 < K`` keeps and the
        replacement is the :func:`replacement_index` of ``w1`` among the
        other labels in increasing order.
        """
        k = self.num_classes
        thresholds = self.thresholds
        if self.is_binary:
            word = key.words(ids, stream, 1)[:, 0]
            flip = word < np.uint64(thresholds.flip_threshold)
            return NoisyLabels(one_hot(np.where(flip, 1 - labels, labels), k))
        words = key.words(ids, stream, 2)
        keep = words[:, 0] < np.uint64(thresholds.keep_count)
        other = replacement_index(words[:, 1], k - 1)
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
