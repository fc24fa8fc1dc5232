"""The held-out split: when a run holds out training ids, and which ones.

The label party can hold out a fraction of the training ids, score every epoch
on their noisy labels and restore the best epoch
(:mod:`~tpsl_flwr.validation.best_epoch`). That pays where a run trains long
enough to fit its reused noise (Yang et al., Section 6: one noisy label per
sample, every epoch) and the held-out labels are numerous enough to tell
epochs apart; elsewhere it only costs the held-out rows. ``auto`` (the
default) therefore holds out :data:`AUTO_FRACTION` of the training ids only
where the run has at least :data:`AUTO_MIN_EPOCHS` epochs *and* that fraction
is at least :data:`AUTO_MIN_IDS` ids *and* the data has hashed codes that the
deep part memorizes (the Criteo and Avazu files); otherwise none, and the last
epoch (or the tail average) is kept. The Gaussian baseline, Marvell and
max-norm, whose labels stay clean, and RR-with-prior, whose draws need a prior
from training, never hold out. A number decides outright (``0``: no
validation).

The measurements behind the rule are in ``docs/benchmarks.md``
("validation-fraction = auto").

The rule reads the row count of the training split and the epochs, public
facts (no label). It is the label party's alone (the nodes train whatever ids
it sends); the resolved fraction is part of the noise binding and reported
in ``results.json`` (``training.validation_fraction``).

Membership is public: a training id is held out iff a hash of the id and the
run's seed falls below ``validation_fraction`` (:func:`validation_ids`), a
function of the id alone, never of a label. :class:`Validation` holds a run's
held-out ids, their score (:mod:`~tpsl_flwr.validation.scores`) and the best
epoch (:mod:`~tpsl_flwr.validation.best_epoch`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from tpsl_flwr._util.compact_ints import index_dtype, true_positions
from tpsl_flwr.data.membership import hash_uniform
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.parties import LabelParty
from tpsl_flwr.privacy.mechanisms import mechanism_class
from tpsl_flwr.validation.best_epoch import BestEpoch
from tpsl_flwr.validation.scores import unbiased_targets, validation_class_losses

__all__ = [
    "AUTO_FRACTION",
    "AUTO_MIN_EPOCHS",
    "AUTO_MIN_IDS",
    "MAX_FRACTION",
    "Validation",
    "resolve_validation",
    "validation_ids",
    "validation_mode",
]

AUTO_FRACTION = 0.1
"""The fraction ``auto`` holds out where it holds out."""
AUTO_MIN_EPOCHS = 3
"""``auto``: runs of fewer epochs train on every id (a 2-epoch run's later
epoch was as good or better in the measurements above)."""
AUTO_MIN_IDS = 2_000
"""``auto``: fewer held-out ids than this cannot tell epochs apart under the
noise (a few hundred noisy labels kept the first epoch on every small table)."""
MAX_FRACTION = 0.5
"""An explicit fraction is in ``[0, MAX_FRACTION)``."""


def validation_mode(value: object) -> float | str:
    """``value`` as ``"auto"`` or a fraction in ``[0, 0.5)``.

    Numbers, and text that reads as one (the CLI, TOML strings), become a
    float.

    Raises
    ------
    ConfigError
        Naming the value, for anything else.

    Examples
    --------
    >>> validation_mode("AUTO"), validation_mode("0.2"), validation_mode(0)
    ('auto', 0.2, 0.0)
    """
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return "auto"
        try:
            number = float(text)
        except ValueError:
            number = math.nan
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    else:
        number = math.nan
    if not 0.0 <= number < MAX_FRACTION:
        raise ConfigError(
            f"validation-fraction must be 'auto' or in [0, {MAX_FRACTION}), "
            f"got {value!r}"
        )
    return number + 0.0  # -0.0 -> 0.0


def resolve_validation(
    value: float | str,
    *,
    train_rows: int,
    epochs: int,
    mechanism: str,
    hashed_codes: bool = True,
) -> float:
    """The fraction of training ids held out, ``auto`` resolved.

    ``hashed_codes``: the data has columns of hashed codes that a deep part
    memorizes within a few passes (the Criteo and Avazu files; the default,
    for data the rule does not know, as an embedder's), so a later epoch can
    fall far below an early one and the run must restore its best epoch.
    ``False`` (the built-in tables, whose categorical columns have 3 to 100
    values): ``auto`` holds nothing out, and a run of 5 epochs or more returns
    the tail average of its weights over every row instead
    (:func:`~tpsl_flwr.parties.weight_average.resolve_average`; its last
    epoch where the epoch budget leaves it still learning: breast-cancer and
    digits under heavy noise). On
    synthetic-ctr 200k, 8 epochs, seeds 0-2, the hold-out kept epoch 1-3 by
    its one-standard-error rule on noisy labels and returned .7613 (Laplace
    eps 1; best epoch .7650) and .7700 (randomized response; .7732); the tail
    average returned .7710 and .7736, above the best single epoch
    (``docs/training.md``, "The hold-out against the tail average"). A
    public fact: the run config's dataset.

    Examples
    --------
    >>> resolve_validation("auto", train_rows=160_000, epochs=8, mechanism="laplace")
    0.1
    >>> resolve_validation("auto", train_rows=160_000, epochs=2, mechanism="laplace")
    0.0
    >>> resolve_validation("auto", train_rows=4_000, epochs=8, mechanism="laplace")
    0.0
    >>> resolve_validation("auto", train_rows=160_000, epochs=8, mechanism="laplace",
    ...                    hashed_codes=False)
    0.0
    >>> resolve_validation("auto", train_rows=160_000, epochs=8, mechanism="gaussian")
    0.0
    >>> resolve_validation(0.25, train_rows=100, epochs=1, mechanism="none")
    0.25
    """
    mode = validation_mode(value)
    if mode != "auto":
        return float(mode)
    if (
        not hashed_codes
        or not mechanism_class(mechanism).keyed_labels()
        or epochs < AUTO_MIN_EPOCHS
        or AUTO_FRACTION * train_rows < AUTO_MIN_IDS
    ):
        return 0.0
    return AUTO_FRACTION


_VALIDATION_DOMAIN = 0x76616C69  # ASCII "vali": apart from the test split's hash


def validation_ids(num_train: int, fraction: float, seed: int) -> np.ndarray:
    """Training ids held out for validation: a hash of the id and seed alone.

    Parameters
    ----------
    num_train
        Training ids are ``0..num_train-1`` (positions in record-id order).
    fraction
        Probability of an id being held out, in ``[0, 0.5)``; 0: none.
    seed
        The run's public seed.

    Returns
    -------
    np.ndarray
        Sorted int64 ids; empty for ``fraction = 0``.

    Examples
    --------
    >>> ids = validation_ids(10_000, 0.1, seed=0)
    >>> 900 < ids.size < 1100, bool((np.diff(ids) > 0).all())
    (True, True)
    """
    if not 0.0 <= fraction < 0.5:
        raise ConfigError(f"validation fraction must be in [0, 0.5), got {fraction}")
    if fraction == 0.0:
        return np.zeros(0, dtype=np.int64)
    positions = np.arange(num_train, dtype=index_dtype(num_train))
    held_out = hash_uniform(positions, seed ^ _VALIDATION_DOMAIN) < fraction
    return positions[held_out].astype(np.int64)


class Validation:
    """The held-out ids of a run, their debiased noisy targets and the best epoch.

    Parameters
    ----------
    num_train
        Training ids are ``0..num_train-1``.
    fraction, seed
        As :func:`validation_ids`; ``fraction = 0`` holds out nothing.
    """

    def __init__(self, num_train: int, fraction: float, seed: int) -> None:
        self.fraction = float(fraction)
        self.ids = validation_ids(num_train, fraction, seed)
        trained = np.ones(num_train, dtype=bool)
        trained[self.ids] = False
        self.pool = true_positions(trained)
        """The ids trained on (increasing; int32 below 2**31 ids, held a whole run)."""
        self.best = BestEpoch()
        self._targets: np.ndarray | None = None

    @property
    def active(self) -> bool:
        """Whether any id is held out (else every epoch is kept, the last wins)."""
        return bool(self.ids.size)

    def query(self, num_test: int) -> tuple[list[np.ndarray], list[str]]:
        """The ids an evaluation query embeds (validation, then test), their splits."""
        ids, splits = [], []
        if self.active:
            ids.append(self.ids)
            splits.append("train")
        if num_test:
            ids.append(np.arange(num_test, dtype=np.int64))
            splits.append("test")
        return ids, splits

    def score(self, party: LabelParty, embeddings: torch.Tensor | np.ndarray) -> float:
        """The epoch's validation loss (:func:`noisy_validation_loss`).

        Its per-id losses wait in ``best.pending`` for the epoch's decision.
        """
        return self.score_class_losses(
            party, validation_class_losses(party, embeddings)
        )

    def score_class_losses(self, party: LabelParty, class_losses: np.ndarray) -> float:
        """:meth:`score` from the per-class losses ``(n_val, k)`` of the ids.

        The evaluation query computes them chunk by chunk
        (:mod:`~tpsl_flwr.strategies.evaluation_query`).
        """
        if self._targets is None:
            self._targets = unbiased_targets(party, self.ids)
        losses = (class_losses * self._targets).sum(axis=1)
        self.best.pending, self.best.pending_classes = losses, class_losses
        return float(losses.mean())
