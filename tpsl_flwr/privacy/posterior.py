"""Noise-aware training: the posterior of the true label given its noisy release.

GradPerturb makes the label party fit the coefficient-weighted loss ``sum_j
c_ij l(z_i, j)`` with the *same* noisy ``c_i`` every epoch, so later epochs
fit the noise ever harder. ALIBI (Malek et al., "Antipodes of Label
Differential Privacy: PATE and ALIBI", NeurIPS 2021, Section 3.2) trains
instead on the Bayesian posterior of the true label given the noisy
observation and a prior::

    P(y = j | c) = p_j P(c | y = j) / sum_l p_l P(c | y = l)

Yang et al.'s mechanisms (Algorithms 2 and 4) have closed-form likelihoods:

* binary Laplace, ``s = c_1 = y + u`` (``u`` symmetric): ``log P(s | y = 1) -
  log P(s | y = 0) = (|s| - |s - 1|) / b``;
* ``k``-class Laplace, ``c = e_y + U``, ``U_j`` iid: ``log P(c | y = j) =
  -(|c_j - 1| - |c_j|) / b`` plus a term common to every ``j``;
* randomized response, ``c = e_ỹ``: ``P(ỹ | y = j) = q`` if ``j == ỹ`` else
  ``(1 - q) / (k - 1)``, ``q = e^eps / (e^eps + k - 1)``;
* ``none``: ``c = e_y``, so the posterior is ``c`` itself.

The Laplace noise is the discrete Laplace law ``P(u = m L) ~ exp(-|m| / t)``
on the grid ``L = 2^-20`` (:mod:`tpsl_flwr.privacy.exact_laplace`); every
observation lies on that grid, and at grid points the likelihood ratio is
``exp(-(|s - 1| - |s|) / (t L))``: the continuous formula with the realized
scale ``b = t L`` (slightly above ``sensitivity / epsilon``), which is what is
used here. The clamp at ``+-2^31`` (probability below ``exp(-2^11)``) is
ignored.

The posterior is a function of the eps-DP release ``c`` and of a prior that is
itself a function of released values only (a model trained on noisy labels,
or frequencies of the noisy labels), so training on it is post-processing and
spends no budget. The Gaussian baseline releases ``g_y + r``, not a noisy
label, and has no posterior here.

Everything is computed in log space and normalized with the row maximum
subtracted, so rows are finite and sum to 1 for any epsilon.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tpsl_flwr.errors import ConfigError, PrivacyError
from tpsl_flwr.privacy.clipped_release import clipped_unbiased
from tpsl_flwr.privacy.mechanisms import LAPLACE_GRID, Mechanism

__all__ = [
    "DENOISERS",
    "DENOISE_PRIORS",
    "PRIOR_FLOOR",
    "check_denoisable",
    "frequency_prior",
    "log_likelihoods",
    "posterior_coefficients",
    "prior_from_mean",
    "unbiased_coefficients",
]

DENOISERS: tuple[str, ...] = ("none", "posterior")
"""What the label party trains on: the noisy labels, or their posterior."""
DENOISE_PRIORS: tuple[str, ...] = ("model", "frequency")
"""The prior of the posterior: the top model's prediction, or class frequencies."""
PRIOR_FLOOR = 1e-3
"""Mass mixed uniformly into :func:`frequency_prior` so no class has prior 0."""


def _laplace_scale(mechanism: Mechanism) -> float:
    """The realized Laplace scale ``t L`` (``t`` the sampler's integer scale)."""
    return float(mechanism.scale_steps) * LAPLACE_GRID  # type: ignore[attr-defined]


def _laplace(mechanism: Mechanism, c: np.ndarray) -> np.ndarray:
    b = _laplace_scale(mechanism)
    if mechanism.is_binary:
        s = c[:, 1]
        return np.stack([np.zeros_like(s), -(np.abs(s - 1.0) - np.abs(s)) / b], 1)
    return -(np.abs(c - 1.0) - np.abs(c)) / b


def _rr_log_keep_other(mechanism: Mechanism) -> tuple[float, float]:
    """``log q`` and ``log((1 - q) / (k - 1))`` of randomized response, stably."""
    eps = float(mechanism.epsilon)  # type: ignore[arg-type]
    tail = math.log1p((mechanism.num_classes - 1) * math.exp(-eps))
    return -tail, -eps - tail


def _randomized_response(mechanism: Mechanism, c: np.ndarray) -> np.ndarray:
    log_keep, log_other = _rr_log_keep_other(mechanism)
    return c * log_keep + (1.0 - c) * log_other


def _none(mechanism: Mechanism, c: np.ndarray) -> np.ndarray:
    """``c = e_y`` exactly: likelihood 1 for ``j = y``, 0 for the others."""
    return np.where(c == 1.0, 0.0, -np.inf)


