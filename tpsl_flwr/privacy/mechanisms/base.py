"""What every GradPerturb mechanism declares, returns, and the registry of them.

A mechanism is a small frozen description (dp-accounting's ``dp_event.py``
style) that says, in one place: its parameter (``epsilon``, ``sigma`` or
none), its keyed noisy-label sampler, its accounting event and neighbouring
relation, and the closed forms the audit and the tests hold it to. Adding a
mechanism means adding one module that subclasses :class:`Mechanism` and
decorates the class with :func:`register`.

Every mechanism's sampler returns :class:`NoisyLabels`: all but the Gaussian
baseline are label randomizers, mapping the label ``y`` to a coefficient vector
``c`` over the ``k`` classes, and GradPerturb outputs ``sum_j c_j g_j`` (Yang et
al., Algorithms 2 and 4).

Two kinds of baseline defense do not fit a keyed sampler of ``(key, id)`` alone
(``docs/baselines.md``):

* ``gradient_noise``: noise computed per batch from the batch's clean
  cut-layer gradients and labels (Marvell, max-norm; Li et al. 2022):
  :meth:`Mechanism.perturb_batch`. They carry no DP guarantee
  (``dp_guarantee = False``).
* ``needs_prior``: a label randomizer whose law depends on a per-sample prior
  the label party computes at training time (RR-with-prior; Ghazi et al.
  2021): :meth:`Mechanism.sample_with_prior`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, TypeVar

import numpy as np

from tpsl_flwr._util.checks import check_num_classes
from tpsl_flwr.errors import ConfigError, PrivacyError

if TYPE_CHECKING:
    import dp_accounting

    from tpsl_flwr.privacy.keyed_noise import NoiseKey

__all__ = [
    "PARAMETERS",
    "REGISTRY",
    "BatchReference",
    "Mechanism",
    "NoisyLabels",
    "mechanism_class",
    "one_hot",
    "parameter_of",
    "register",
]


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


@dataclass(frozen=True)
class BatchReference:
    """What a gradient-noise mechanism keeps from one batch for the next.

    Marvell's noise needs both classes in a batch; a batch holding one class
    only is given the covariance the last two-class batch solved for
    (:mod:`~tpsl_flwr.privacy.mechanisms.marvell`).

    Attributes
    ----------
    values
        The mechanism's scalars (Marvell: ``lam10, lam20, lam11, lam21``).
    direction
        A unit vector of the cut-layer width (Marvell: ``g1 - g0``, normed).
    """

    values: tuple[float, ...]
    direction: np.ndarray


def one_hot(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Return the ``(n, k)`` float64 one-hot encoding of ``labels``."""
    out = np.zeros((labels.size, num_classes), dtype=np.float64)
    out[np.arange(labels.size), labels] = 1.0
    return out


PARAMETERS: tuple[str, ...] = ("epsilon", "sigma", "marvell_power")
"""Every parameter a mechanism may take, as :func:`make_mechanism
<tpsl_flwr.privacy.mechanisms.make_mechanism>` names it (the run config's key
is the same with ``-`` for ``_``)."""

REGISTRY: dict[str, type[Mechanism]] = {}
"""Every mechanism class by name, in registration order."""

M = TypeVar("M", bound="type[Mechanism]")


def register(cls: M) -> M:
    """Class decorator: add a mechanism to :data:`REGISTRY` under its ``name``."""
    if not cls.name or cls.name in REGISTRY:
        raise ConfigError(f"mechanism name {cls.name!r} is empty or taken")
    REGISTRY[cls.name] = cls
    return cls


def mechanism_class(name: str) -> type[Mechanism]:
    """The registered class of ``name``.

    Raises
    ------
    ConfigError
        For an unknown name, listing the valid ones.
    """
    if name not in REGISTRY:
        raise ConfigError(
            f"unknown mechanism {name!r}; valid mechanisms: {', '.join(REGISTRY)}"
        )
    return REGISTRY[name]


def parameter_of(name: str) -> str | None:
    """The parameter mechanism ``name`` takes (one of :data:`PARAMETERS`) or None.

    Examples
    --------
    >>> import tpsl_flwr.privacy.mechanisms
    >>> [parameter_of(n) for n in ("none", "laplace", "discrete", "gaussian")]
    [None, 'epsilon', 'epsilon', 'sigma']
    """
    return mechanism_class(name).parameter


