"""Sampling GradPerturb noise: labels in, noisy coefficient vectors out.

All mechanisms but the Gaussian baseline are label randomizers: they map the
label ``y`` to a coefficient vector ``c`` over the ``k`` classes and
GradPerturb outputs ``sum_j c_j g_j`` (see :mod:`tpsl_flwr.mechanisms`).
Because the whole transcript is then a function of ``c`` alone, reusing one
``c`` per sample across epochs keeps the run ``(epsilon, 0)``-DP (Yang et al.,
Section 6). The draws come from :class:`~tpsl_flwr.keyed_noise.NoiseKey`, so
"reuse" needs no storage.

Floating-point safety (Mironov, "On significance of the least significant bits
for differential privacy", CCS 2012): textbook Laplace sampling
``-b sign(U) ln(1 - 2|U|)`` yields a porous set of doubles whose holes depend
on the input, which breaks DP. Here the Laplace noise is the *discrete*
Laplace law on the grid ``LAPLACE_GRID * Z``, ``P(u = m L) ~ exp(-|m| / t)``,
drawn EXACTLY with integer arithmetic only (Canonne, Kamath and Steinke 2020,
Algorithms 1 and 2; see :func:`discrete_laplace_steps`). The scale ``t`` is an
integer number of grid steps, ``t = ceil(2^20 / epsilon)`` (binary) or
``ceil(2^21 / epsilon)`` (multi-class, l1 shift 2), so neighbouring labels
differ by at most ``exp(2^20 / t) <= e^epsilon`` (resp. ``exp(2^21 / t)``):
rounding ``t`` up only adds noise. Every value is a whole number of grid steps
and every sum ``y + u`` is exact in float64. Coefficients are clamped to
``+-2^31`` (a post-processing, so still ``(epsilon, 0)``-DP; reached with
probability below ``exp(-2^11)``). Epsilons needing ``t > 2^40`` are refused
by :class:`~tpsl_flwr.mechanisms.LaplacePerturb`. What remains approximate:
the realized scale is ``t L >= b`` (slightly more noise than nominal);
randomized response compares raw 64-bit words with integer thresholds rounded
in the safe direction (see :func:`rr_flip_threshold`); the Gaussian baseline
claims no pure DP and uses plain inverse-CDF sampling. The randomness is AES
as a PRF (computational, as before).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.keyed_noise import NoiseKey, open_uniforms, uniforms53
from tpsl_flwr.mechanisms import (
    GaussianPerturb,
    LaplacePerturb,
    Mechanism,
    NoProtection,
    RandomizedResponse,
)
from tpsl_flwr.validation import check_labels, check_sample_ids

LAPLACE_GRID = 2.0**-20
"""Resolution of the discrete Laplace noise (a power of two)."""

STREAM_TRANSCRIPT = 1
"""Stream of the noise behind the gradients sent to the non-label parties."""
STREAM_TOP_UPDATE = 2
"""Stream of the separate top-model noise of the cut-layer placement."""
STREAM_CUT_GAUSSIAN = 3
"""Stream of the Gaussian baseline's noise at the cut layer."""

_TWO_POW_64 = 2**64

FACTORIAL_DEPTH = 13
"""``Bern(1/K)`` trials ``K = 1 .. 13`` decided by one uniform on ``[0, 13!)``."""
_FACTORIAL = math.factorial(FACTORIAL_DEPTH)
_CLAMP_STEPS = 2**51
"""Coefficients are clamped to ``+-2^51`` grid steps (``+-2^31``): exact doubles."""
_CAP_STEPS = _CLAMP_STEPS + 2**21
_SLOTS = 4
"""Independent proposal sequences per noise value, tried in parallel."""
_PREFETCH = 8
"""Words per lane fetched with one AES call before sampling."""
_PEEK = 4
"""Words looked at per lane and pass by the trial loops."""