_LIKELIHOODS: dict[str, Callable[[Mechanism, np.ndarray], np.ndarray]] = {
    "none": _none,
    "laplace": _laplace,
    "discrete": _randomized_response,
}
"""``log P(c | y = j)`` up to a per-row constant, by mechanism name."""


def check_denoisable(mechanism: Mechanism) -> None:
    """Refuse a mechanism whose release is not a noisy label.

    Raises
    ------
    ConfigError
        For additive mechanisms (the Gaussian baseline) and any mechanism
        without a likelihood here, naming it.
    """
    if mechanism.additive or mechanism.name not in _LIKELIHOODS:
        raise ConfigError(
            f"denoise = 'posterior' needs a mechanism that releases noisy labels "
            f"({', '.join(_LIKELIHOODS)}), got mechanism {mechanism.name!r}"
        )


def _checked(coefficients: object, k: int, what: str) -> np.ndarray:
    c = np.asarray(coefficients, dtype=np.float64)
    if c.ndim != 2 or c.shape[1] != k:
        raise PrivacyError(f"{what} must be (n, {k}), got shape {c.shape}")
    if not np.isfinite(c).all():
        raise PrivacyError(f"{what} are not finite")
    return c


def log_likelihoods(*, mechanism: Mechanism, coefficients: object) -> np.ndarray:
    """``log P(c_i | y_i = j)`` up to a constant per row, ``(n, k)``.

    Parameters
    ----------
    mechanism
        ``laplace`` or ``discrete`` (``none``'s observation is the label).
    coefficients
        ``(n, k)`` noisy label coefficients the mechanism released.

    Raises
    ------
    ConfigError
        For the Gaussian baseline (not a noisy label).
    PrivacyError
        For coefficients of the wrong shape or not finite.
    """
    check_denoisable(mechanism)
    c = _checked(coefficients, mechanism.num_classes, "noisy label coefficients")
    return _LIKELIHOODS[mechanism.name](mechanism, c)


def posterior_coefficients(
    *, mechanism: Mechanism, coefficients: object, prior: object
) -> np.ndarray:
    """The posterior ``P(y_i = j | c_i)`` of each sample's true label, ``(n, k)``.

    Malek et al. (NeurIPS 2021), ALIBI's soft labels: Bayes' rule with the
    mechanism's likelihood (module docstring) and ``prior``, computed in log
    space. Used as GradPerturb coefficients it is post-processing of the
    eps-DP release (Yang et al., Lemmas 3.2 and 4.3): epsilon is unchanged.

    Parameters
    ----------
    mechanism
        The mechanism that released ``coefficients``.
    coefficients
        ``(n, k)`` noisy label coefficients.
    prior
        ``(k,)`` or ``(n, k)`` positive class probabilities (rows are
        normalized here).

    Returns
    -------
    numpy.ndarray
        ``(n, k)`` float64, rows finite, non-negative and summing to 1. For
        ``none`` the coefficients themselves (an exact label's posterior).

    Raises
    ------
    ConfigError
        For the Gaussian baseline, naming it.
    PrivacyError
        For coefficients or a prior that are not finite, of the wrong shape,
        or a prior that is not positive (fail closed).

    Examples
    --------
    >>> from tpsl_flwr.privacy.mechanisms import make_mechanism
    >>> rr = make_mechanism("discrete", epsilon=math.log(3.0))  # q = 3/4
    >>> posterior_coefficients(mechanism=rr, coefficients=[[0.0, 1.0]],
    ...                        prior=[0.5, 0.5]).round(6)
    array([[0.25, 0.75]])
    """
    loglik = log_likelihoods(mechanism=mechanism, coefficients=coefficients)
    if not mechanism.protects:  # an exact label is its own posterior
        return _checked(coefficients, mechanism.num_classes, "coefficients").copy()
    k = mechanism.num_classes
    p = np.asarray(prior, dtype=np.float64)
    if p.ndim == 1:
        p = p[None, :]
    if p.ndim != 2 or p.shape[1] != k or p.shape[0] not in (1, loglik.shape[0]):
        raise PrivacyError(
            f"prior must be ({k},) or ({loglik.shape[0]}, {k}), got shape "
            f"{np.asarray(prior).shape}"
        )
    if not (np.isfinite(p).all() and (p > 0).all()):
        raise PrivacyError("prior probabilities must be positive and finite")
    logits = loglik + np.log(p)
    logits -= logits.max(axis=1, keepdims=True)
    post = np.exp(logits)
    post /= post.sum(axis=1, keepdims=True)
    if not np.isfinite(post).all():
        raise PrivacyError("the posterior is not finite")
    return post


