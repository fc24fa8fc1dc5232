"""Exact discrete Laplace noise: a floating-point filter with an exact fallback.

The noise is ``m = G1 - G2`` for independent geometrics with
``P(G >= g) = r^g``, ``r = exp(-1/t)``; their difference has exactly the
discrete Laplace law ``P(m) = (1 - r) / (1 + r) r^|m|``. One geometric comes
from one uniform ``W`` on ``[0, 1)``::

    G = #{g >= 1 : W < exp(-g/t)}      (so P(G >= g) = exp(-g/t) = r^g)

``W`` is an infinite-precision uniform whose binary digits are the words of
one *lane* (one geometric of one coordinate of one sample): after ``k`` words
``W`` lies in ``[A 2^-64k, (A + 1) 2^-64k)`` with ``A`` the words read as one
``64k``-bit integer. Every decision below is a statement about *all* ``W`` of
such an interval, so the law of ``G`` is exactly the one above; floating
point only decides which of two exact routes gives the answer:

* :func:`geometric_bounds` (vectorized, one word per lane) encloses ``G`` in
  ``[lo, hi]`` with a rigorous float error bound; ``lo == hi`` decides ``G``.
* :func:`exact_geometric` (per lane, Python integers) decides the rest, about
  ``t 2^-43`` of the lanes, by comparing ``W`` with rigorous rational bounds of
  ``exp(-g/t)`` (:func:`exp_neg_bounds`), reading more words of the lane when
  the comparison is too close to call. It terminates with probability one.

The result is a fixed function of the words: a platform whose ``log`` sends
different lanes to the exact route still gets the same ``G`` everywhere.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import numpy as np

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.privacy.keyed_noise import NoiseKey

MAX_SCALE_STEPS = 2**40
"""Largest supported scale ``t`` (the ``float64`` error bound assumes it)."""
_PREFETCH = 2
"""Extra words per undecided lane fetched with one AES call."""
_SLACK = 1.0
"""Multiplier of the float error bound; tests raise it to force the exact path."""
_GUARD_BITS = 8
"""Bits of ``exp`` bounds beyond the ``64k`` bits of ``W`` known so far."""


def geometric_bounds(
    words: np.ndarray, t: int, slack: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Enclose ``G`` for the lanes whose first words are ``words`` (fast path).

    ``w`` fixes ``W`` to ``I = [w 2^-64, (w+1) 2^-64)``, over which
    ``t E = -t ln W`` ranges over ``(a, b]`` with ``b = t ln(2^64 / w)``
    (``+inf`` for ``w = 0``) and ``a = b - t ln(1 + 1/w) >= b - t / w``. With
    ``delta = slack (t (1 + b / t) 2^-45 + 2^-30)``, all computed in
    ``float64``, ``lo = floor(b - t/w - delta)`` and ``hi = floor(b +
    delta)`` satisfy ``lo <= a`` and ``b < hi + 1``; if ``lo == hi``, every
    ``W`` in ``I`` has ``t E`` in ``(lo, lo + 1)``, hence ``G = lo`` exactly.
    One ``log`` per lane.

    Why ``delta`` bounds the float error (``slack = 1``, ``1 <= t <= 2^40``,
    unit roundoff ``u = 2^-53``, ``E = b / t``): ``float(w)`` is within
    relative ``u`` of ``w`` and the scaling by ``2^-64`` is exact (no
    subnormals), so ``ln`` of the float argument is within ``1.1u`` of
    ``ln x``. NumPy's ``float64`` ``log`` is validated to 1 ulp; allowing 4
    adds ``4u E``, so the computed ``E`` is within ``4u E + 1.1u``. The
    product by the exact ``float(t)`` adds ``u t E``; ``t / w`` (``<= t``) is
    within ``2u t``; the two additions and subtractions add at most ``u (t E
    + t + delta)`` each. The total is below ``t (1 + E) 2^-48``, an eighth of
    ``delta`` (whose own rounding is negligible): the enclosure holds for any
    ``log`` within about 30 ulp.

    Parameters
    ----------
    words
        ``uint64`` first words of the lanes (any shape).
    t
        The integer scale, ``1 <= t <= 2^40``.
    slack
        Multiplier of ``delta`` (1 in production; tests use a huge one to
        send every lane to :func:`exact_geometric`).

    Returns
    -------
    tuple of numpy.ndarray
        ``float64`` ``(lo, hi)``, ``0 <= lo <= G <= hi`` (``lo = 0`` and
        ``hi = inf`` when ``w = 0``); ``G = lo`` where ``lo == hi``.

    Examples
    --------
    >>> lo, hi = geometric_bounds(np.array([2**63, 0], dtype=np.uint64), 1)
    >>> lo.tolist(), hi.tolist()
    ([0.0, 0.0], [0.0, inf])
    """
    w = words.astype(np.float64)
    tf = float(t)
    with np.errstate(divide="ignore", invalid="ignore"):
        far = np.log(w * 2.0**-64)
        far *= -tf
        delta = far * (2.0**-45 * slack)
        delta += (tf * 2.0**-45 + 2.0**-30) * slack
        hi = np.floor(far + delta)
        delta += tf / w
        far -= delta
    lo = np.floor(far, out=far)
    np.fmax(lo, 0.0, out=lo)
    return lo, hi


