"""GradPerturb mechanisms: one module each, all in one registry.

Each module declares its mechanism's parameter, keyed sampler, accounting
event and closed forms (:class:`~tpsl_flwr.privacy.mechanisms.base.Mechanism`);
adding a mechanism is adding one module and importing it here.

* ``none``: plain split learning, ``c = e_y`` (no protection);
* ``laplace``: ``c = (1 - t, t)``, ``t = y + u (1 - 2y)``, ``u ~ Lap(1/eps)``
  (binary) or ``c = e_y + U``, ``U_j ~ Lap(2/eps)`` (k classes);
* ``discrete``: randomized response on the label;
* ``gaussian``: the baseline ``g_y + r``, ``r ~ N(0, sigma^2 I)``;
* ``marvell``, ``max-norm``: the per-batch gradient noise of Li et al. 2022
  (no DP guarantee);
* ``rr-prior``: randomized response with a prior (Ghazi et al. 2021),
  ``epsilon``-label-DP at the label party's training.
"""

from __future__ import annotations

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.privacy.mechanisms.base import (
    PARAMETERS,
    REGISTRY,
    Mechanism,
    mechanism_class,
    parameter_of,
    register,
)
from tpsl_flwr.privacy.mechanisms.gaussian import GaussianPerturb
from tpsl_flwr.privacy.mechanisms.laplace import LAPLACE_GRID, LaplacePerturb
from tpsl_flwr.privacy.mechanisms.marvell import MarvellPerturb
from tpsl_flwr.privacy.mechanisms.max_norm import MaxNormPerturb
from tpsl_flwr.privacy.mechanisms.none import NoProtection
from tpsl_flwr.privacy.mechanisms.randomized_response import (
    RandomizedResponse,
    rr_flip_threshold,
    rr_keep_threshold,
)
from tpsl_flwr.privacy.mechanisms.rr_prior import RRWithPrior

__all__ = [
    "LAPLACE_GRID",
    "MECHANISMS",
    "PARAMETERS",
    "REGISTRY",
    "GaussianPerturb",
    "LaplacePerturb",
    "MarvellPerturb",
    "MaxNormPerturb",
    "Mechanism",
    "NoProtection",
    "RRWithPrior",
    "RandomizedResponse",
    "make_mechanism",
    "mechanism_class",
    "parameter_of",
    "register",
    "rr_flip_threshold",
    "rr_keep_threshold",
]

MECHANISMS: tuple[str, ...] = tuple(
    sorted(REGISTRY, key=lambda name: REGISTRY[name].listing_order)
)
"""Names accepted by :func:`make_mechanism`."""


def make_mechanism(
    name: str,
    *,
    epsilon: float | None = None,
    sigma: float | None = None,
    marvell_power: float | None = None,
    num_classes: int = 2,
) -> Mechanism:
    """Build a mechanism from its name and whatever settings a config holds.

    The mechanism takes the one parameter it declares
    (:func:`~tpsl_flwr.privacy.mechanisms.base.parameter_of`) and ignores the
    other, so one config-driven call works for every mechanism:
    ``make_mechanism(cfg.mechanism, epsilon=cfg.epsilon, sigma=cfg.sigma)``.

    Parameters
    ----------
    name
        One of :data:`MECHANISMS`.
    epsilon
        The privacy budget of ``laplace``, ``discrete`` and ``rr-prior``; > 0.
    sigma
        The noise standard deviation of ``gaussian``; must be > 0.
    marvell_power
        The power constraint scale of ``marvell`` (``P = s ||g1 - g0||^2``); > 0.
    num_classes
        The number of classes ``k >= 2``.

    Returns
    -------
    Mechanism
        The frozen description.

    Raises
    ------
    ConfigError
        For an unknown name (the valid ones are listed), or a missing or
        invalid value of the parameter the mechanism takes.

    Examples
    --------
    >>> make_mechanism("laplace", epsilon=1.0).scale
    1.0
    >>> rr = make_mechanism("discrete", epsilon=2.0, num_classes=10)
    >>> round(rr.keep_probability, 4)
    0.4509
    >>> make_mechanism("none", epsilon=1.0).name  # ignores what it does not take
    'none'
    """
    cls = mechanism_class(name)
    given = {"epsilon": epsilon, "sigma": sigma, "marvell_power": marvell_power}
    if cls.parameter is None:
        return cls(num_classes=num_classes)
    value = given[cls.parameter]
    if value is None:
        raise ConfigError(f"mechanism {name!r} needs {cls.parameter}")
    field = cls.parameter_field or cls.parameter
    return cls(num_classes=num_classes, **{field: value})