def frequency_prior(
    *, mechanism: Mechanism, coefficients: object, floor: float = PRIOR_FLOOR
) -> np.ndarray:
    """Class frequencies estimated without bias from noisy labels, ``(k,)``.

    Laplace (and ``none``): ``E[c] = e_y``, so the mean of ``c`` estimates the
    class frequencies ``pi``. Randomized response: ``E[c] = q pi + o (1 - pi)``
    with ``o = (1 - q) / (k - 1)``, inverted as ``(mean c - o) / (q - o)``.
    The estimate is clipped at 0, normalized, and mixed with the uniform
    distribution, ``(1 - floor) pi + floor / k``, so every class keeps a
    positive prior. A function of the noisy labels only: post-processing.

    Parameters
    ----------
    mechanism
        The mechanism that released ``coefficients``.
    coefficients
        ``(n, k)`` noisy label coefficients of all training samples.
    floor
        Mass in ``[0, 1)`` spread uniformly over the classes.

    Raises
    ------
    ConfigError
        For the Gaussian baseline or a floor outside ``[0, 1)``.
    PrivacyError
        For coefficients that are empty or not finite.

    Examples
    --------
    >>> from tpsl_flwr.privacy.mechanisms import make_mechanism
    >>> rr = make_mechanism("discrete", epsilon=math.log(3.0))  # q = 3/4
    >>> c = [[1.0, 0.0]] * 5 + [[0.0, 1.0]] * 3  # mean (0.625, 0.375)
    >>> frequency_prior(mechanism=rr, coefficients=c, floor=0.0).round(6)
    array([0.75, 0.25])
    """
    check_denoisable(mechanism)
    if not 0.0 <= floor < 1.0:
        raise ConfigError(f"floor must be in [0, 1), got {floor!r}")
    k = mechanism.num_classes
    c = _checked(coefficients, k, "noisy label coefficients")
    if c.shape[0] == 0:
        raise PrivacyError("frequency prior needs at least one noisy label")
    mean = unbiased_coefficients(mechanism=mechanism, coefficients=c).mean(axis=0)
    return prior_from_mean(mean, floor=floor)


def prior_from_mean(mean: np.ndarray, *, floor: float = PRIOR_FLOOR) -> np.ndarray:
    """Class frequencies from the mean of unbiased coefficients, ``(k,)``.

    The last step of :func:`frequency_prior`, for a mean accumulated in
    chunks: clipped at 0, normalized, mixed with ``floor`` of the uniform law.

    Raises
    ------
    ConfigError
        For a floor outside ``[0, 1)``.
    PrivacyError
        For a mean that is not a finite vector.
    """
    if not 0.0 <= floor < 1.0:
        raise ConfigError(f"floor must be in [0, 1), got {floor!r}")
    m = np.asarray(mean, dtype=np.float64)
    if m.ndim != 1 or m.size == 0 or not np.isfinite(m).all():
        raise PrivacyError(f"a mean of coefficients must be a finite vector, got {m!r}")
    k = m.size
    estimate = np.clip(m, 0.0, None)
    total = estimate.sum()
    pi = estimate / total if total > 0 else np.full(k, 1.0 / k)
    return (1.0 - floor) * pi + floor / k


def unbiased_coefficients(*, mechanism: Mechanism, coefficients: object) -> np.ndarray:
    """Noisy label coefficients mapped to an unbiased estimate of ``e_y``, ``(n, k)``.

    Laplace: ``c = e_y + U`` is unbiased already, but its tails carry variance
    and no information; the estimate is ``c`` clipped to ``[0, 1]`` (a
    sufficient statistic) and debiased,
    :func:`~tpsl_flwr.privacy.clipped_release.clipped_unbiased` (variance 1.21
    against 2 per coordinate at ``eps = 1``). ``none``: ``c = e_y``. Randomized
    response: ``E[c] = q e_y + o (1 - e_y)`` with ``o = (1 - q) / (k - 1)``, so
    ``(c - o) / (q - o)`` (an affine map of each release: its rows still sum to
    1, and the gradient ``sum_j c_j g_j`` stays on the line through the ``g_j``).
    A function of the release only: post-processing.

    Parameters
    ----------
    mechanism
        The mechanism that released ``coefficients``.
    coefficients
        ``(n, k)`` noisy label coefficients.

    Raises
    ------
    ConfigError
        For the Gaussian baseline (it releases no noisy label).
    PrivacyError
        For coefficients of the wrong shape or not finite.

    Examples
    --------
    >>> from tpsl_flwr.privacy.mechanisms import make_mechanism
    >>> rr = make_mechanism("discrete", epsilon=math.log(3.0))  # q = 3/4
    >>> unbiased_coefficients(mechanism=rr, coefficients=[[0.0, 1.0]])
    array([[-0.5,  1.5]])
    """
    check_denoisable(mechanism)
    c = _checked(coefficients, mechanism.num_classes, "noisy label coefficients")
    if mechanism.name == "laplace":
        return clipped_unbiased(c, _laplace_scale(mechanism))
    if mechanism.name != "discrete":
        return c
    log_keep, log_other = _rr_log_keep_other(mechanism)
    keep, other = math.exp(log_keep), math.exp(log_other)
    return (c - other) / (keep - other)