def _exp_neg_fraction(num: int, den: int, bits: int) -> tuple[int, int]:
    """Integers ``lo <= exp(-num/den) 2^bits <= hi`` for ``0 <= num <= den``.

    The Taylor series of ``exp(-x)``, ``x <= 1``, alternates with
    non-increasing terms ``x^j / j!``, so its odd partial sums lie below the
    value and its even ones above. Terms are bracketed on the ``2^-bits``
    grid (floor for a lower, ceil for an upper bound) and summed until the
    last one is below one unit; ``hi - lo`` is then a few units per term.
    """
    one = 1 << bits
    term_lo = term_hi = one
    run_lo = run_hi = one
    lower, upper = 0, one
    j = 0
    while True:
        j += 1
        term_lo = term_lo * num // (den * j)
        term_hi = -(-term_hi * num // (den * j))
        if j % 2:
            run_lo -= term_hi
            run_hi -= term_lo
            lower = run_lo
        else:
            run_lo += term_lo
            run_hi += term_hi
            upper = run_hi
        if term_hi <= 1:
            return max(lower, 0), upper


@functools.lru_cache(maxsize=64)
def _exp_minus_one(bits: int) -> tuple[int, int]:
    """Bounds of ``exp(-1) 2^bits`` (cached: every power of ``e`` needs them)."""
    return _exp_neg_fraction(1, 1, bits)


def exp_neg_bounds(num: int, den: int, prec: int) -> tuple[int, int]:
    """Rigorous bounds ``lo <= exp(-num/den) 2^prec <= hi``, ``hi - lo <= 2``.

    ``q = num / den = n + f`` with ``n`` an integer and ``0 <= f < 1``;
    ``exp(-q) = exp(-1)^n exp(-f)``. Both factors are bracketed by
    :func:`_exp_neg_fraction` with ``bit_length(n) + 16`` guard bits, the power
    by repeated squaring rounded outward, and the product is rounded outward
    to the ``2^-prec`` grid.

    Parameters
    ----------
    num, den
        ``q = num / den``, ``num >= 0``, ``den >= 1``.
    prec
        Bits after the binary point of the returned bounds.

    Returns
    -------
    tuple of int
        ``(lo, hi)``.

    Examples
    --------
    >>> exp_neg_bounds(1, 1, 16), round(math.exp(-1) * 2**16, 2)
    ((24109, 24110), 24109.35)
    """
    n, frac = divmod(num, den)
    guard = n.bit_length() + 16
    bits = prec + guard
    lo, hi = _exp_neg_fraction(frac, den, bits)
    if n:
        base_lo, base_hi = _exp_minus_one(bits)
        pow_lo, pow_hi = 1 << bits, 1 << bits
        while n:
            if n & 1:
                pow_lo = pow_lo * base_lo >> bits
                pow_hi = -(-pow_hi * base_hi >> bits)
            n >>= 1
            if n:
                base_lo = base_lo * base_lo >> bits
                base_hi = -(-base_hi * base_hi >> bits)
        lo = lo * pow_lo >> bits
        hi = -(-hi * pow_hi >> bits)
    return lo >> guard, -(-hi >> guard)


class _Uniform:
    """The uniform ``W`` of one lane, refined one 64-bit word at a time."""

    def __init__(self, words: Iterator[int]):
        self._words = words
        self.prefix = next(words)
        self.bits = 64

    def refine(self) -> None:
        """Read the lane's next word: ``W``'s interval shrinks by ``2^-64``."""
        self.prefix = (self.prefix << 64) | next(self._words)
        self.bits += 64

    def below(self, g: int, t: int) -> bool:
        """Decide ``W < exp(-g/t)`` exactly (reading words as needed)."""
        if g == 0:
            return True
        while True:
            lo, hi = exp_neg_bounds(g, t, self.bits + _GUARD_BITS)
            if (self.prefix + 1) << _GUARD_BITS <= lo:
                return True
            if self.prefix << _GUARD_BITS >= hi:
                return False
            self.refine()

    def guess(self, t: int) -> tuple[int, int]:
        """A rough range for ``G`` from ``W``'s first nonzero words (floats)."""
        while not self.prefix:
            self.refine()
        ln2 = self.bits * math.log(2)
        low = t * (ln2 - math.log(self.prefix + 1))
        high = t * (ln2 - math.log(self.prefix))
        return max(math.floor(low) - 1, 0), math.floor(high) + 1


def exact_geometric(
    words: Iterator[int], t: int, guess: tuple[float, float] = (0.0, math.inf)
) -> int:
    """``G = max{g >= 0 : W < exp(-g/t)}`` for one lane, exactly (slow path).

    Every comparison is exact (:meth:`_Uniform.below`), so ``guess`` only
    speeds the search up: the range is widened until ``W < exp(-lo/t)`` and
    ``W >= exp(-(hi+1)/t)`` are verified, then bisected. An infinite upper
    guess (first word 0) is replaced by one from the first nonzero words, so
    the search never walks up from 0.

    Parameters
    ----------
    words
        The lane's words, first word first (an endless iterator of ints).
    t
        The integer scale.
    guess
        A likely range ``(lo, hi)`` for ``G``, e.g. :func:`geometric_bounds`'.

    Returns
    -------
    int
        ``G``.

    Examples
    --------
    >>> exact_geometric(iter([2**63, 0]), 1), exact_geometric(iter([0, 1, 5]), 1)
    (0, 88)
    """
    w = _Uniform(words)
    if math.isinf(guess[1]):
        lo, hi = w.guess(t)
    else:
        lo, hi = max(int(guess[0]), 0), int(guess[1])
        hi = max(hi, lo)
    while lo > 0 and not w.below(lo, t):
        lo, hi = max(0, lo - 2 * (hi - lo + 1)), lo - 1
    while w.below(hi + 1, t):
        lo, hi = hi + 1, hi + 2 * (hi - lo + 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if w.below(mid, t):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _lane_words(
    key: NoiseKey, sample_id: int, stream: int, first: int, stride: int, head: list[int]
) -> Iterator[int]:
    """Word ``n`` of a lane is word ``first + n * stride`` of its sample."""
    yield from head
    index = first + len(head) * stride
    while True:
        yield int(key.words_at(np.array([sample_id]), stream, [index])[0, 0])
        index += stride


def discrete_laplace_steps(
    key: NoiseKey, sample_ids: np.ndarray, stream: int, scale_steps: int, width: int
) -> np.ndarray:
    """Exact discrete Laplace noise, in grid steps, keyed by sample id.

    ``P(m) = (1 - r) / (1 + r) r^|m|`` with ``r = exp(-1 / scale_steps)``, for
    every integer ``m``: ``m = G1 - G2`` (see the module docstring). Coordinate
    ``j`` of a sample uses lanes ``2j`` (``G1``) and ``2j + 1`` (``G2``); word
    ``n`` of lane ``l`` is word ``l + 2 width n`` of the sample's
    :meth:`NoiseKey.words` sequence, a fixed function of (key, id, stream,
    coordinate), so the same id always gets the same noise in any batch.

    Parameters
    ----------
    key
        The secret noise key.
    sample_ids
        ``(n,)`` validated sample ids.
    stream
        The noise stream.
    scale_steps
        The integer scale ``t`` in grid steps, ``1 <= t <= 2^40``.
    width
        Independent coordinates per sample.

    Returns
    -------
    numpy.ndarray
        ``int64`` array of shape ``(n, width)``.

    Examples
    --------
    >>> key = NoiseKey.from_seed(0)
    >>> m = discrete_laplace_steps(key, np.arange(4), 1, 3, 2)
    >>> m.shape, m.dtype.name
    ((4, 2), 'int64')
    """
    if not 1 <= scale_steps <= MAX_SCALE_STEPS:
        raise ConfigError(f"scale_steps must lie in [1, 2^40], got {scale_steps}")
    ids = np.asarray(sample_ids, dtype=np.int64)
    stride = 2 * width
    words = key.words(ids, stream, stride)
    lo, hi = geometric_bounds(words, scale_steps, _SLACK)
    g = lo.astype(np.int64)
    rows, lanes = np.nonzero(lo != hi)
    if rows.size:
        head = key.words_at(
            ids[rows], stream, lanes + stride, count=_PREFETCH, stride=stride
        )
        for i, (row, lane) in enumerate(
            zip(rows.tolist(), lanes.tolist(), strict=True)
        ):
            lane_head = [int(words[row, lane]), *map(int, head[i])]
            words_iter = _lane_words(
                key, int(ids[row]), stream, lane, stride, lane_head
            )
            g[row, lane] = exact_geometric(
                words_iter, scale_steps, (lo[row, lane], hi[row, lane])
            )
    return g[:, 0::2] - g[:, 1::2]