@dataclass(frozen=True)
class NoisyLabels:
    """The randomized labels of one batch.

    Attributes
    ----------
    coefficients
        ``(n, k)`` float64: GradPerturb's output is ``sum_j c_ij g_ij``.
    additive
        ``(n, m)`` float64 Gaussian noise added to ``g_y`` (Gaussian baseline
        only, in per-sample gradient units), else ``None``.
    """

    coefficients: np.ndarray
    additive: np.ndarray | None = None


def one_hot(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Return the ``(n, k)`` float64 one-hot encoding of ``labels``."""
    out = np.zeros((labels.size, num_classes), dtype=np.float64)
    out[np.arange(labels.size), labels] = 1.0
    return out


def draw_noisy_labels(
    mechanism: Mechanism,
    labels: object,
    sample_ids: object,
    key: NoiseKey,
    stream: int = STREAM_TRANSCRIPT,
    additive_dim: int | None = None,
) -> NoisyLabels:
    """Randomize a batch of labels with the mechanism's keyed noise.

    Parameters
    ----------
    mechanism
        The mechanism description.
    labels
        ``(n,)`` integer labels in ``[0, k)``.
    sample_ids
        ``(n,)`` sample ids; the same id always gets the same noise.
    key
        The label party's secret noise key.
    stream
        Which independent noise stream to use.
    additive_dim
        Width of the Gaussian baseline's noise vector (the number of logits,
        or the cut-layer width); ignored by the other mechanisms.

    Returns
    -------
    NoisyLabels
        The coefficient vectors (and the Gaussian noise, if any).

    Raises
    ------
    ConfigError
        For labels outside ``[0, k)``, empty batches or ids and labels of
        different lengths.
    """
    k = mechanism.num_classes
    y = check_labels(labels, k)
    ids = check_sample_ids(sample_ids, expected_length=y.size)
    if isinstance(mechanism, NoProtection):
        return NoisyLabels(one_hot(y, k))
    if isinstance(mechanism, LaplacePerturb):
        return NoisyLabels(_laplace_coefficients(mechanism, y, ids, key, stream))
    if isinstance(mechanism, RandomizedResponse):
        return NoisyLabels(_rr_coefficients(mechanism, y, ids, key, stream))
    if isinstance(mechanism, GaussianPerturb):
        width = (
            (1 if mechanism.is_binary else k) if additive_dim is None else additive_dim
        )
        if width < 1:
            raise ConfigError(f"additive_dim must be >= 1, got {width}")
        normals = ndtri(open_uniforms(key.words(ids, stream, width)))
        return NoisyLabels(one_hot(y, k), mechanism.sigma * normals)
    raise ConfigError(f"no sampler for mechanism {mechanism!r}")


def uniform_below(
    words: np.ndarray, n: int | np.ndarray, bits: int = 64
) -> tuple[np.ndarray, np.ndarray]:
    """One step of the exact uniform integer sampler on ``[0, n)``.

    A word ``w``, uniform on ``[0, 2^bits)``, is accepted iff
    ``w >= 2^bits mod n``; the accepted range then holds ``floor(2^bits / n)``
    whole runs of ``n`` consecutive integers, so ``w mod n`` is exactly
    uniform on ``[0, n)`` (the rejection step of Canonne, Kamath and Steinke
    2020, Section 5.1, done on integers). A rejected word is discarded and the
    next one tried; the rejection probability is below ``n / 2^bits``.

    Parameters
    ----------
    words
        ``uint64`` words holding ``bits`` random bits each.
    n
        The range, ``1 <= n <= 2^bits`` (an integer or a ``uint64`` array
        broadcasting against ``words``).
    bits
        The word width: 64 in production, a few bits in exhaustive tests.

    Returns
    -------
    tuple of numpy.ndarray
        ``(accepted, value)``: a boolean mask and ``w mod n`` (``uint64``).

    Examples
    --------
    >>> ok, value = uniform_below(np.array([0, 1, 5, 7], dtype=np.uint64), 3, bits=3)
    >>> ok.tolist(), value.tolist()
    ([False, False, True, True], [0, 1, 2, 1])
    """
    bound = np.asarray(n, dtype=np.uint64)
    if bound.ndim == 0:
        low = np.uint64((1 << bits) % int(bound))
        return words >= low, words % bound
    span = np.full(bound.shape, (1 << bits) % _TWO_POW_64, dtype=np.uint64)
    low_array = (span - bound) % bound
    return words >= low_array, words % bound


@functools.cache
def _factorial_thresholds(depth: int) -> np.ndarray:
    """``depth! / n!`` for ``n = depth .. 1``, ascending, as ``uint64``."""
    full = math.factorial(depth)
    return np.array(
        [full // math.factorial(n) for n in range(depth, 0, -1)], dtype=np.uint64
    )


def first_fail_reciprocal(
    draws: np.ndarray, depth: int = FACTORIAL_DEPTH
) -> np.ndarray:
    """The first ``K`` with ``C_K = 0`` for independent ``C_K ~ Bern(1/K)``.

    One uniform ``R`` on ``[0, depth!)`` decides ``C_1 .. C_depth`` at once:
    ``N > n`` iff ``R < depth! / n!``, an event of probability exactly
    ``1 / n! = P(C_1 = .. = C_n = 1)``. ``R = 0`` (all ``depth`` trials
    succeeded) returns ``depth + 1``: the caller then draws ``C_{depth+1}, ..``
    one at a time. This batches the inner loop of Canonne, Kamath and Steinke
    2020, Algorithm 1.

    Parameters
    ----------
    draws
        Uniform integers on ``[0, depth!)`` (``uint64``, any shape).
    depth
        How many trials one draw decides.

    Returns
    -------
    numpy.ndarray
        ``int64`` values in ``[2, depth + 1]`` (``C_1 = 1`` always).

    Examples
    --------
    >>> first_fail_reciprocal(np.arange(6, dtype=np.uint64), depth=3).tolist()
    [4, 3, 3, 2, 2, 2]
    """
    ascending = _factorial_thresholds(depth)
    return depth + 1 - np.searchsorted(ascending, draws, side="right").astype(np.int64)


class _WordTape:
    """Each lane's own sequence of keyed words, read in order.

    A lane is one (sample, coordinate); word ``n`` of coordinate ``j`` of a
    ``width``-wide sample is word ``n * width + j`` of the sample's
    :meth:`NoiseKey.words` sequence, so it never depends on the batch. The
    first ``_PREFETCH`` words of every lane come from one AES call; lanes that
    need more fetch them with :meth:`NoiseKey.words_at`.
    """

    def __init__(self, key: NoiseKey, ids: np.ndarray, stream: int, width: int):
        self._key, self._stream, self._width = key, stream, width
        first = key.words(ids, stream, _PREFETCH * width)
        shaped = first.reshape(ids.size, _PREFETCH, width).transpose(0, 2, 1)
        self.buf = np.empty((ids.size * width, 4 * _PREFETCH), dtype=np.uint64)
        self.buf[:, :_PREFETCH] = shaped.reshape(-1, _PREFETCH)
        self.ids = np.repeat(ids, width)
        self.coord = np.tile(np.arange(width, dtype=np.int64), ids.size)
        self.filled = np.full(self.ids.size, _PREFETCH, dtype=np.int64)
        self.pos = np.zeros(self.ids.size, dtype=np.int64)

    def peek(self, lanes: np.ndarray, count: int) -> np.ndarray:
        """The next ``count`` words of each lane, without consuming them."""
        start = self.pos[lanes]
        if not start.size:
            return np.empty((0, count), dtype=np.uint64)
        if start.max() + count > _PREFETCH:
            short = start + count > self.filled[lanes]
            if short.any():
                self._extend(lanes[short])
        return self.buf[lanes[:, None], start[:, None] + np.arange(count)]

    def take(self, lanes: np.ndarray) -> np.ndarray:
        """Consume and return the next word of each lane."""
        words = self.peek(lanes, 1)[:, 0]
        self.pos[lanes] += 1
        return words

    def advance(self, lanes: np.ndarray, used: np.ndarray | int) -> None:
        """Consume ``used`` words of each lane."""
        self.pos[lanes] += used

    def _extend(self, lanes: np.ndarray) -> None:
        have = self.filled[lanes]
        extra = self._key.words_at(
            self.ids[lanes],
            self._stream,
            have * self._width + self.coord[lanes],
            count=_PREFETCH,
            stride=self._width,
        )
        need = int((have + _PREFETCH).max())
        if need > self.buf.shape[1]:
            wider = np.empty((self.buf.shape[0], 2 * need), dtype=np.uint64)
            wider[:, : self.buf.shape[1]] = self.buf
            self.buf = wider
        self.buf[lanes[:, None], have[:, None] + np.arange(_PREFETCH)] = extra
        self.filled[lanes] = have + _PREFETCH


def _draw_uniform(
    tape: _WordTape, lanes: np.ndarray, n: int | np.ndarray
) -> np.ndarray:
    """Uniform integers on ``[0, n)`` per lane (words until one is accepted)."""
    out = np.empty(lanes.size, dtype=np.uint64)
    todo = np.arange(lanes.size)
    while todo.size:
        bound = n if np.ndim(n) == 0 else np.asarray(n)[todo]
        ok, value = uniform_below(tape.take(lanes[todo]), bound)
        out[todo[ok]] = value[ok]
        todo = todo[~ok]
    return out


def _first_fail_draw(tape: _WordTape, lanes: np.ndarray) -> np.ndarray:
    """:func:`first_fail_reciprocal` from the tape, tail included."""
    first = first_fail_reciprocal(_draw_uniform(tape, lanes, _FACTORIAL))
    tail = np.flatnonzero(first > FACTORIAL_DEPTH)
    if tail.size:
        first[tail] = _first_fail_tail(tape, lanes[tail])
    return first


def _first_fail_tail(tape: _WordTape, lanes: np.ndarray) -> np.ndarray:
    """Continue ``C_K ~ Bern(1/K)`` from ``K = depth + 1`` to the first 0."""
    trial = np.full(lanes.size, FACTORIAL_DEPTH + 1, dtype=np.int64)
    out = np.empty(lanes.size, dtype=np.int64)
    todo = np.arange(lanes.size)
    while todo.size:
        draw = _draw_uniform(tape, lanes[todo], trial[todo].astype(np.uint64))
        failed = draw != 0
        out[todo[failed]] = trial[todo[failed]]
        todo = todo[~failed]
        trial[todo] += 1
    return out


def _first_failure_below(
    tape: _WordTape, lanes: np.ndarray, u: np.ndarray, t: int, need: np.ndarray
) -> np.ndarray:
    """First ``K <= need`` with ``G_K = 0``, else ``need + 1``.

    ``G_K = [uniform(t) < u] ~ Bern(u/t)``; the trials stop at the first
    failure.

    Looks ``_PEEK`` words ahead per pass and consumes only the words the
    sequential loop would have read (rejected words included).
    """
    result = need + 1
    done = np.zeros(lanes.size, dtype=np.int64)
    todo = np.arange(lanes.size)
    while todo.size:
        ok, value = uniform_below(tape.peek(lanes[todo], _PEEK), t)
        fail = ok & (value >= u[todo, None])
        counted = np.cumsum(ok, axis=1) + done[todo, None]
        left = need[todo, None]
        stop = ok & (counted <= left) & (fail | (counted == left))
        hit = stop.any(axis=1)
        col = np.argmax(stop, axis=1)
        rows = np.arange(todo.size)
        failed = hit & fail[rows, col]
        result[todo[failed]] = counted[rows, col][failed]
        tape.advance(lanes[todo], np.where(hit, col + 1, _PEEK))
        done[todo] = counted[:, -1]
        todo = todo[~hit]
    return result


def _bern_exp_fraction(
    tape: _WordTape, lanes: np.ndarray, u: np.ndarray, t: int
) -> np.ndarray:
    """``Bern(exp(-u/t))`` for ``0 <= u < t`` (CKS 2020, Algorithm 1).

    Algorithm 1 returns whether the first ``K`` with ``A_K = 0`` is odd, for
    ``A_K ~ Bern(gamma / K)``. Here ``A_K = C_K and G_K`` with independent
    ``C_K ~ Bern(1/K)`` and ``G_K ~ Bern(u/t)``, which has probability
    ``u / (t K)`` exactly, so the first failure is ``min(N_C, N_G)``.
    """
    first_c = _first_fail_draw(tape, lanes)
    first_g = _first_failure_below(tape, lanes, u, t, first_c - 1)
    return np.minimum(first_c, first_g) % 2 == 1


def _geometric_exp1(tape: _WordTape, lanes: np.ndarray, cap: int) -> np.ndarray:
    """Successes of ``Bern(exp(-1))`` trials before the first failure.

    Counting stops at ``cap``; a trial succeeds iff
    :func:`first_fail_reciprocal` is odd (Algorithm 1 with ``gamma = 1``).
    """
    count = np.zeros(lanes.size, dtype=np.int64)
    todo = np.arange(lanes.size)
    while todo.size:
        ok, value = uniform_below(tape.peek(lanes[todo], _PEEK), _FACTORIAL)
        first = first_fail_reciprocal(value)
        tail = ok & (first > FACTORIAL_DEPTH)
        fail = ok & ~tail & (first % 2 == 0)
        wins = np.cumsum(ok & ~tail & ~fail, axis=1)
        room = cap - count[todo, None]
        stop = tail | fail | ((wins == room) & ok & ~tail & ~fail)
        hit = stop.any(axis=1)
        col = np.argmax(stop, axis=1)
        rows = np.arange(todo.size)
        count[todo] += np.where(hit, wins[rows, col], wins[:, -1])
        tape.advance(lanes[todo], np.where(hit, col + 1, _PEEK))
        in_tail = hit & tail[rows, col]
        if in_tail.any():
            won = _first_fail_tail(tape, lanes[todo[in_tail]]) % 2 == 1
            count[todo[in_tail][won]] += 1
            hit[np.flatnonzero(in_tail)[won]] = False
        todo = todo[~hit & (count[todo] < cap)]
    return count


def _discrete_laplace_lanes(tape: _WordTape, t: int, slots: int) -> np.ndarray:
    """CKS 2020, Algorithm 2 with ``s = 1``: ``P(m) ~ exp(-|m| / t)`` per lane.

    Tape lanes come in groups of ``slots`` independent sequences per output
    lane. Each round runs one proposal ``(U, Bern(exp(-U/t)))`` on every slot
    of every pending output lane at once; the lowest accepted slot then draws
    ``V`` and the sign from its own sequence. A round without an accepted slot,
    or with the ``-0`` outcome, starts a new round: each round is an
    independent trial of Algorithm 2's loop body, so the output law is exact.
    """
    lanes = tape.ids.size // slots
    out = np.zeros(lanes, dtype=np.int64)
    cap = -(-_CAP_STEPS // t)
    todo = np.arange(lanes)
    while todo.size:
        virtual = (todo[:, None] * slots + np.arange(slots)).ravel()
        u = _draw_uniform(tape, virtual, t)
        keep = _bern_exp_fraction(tape, virtual, u, t).reshape(todo.size, slots)
        found = keep.any(axis=1)
        rows = np.flatnonzero(found)
        pick = rows * slots + np.argmax(keep[rows], axis=1)
        winners = virtual[pick]
        size = u[pick].astype(np.int64) + t * _geometric_exp1(tape, winners, cap)
        negative = (tape.take(winners) >> np.uint64(63)) == 1
        out[todo[rows]] = np.where(negative, -size, size)
        again = np.ones(todo.size, dtype=bool)
        again[rows] = negative & (size == 0)
        todo = todo[again]
    return out


def discrete_laplace_steps(
    key: NoiseKey, sample_ids: np.ndarray, stream: int, scale_steps: int, width: int
) -> np.ndarray:
    """Exact discrete Laplace noise, in grid steps, keyed by sample id.

    ``P(m) = (1 - r) / (1 + r) r^|m|`` with ``r = exp(-1 / scale_steps)``, for
    every integer ``m``: Canonne, Kamath and Steinke, "The Discrete Gaussian
    for Differential Privacy" (NeurIPS 2020), Algorithm 2 with scale
    ``t / s = scale_steps / 1``, built on their Algorithm 1 for
    ``Bern(exp(-gamma))``. Only integer arithmetic: uniform integers by exact
    rejection (:func:`uniform_below`), Bernoulli trials of rational
    probability by comparing them (:func:`first_fail_reciprocal` batches the
    ``Bern(1/K)`` trials).

    The count of ``Bern(exp(-1))`` successes stops at ``ceil(2^51 + 2^21) /
    t``, where ``|m| >= 2^51 + 2^21`` and the caller's clamp to ``+-2^51``
    steps fixes the output anyway (probability below ``exp(-2^11)`` for
    ``t <= 2^40``).

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
    """
    if not 1 <= scale_steps <= LaplacePerturb.MAX_SCALE_STEPS:
        raise ConfigError(f"scale_steps must lie in [1, 2^40], got {scale_steps}")
    tape = _WordTape(key, sample_ids, stream, width * _SLOTS)
    noise = _discrete_laplace_lanes(tape, scale_steps, _SLOTS)
    return noise.reshape(sample_ids.size, width)


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


def _laplace_coefficients(
    mech: LaplacePerturb, y: np.ndarray, ids: np.ndarray, key: NoiseKey, stream: int
) -> np.ndarray:
    k = mech.num_classes
    one = 1 << LaplacePerturb.GRID_BITS
    width = 1 if mech.is_binary else k
    steps = discrete_laplace_steps(key, ids, stream, mech.scale_steps, width)
    if mech.is_binary:
        t = y * one + steps[:, 0] * (1 - 2 * y)
        steps = np.stack([one - t, t], axis=1)
    else:
        steps = steps + one * one_hot(y, k).astype(np.int64)
    clamped = np.clip(steps, -_CLAMP_STEPS, _CLAMP_STEPS)
    return clamped.astype(np.float64) * LAPLACE_GRID


def _rr_coefficients(
    mech: RandomizedResponse, y: np.ndarray, ids: np.ndarray, key: NoiseKey, stream: int
) -> np.ndarray:
    k = mech.num_classes
    if mech.is_binary:
        word = key.words(ids, stream, 1)[:, 0]
        flip = word < np.uint64(rr_flip_threshold(mech.flip_probability))
        return one_hot(np.where(flip, 1 - y, y), k)
    words = key.words(ids, stream, 2)
    keep = words[:, 0] < np.uint64(rr_keep_threshold(mech.keep_probability))
    other = np.floor(uniforms53(words[:, 1]) * (k - 1)).astype(np.int64)
    other = other + (other >= y)
    return one_hot(np.where(keep, y, other), k)


def realized_noise(labels: np.ndarray, noisy: NoisyLabels) -> dict[str, float]:
    """Summarize the noise actually drawn for a set of labels.

    Returns
    -------
    dict
        ``flip_rate``: fraction of samples whose noisy coefficients point at
        another label (``argmax c != y``; for the Gaussian baseline, whose
        noise is additive, 0); ``mean_abs_noise``: mean absolute deviation of
        ``c`` from ``e_y`` per coordinate that moved (``|u|`` for binary
        Laplace), or of the additive noise.
    """
    y = np.asarray(labels, dtype=np.int64)
    if noisy.additive is not None:
        return {
            "flip_rate": 0.0,
            "mean_abs_noise": float(np.abs(noisy.additive).mean()),
        }
    c = noisy.coefficients
    deviation = c - one_hot(y, c.shape[1])
    flip_rate = float(np.mean(np.argmax(c, axis=1) != y))
    if c.shape[1] == 2:
        mean_abs = float(np.abs(deviation[:, 1]).mean())
    else:
        mean_abs = float(np.abs(deviation).mean())
    return {"flip_rate": flip_rate, "mean_abs_noise": mean_abs}
