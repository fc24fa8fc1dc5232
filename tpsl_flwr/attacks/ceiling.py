"""Attack success against the epsilon-DP ceiling: above it, or sampling error.

An ``(epsilon, 0)``-DP label caps the AUC of any attack at
``e^eps / (1 + e^eps)`` (:func:`~tpsl_flwr.privacy.closed_forms.auc_bound`),
but a measured AUC is an estimate over finitely many samples: on the 456
training samples of breast cancer its standard error is about 0.02, so an SDA
AUC of 0.733 against the ceiling 0.731 says nothing. One rule, used by the
per-epoch attack report, the progress line, ``report.md``, the sweep tables
and ``tpsl-flwr audit``:

* **above the ceiling** when the value is more than
  :data:`SIGMAS_OF_TOLERANCE` (4) standard errors above the ceiling, or, where
  an empirical epsilon lower bound at :data:`STRICT_CONFIDENCE` (99.9%) is
  given, when that bound exceeds epsilon (a violation of the guarantee);
* **within sampling error** when it is above the ceiling by less;
* **below the ceiling** otherwise.

At the boundary (an AUC of exactly 1 or 0, a top-1 accuracy of 1) the
standard error is 0 and says nothing: randomized response at eps 8 flips
each label with probability ``1 / (1 + e^8) = 3.4e-4``, so on 7,956 rows no
label flips with probability ``(1 - 3.4e-4)^7956 = 0.07`` and the attack's AUC
is exactly 1, above the ceiling 0.9997 by "infinitely many" standard errors.
There an exact test decides alone: the empirical epsilon lower bound at
:data:`STRICT_CONFIDENCE` (Clopper-Pearson rates on a held-out half,
:func:`~tpsl_flwr.privacy.empirical.epsilon_lower_bound`, the test ``tpsl-flwr
audit`` runs) above epsilon is a violation; otherwise the value is within
sampling error (consistent with the guarantee).

The standard error of a pooled AUC is Hanley and McNeil's (1982,
:func:`~tpsl_flwr.metrics.auc.auc_standard_error`) over the samples it was computed
on; that of a top-1 accuracy is the binomial ``sqrt(p (1 - p) / n)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpsl_flwr.metrics.auc import auc_standard_error

__all__ = [
    "ABOVE",
    "BELOW",
    "SIGMAS_OF_TOLERANCE",
    "STRICT_CONFIDENCE",
    "VERDICTS",
    "WITHIN",
    "CeilingTest",
    "accuracy_standard_error",
    "ceiling_test",
    "ceiling_text",
    "ceiling_verdict",
    "pooled_auc_standard_error",
]

STRICT_CONFIDENCE = 0.999
"""Confidence of the epsilon lower bound that decides a violation."""
SIGMAS_OF_TOLERANCE = 4.0
"""How many standard errors above the ceiling count as a violation."""
BELOW = "below the ceiling"
WITHIN = "within sampling error"
ABOVE = "above the ceiling"
VERDICTS = (BELOW, WITHIN, ABOVE)
"""The three verdicts of :func:`ceiling_verdict`, from harmless to violation."""


@dataclass(frozen=True)
class CeilingTest:
    """The verdict of :func:`ceiling_test` and why (empty unless above).

    Attributes
    ----------
    verdict
        One of :data:`VERDICTS`.
    reasons
        One sentence per violated condition (empty unless ``verdict == ABOVE``).
    """

    verdict: str
    reasons: tuple[str, ...] = ()


def ceiling_test(
    *,
    value: float,
    standard_error: float,
    ceiling: float,
    epsilon: float | None = None,
    epsilon_lower_bound: float | None = None,
    name: str = "AUC",
) -> CeilingTest:
    """Compare a measured attack success with the epsilon-DP ceiling.

    Parameters
    ----------
    value
        The measured AUC (or top-1 accuracy, with its ceiling).
    standard_error
        Its standard error over the samples it was computed on.
    ceiling
        The bound ``epsilon``-DP puts on ``value``.
    epsilon, epsilon_lower_bound
        Optionally, the guarantee and an empirical lower bound on epsilon at
        :data:`STRICT_CONFIDENCE`: a bound above ``epsilon`` is a violation.
        At the boundary (``standard_error == 0``) the bound alone decides; a
        value above the ceiling with no bound is then within sampling error.
    name
        What ``value`` is, for the reasons.

    Returns
    -------
    CeilingTest
        The verdict and, when above the ceiling, the reasons.

    Raises
    ------
    ValueError
        If ``value``, ``standard_error`` or ``ceiling`` is NaN, or the
        standard error is negative.

    Examples
    --------
    >>> ceiling_test(value=0.95, standard_error=0.0015, ceiling=0.7311).reasons
    ('AUC 0.9500 exceeds the epsilon-DP ceiling 0.7311 by more than 4 standard errors (0.0015)',)

    At the boundary the exact test decides (randomized response at eps 8 with
    no label flipped; clean labels claimed as eps 1):

    >>> ceiling_test(value=1.0, standard_error=0.0, ceiling=0.99966, epsilon=8.0,
    ...              epsilon_lower_bound=6.28).verdict
    'within sampling error'
    >>> ceiling_test(value=1.0, standard_error=0.0, ceiling=0.7311, epsilon=1.0,
    ...              epsilon_lower_bound=6.28).verdict
    'above the ceiling'
    """  # noqa: E501
    if math.isnan(value) or math.isnan(standard_error) or math.isnan(ceiling):
        raise ValueError(
            f"ceiling test needs numbers, got value={value}, standard_error="
            f"{standard_error}, ceiling={ceiling}"
        )
    if standard_error < 0:
        raise ValueError(f"standard_error must be >= 0, got {standard_error}")
    reasons = []
    if (
        epsilon is not None
        and epsilon_lower_bound is not None
        and math.isfinite(epsilon)
        and epsilon_lower_bound > epsilon
    ):
        reasons.append(
            f"empirical epsilon lower bound {epsilon_lower_bound:.4f} "
            f"({STRICT_CONFIDENCE:.1%} confidence) exceeds epsilon {epsilon:g}"
        )
    # At the boundary the normal approximation is degenerate (module doc).
    boundary = standard_error == 0.0
    if not boundary and value > ceiling + SIGMAS_OF_TOLERANCE * standard_error:
        reasons.append(
            f"{name} {value:.4f} exceeds the epsilon-DP ceiling {ceiling:.4f} by "
            f"more than {SIGMAS_OF_TOLERANCE:g} standard errors "
            f"({standard_error:.4f})"
        )
    if reasons:
        return CeilingTest(ABOVE, tuple(reasons))
    return CeilingTest(WITHIN if value > ceiling else BELOW)


def ceiling_verdict(
    auc: float | None,
    se: float | None,
    ceiling: float | None,
    *,
    epsilon_lower_bound: float | None = None,
) -> str | None:
    """``"below the ceiling"``, ``"within sampling error"`` or ``"above the ceiling"``.

    :func:`ceiling_test`'s verdict for an AUC and its standard error; ``None``
    where there is nothing to compare (no ceiling, or no finite AUC). The
    exact test at the boundary compares ``epsilon_lower_bound`` with the
    epsilon of the ceiling, ``ln(c / (1 - c))`` (for a prior-aware ceiling,
    the eps-DP guarantee that would allow the same AUC).

    Examples
    --------
    The reviewer's case, a 1-epoch breast-cancer run (456 training samples,
    286 positive), and a broken mechanism on 20,000 samples:

    >>> ceiling_verdict(0.7332, pooled_auc_standard_error(0.7332, 286, 170), 0.7311)
    'within sampling error'
    >>> ceiling_verdict(0.95, pooled_auc_standard_error(0.95, 10000, 10000), 0.73)
    'above the ceiling'
    >>> ceiling_verdict(0.70, 0.02, 0.7311), ceiling_verdict(0.7, 0.02, None)
    ('below the ceiling', None)
    """
    if auc is None or se is None or ceiling is None:
        return None
    if not (math.isfinite(auc) and math.isfinite(se) and math.isfinite(ceiling)):
        return None
    epsilon = math.log(ceiling / (1.0 - ceiling)) if 0.5 <= ceiling < 1.0 else None
    return ceiling_test(
        value=auc,
        standard_error=se,
        ceiling=ceiling,
        epsilon=epsilon,
        epsilon_lower_bound=epsilon_lower_bound,
    ).verdict


def ceiling_text(ceiling: float, without_prior: float | None = None) -> str:
    """The ceiling as printed: the plain eps ceiling beside the prior-aware one.

    When the top model trains on the posterior, the verdicts use the
    prior-aware ceiling (:mod:`~tpsl_flwr.privacy.prior_bound`), higher than
    ``e^eps / (1 + e^eps)``; printed alone it would read as a weaker
    guarantee than the run has, so the plain one comes first, with its eps.

    Examples
    --------
    >>> ceiling_text(0.7311)
    'ceiling 0.731'
    >>> ceiling_text(0.828, without_prior=0.7311)
    'ceiling 0.731 at eps 1; 0.828 with the label prior'
    """
    if without_prior is None or without_prior >= ceiling or without_prior >= 1.0:
        return f"ceiling {ceiling:.3f}"
    epsilon = math.log(without_prior / (1.0 - without_prior))
    return (
        f"ceiling {without_prior:.3f} at eps {epsilon:.3g}; "
        f"{ceiling:.3f} with the label prior"
    )


def pooled_auc_standard_error(auc: float, n_pos: int, n_neg: int) -> float:
    """Hanley-McNeil standard error of a pooled AUC; NaN for a NaN AUC or one class.

    Examples
    --------
    >>> round(pooled_auc_standard_error(0.7332, 286, 170), 4)
    0.0231
    >>> pooled_auc_standard_error(float("nan"), 0, 456)
    nan
    """
    if n_pos < 1 or n_neg < 1 or not math.isfinite(auc):
        return math.nan
    return auc_standard_error(auc, n_pos, n_neg)


def accuracy_standard_error(accuracy: float, samples: int) -> float:
    """Binomial standard error ``sqrt(p (1 - p) / n)`` of a top-1 accuracy.

    Examples
    --------
    >>> round(accuracy_standard_error(0.5, 10000), 4)
    0.005
    """
    if samples < 1 or not math.isfinite(accuracy):
        return math.nan
    return math.sqrt(max(accuracy * (1.0 - accuracy), 0.0) / samples)