@dataclass(frozen=True)
class Mechanism:
    """Base description of a GradPerturb mechanism.

    Attributes
    ----------
    num_classes
        The number of classes ``k`` (2 for binary).
    """

    name: ClassVar[str] = ""
    parameter: ClassVar[str | None] = None
    """The one parameter the mechanism takes (``epsilon``, ``sigma`` or None)."""
    parameter_field: ClassVar[str | None] = None
    """The dataclass field holding it, when not named as the parameter."""
    listing_order: ClassVar[int] = 99
    """Where the mechanism appears in lists (CLI choices, tables)."""
    additive: ClassVar[bool] = False
    """Whether the noise is added to ``g_y`` (Gaussian) rather than a label mix."""
    gradient_noise: ClassVar[bool] = False
    """Whether the noise is computed per batch from the clean cut-layer gradients
    (:meth:`perturb_batch`); the top model then trains on the exact labels."""
    needs_prior: ClassVar[bool] = False
    """Whether the sampler needs a per-sample prior (:meth:`sample_with_prior`)."""
    dp_guarantee: ClassVar[bool] = True
    """Whether the mechanism states any differential-privacy guarantee. False for
    heuristics (Marvell, max-norm): their epsilon is ``None`` everywhere."""
    num_classes: int = 2

    def __post_init__(self) -> None:
        check_num_classes(self.num_classes)

    @property
    def is_binary(self) -> bool:
        """Whether the mechanism is the binary (single-logit) variant."""
        return self.num_classes == 2

    @property
    def parameter_value(self) -> float | None:
        """The value of :attr:`parameter` (None for a mechanism without one)."""
        if self.parameter is None:
            return None
        return float(getattr(self, self.parameter_field or self.parameter))

    @property
    def epsilon(self) -> float | None:
        """The pure ``epsilon`` of one GradPerturb call, or ``None`` if none."""
        return None

    @property
    def protects(self) -> bool:
        """Whether the mechanism adds any noise at all."""
        return True

    @classmethod
    def keyed_labels(cls) -> bool:
        """Whether each label's release is a function of (key, id, label) alone.

        True for the label randomizers (``none``, ``laplace``, ``discrete``):
        their noisy labels can be drawn for any id at any time, which
        validation and the frequency prior need. False for the Gaussian
        baseline and the gradient-noise mechanisms (the labels stay clean) and
        for RR-with-prior (its law depends on a prior known at training time).
        """
        return not (cls.additive or cls.gradient_noise or cls.needs_prior)

    # ---------------------------------------------------------- declared once
    def sample(
        self,
        labels: np.ndarray,
        ids: np.ndarray,
        key: NoiseKey,
        stream: int,
        additive_dim: int | None,
    ) -> NoisyLabels:
        """Randomize validated ``labels`` with keyed noise (one word stream per id).

        A ``gradient_noise`` mechanism releases no noisy label: it refuses.
        """
        if self.gradient_noise:
            raise PrivacyError(
                f"{self.name} perturbs gradients per batch (perturb_batch); it has "
                "no per-label sampler"
            )
        raise NotImplementedError

    def sample_with_prior(
        self,
        labels: np.ndarray,
        ids: np.ndarray,
        key: NoiseKey,
        stream: int,
        prior: np.ndarray,
    ) -> NoisyLabels:
        """Randomize ``labels`` given each sample's ``(n, k)`` prior."""
        raise NotImplementedError(f"mechanism {self.name!r} takes no prior")

    def perturb_batch(
        self,
        grads: np.ndarray,
        labels: np.ndarray,
        normals: np.ndarray,
        reference: BatchReference | None,
    ) -> tuple[np.ndarray, BatchReference | None]:
        """Noisy per-sample cut-layer gradients of a batch (``gradient_noise``).

        Parameters
        ----------
        grads
            ``(n, d)`` float64 clean per-sample gradients ``g_y``.
        labels
            ``(n,)`` labels of the batch.
        normals
            ``(n, noise_width(d))`` independent standard normals (keyed).
        reference
            What an earlier batch left for the next (None at first).

        Returns
        -------
        tuple
            The ``(n, d)`` noisy gradients, and the reference to keep.
        """
        raise NotImplementedError(f"mechanism {self.name!r} perturbs no gradients")

    def noise_width(self, dim: int) -> int:
        """Standard normals per sample :meth:`perturb_batch` needs at width ``dim``."""
        raise NotImplementedError(f"mechanism {self.name!r} perturbs no gradients")

    def dp_event(self) -> dp_accounting.DpEvent:
        """The dp-accounting event of one release of one label."""
        raise NotImplementedError

    @property
    def neighboring(self) -> dp_accounting.NeighboringRelation:
        """The neighbouring relation the event is stated under."""
        import dp_accounting

        return dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE

    def expected_sda(self) -> float:
        """Closed-form SDA AUC (binary) or top-1 accuracy (k classes)."""
        raise NotImplementedError

    def expected_noise(self) -> dict[str, float]:
        """Expected ``flip_rate`` and ``mean_abs_noise`` of the sampler's output."""
        raise NotImplementedError
