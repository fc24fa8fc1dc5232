"""How a party trains by default: batch size and learning rate from the rows, denoising.

Pure rules of public facts (the training rows, the epochs, the mechanism and
the label schema), shared by the label party built in one call
(:meth:`~tpsl_flwr.strategies.TPSLStrategy.for_labels`), the experiments'
run config (:mod:`tpsl_flwr.experiments.training_settings`) and every node,
which resolves the same values from the same public facts. Flower-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpsl_flwr._util.checks import check_int
from tpsl_flwr.errors import ConfigError

__all__ = [
    "NOISY_LABELS",
    "TrainingSettings",
    "heavy_label_noise",
    "resolve_denoise",
    "resolve_schedule",
    "resolve_training",
    "wide_budget",
]

AUTO_BATCH_SIZES = (32, 64, 128, 256)
"""The batch sizes ``batch-size = 0`` chooses from."""
MIN_STEPS_PER_EPOCH = 64
"""``batch-size = 0``: the largest batch that still gives this many steps."""
BASE_LR = 3e-3
"""``lr = 0`` with many steps (chosen on 200k synthetic rows, 8 epochs)."""
MAX_LR = 1e-2
"""``lr = 0`` with few steps: no faster than this."""
BASE_LR_STEPS = 4000
"""``lr = 0``: runs of fewer optimizer steps than this get a larger rate."""
BESIDE_FTRL_LR = 1e-3
"""``lr = 0`` beside an FTRL wide part (``wide-optimizer = ftrl``): the deep
and top parts' rate (5000 generated Criteo rows, 2 epochs, batch 32, seed 0,
unprotected: 1e-2 reached 0.764 and fell to 0.699 in its second epoch, 1e-3
rose to 0.769; Laplace eps 1: 1e-3 and 1e-4 alike, 0.657 and 0.656)."""

NOISY_LABELS = ("laplace", "discrete")
"""Mechanisms whose output is a noisy label (the posterior applies)."""
BUDGET_EPOCHS = 2
"""``lr = 0`` on small data that revisits a fixed signal (:func:`resolve_training`):
runs of more epochs than this share this many epochs' worth of steps."""
NOISY_BUDGET_EPOCHS = 1
"""The epoch budget of a run past :data:`BUDGET_EPOCHS` epochs on heavily noisy
labels with at least :data:`MIN_STEPS_PER_EPOCH` steps an epoch
(:func:`resolve_training`): one epoch's worth of the 2-epoch rate, spread over
all its epochs. Two epochs' worth took such a run past its best mid-run:
generated Criteo 20,000 rows, seeds 0-2, test AUC per epoch of 16 peaked at
epoch 6-8 and fell by .02 (16 - 2 epochs: Laplace -.0081, randomized response
-.0070); at one epoch's worth it rose to its last epoch, at 8 epochs as at
16; synthetic-ctr 40k, 8 epochs: .7119 -> .7223 (Laplace) and .7252 -> .7275
(``docs/training.md``, "One epoch's worth on noisy labels")."""
SMALL_DATA_ROWS = 50_000
"""``lr = 0``: the most training rows the epoch budget applies to (the FTRL wide
part goes further, to ``WIDE_AUTO_MAX_ROWS``; the budget was measured only up to
this many); larger runs keep learning at the rule's rate (synthetic-ctr 200k,
8 epochs: ``none`` 0.810 at the last epoch)."""


CYCLE_EPOCHS = 2
"""``lr-schedule = auto`` where it restarts (:func:`resolve_schedule`): the
epochs of one cosine cycle, as many as a 2-epoch run's one."""
SCHEDULE_CHOICES = ("auto", "constant", "cosine", "restarts")
"""``lr-schedule`` values: ``auto`` resolves to ``cosine`` or ``restarts``."""


def heavy_label_noise(
    mechanism: str, *, classes: int = 2, epsilon: float = 1.0
) -> bool:
    """Whether the labels the run trains on are noisy enough for the posterior.

    Noisy labels (``laplace``, ``discrete``) of two classes, or of more classes
    where randomized response would keep fewer than half of them, ``e^eps /
    (e^eps + k - 1) < 1/2``: where ``denoise = auto`` takes the posterior
    (:func:`resolve_denoise`) and where an ``lr = 0`` run on small data keeps
    an epoch budget (:func:`resolve_training`). Public facts only.

    Examples
    --------
    >>> heavy_label_noise("laplace"), heavy_label_noise("none")
    (True, False)
    >>> [heavy_label_noise("discrete", classes=10, epsilon=e) for e in (1, 4)]
    [True, False]
    """
    if mechanism not in NOISY_LABELS:
        return False
    keeps = 1.0 / (1.0 + (classes - 1) * math.exp(-epsilon))
    return classes == 2 or keeps < 0.5


def resolve_denoise(
    denoise: str, mechanism: str, *, classes: int = 2, epsilon: float = 1.0
) -> str:
    """``denoise`` with ``auto`` resolved from the mechanism and public schema.

    ``auto``: the posterior for noisy labels (``laplace``, ``discrete``) of two
    classes, and of more classes only where the noise is heavy: randomized
    response would keep fewer than half of them, ``e^eps / (e^eps + k - 1) <
    1/2``. Otherwise ``none``. With many classes and light noise the model's
    own prior pulls the labels towards its early mistakes (digits, 10
    classes, discrete eps 4, 5 epochs, seeds 0-2: accuracy 0.945 / 0.939 /
    0.936 without it, 0.921 / 0.892 / 0.874 with it); at eps 1 (keeps 0.23)
    the posterior was ahead (0.501 against 0.477). Binary labels: the
    posterior is what keeps plain TPSL from falling (README, "Training that
    keeps learning").

    Examples
    --------
    >>> resolve_denoise("auto", "laplace"), resolve_denoise("auto", "gaussian")
    ('posterior', 'none')
    >>> [resolve_denoise("auto", "discrete", classes=10, epsilon=e) for e in (1, 4)]
    ['posterior', 'none']
    """
    if denoise != "auto":
        return denoise
    heavy = heavy_label_noise(mechanism, classes=classes, epsilon=epsilon)
    return "posterior" if heavy else "none"


def wide_budget(*, train_rows: int, epochs: int, heavy_noise: bool) -> float:
    """The factor on an FTRL wide part's rate (its L1/L2 are divided by it).

    FTRL sums the batch-mean gradients of every epoch, so ``E`` epochs weigh
    the data ``E`` times against a fixed ``1/wide-lr`` and ``wide-l2``: its
    penalty per sample-loss sum is about ``B (1/wide-lr + wide-l2) / E``
    (:mod:`~tpsl_flwr.experiments.wide_settings`), four times weaker at 8
    epochs than at 2. Under heavy label noise (:func:`heavy_label_noise`) on
    small data (at most :data:`SMALL_DATA_ROWS` rows) that weaker penalty fits
    the reused noise; a run of ``E > 2`` epochs then takes ``wide-lr`` times
    ``s = 2 / E`` and ``wide-l1``, ``wide-l2`` divided by ``s``, which keeps
    the 2-epoch penalty: 1 (no change) otherwise. Clean labels keep the
    weaker penalty: they gain from it (5000 generated Criteo rows, ``none``,
    8 epochs: 0.782 against logistic regression's 0.784).

    Examples
    --------
    >>> wide_budget(train_rows=4000, epochs=8, heavy_noise=True)
    0.25
    >>> wide_budget(train_rows=4000, epochs=8, heavy_noise=False)
    1.0
    >>> wide_budget(train_rows=4000, epochs=2, heavy_noise=True)
    1.0
    """
    rows = check_int(train_rows, "training rows")
    epochs = check_int(epochs, "epochs")
    if heavy_noise and rows <= SMALL_DATA_ROWS and epochs > BUDGET_EPOCHS:
        return BUDGET_EPOCHS / epochs
    return 1.0


def resolve_schedule(
    schedule: str,
    *,
    train_rows: int,
    epochs: int,
    beside_ftrl: bool = False,
    held_out: bool = False,
) -> str:
    """``lr-schedule`` with ``auto`` resolved from public facts.

    ``auto``: ``restarts`` (a cosine cycle every :data:`CYCLE_EPOCHS` epochs,
    :func:`~tpsl_flwr.parties.optim.lr_scale`) for a run of more than two
    epochs that holds ids out (``held_out``: it returns its best epoch) beside
    an FTRL wide part (``beside_ftrl``: the hashed codes of a Criteo or Avazu
    file) on more than :data:`SMALL_DATA_ROWS` training rows; ``cosine``
    otherwise (without a hold-out the run returns its last epoch, or the tail
    average, which one cosine serves). There the deep part memorizes the codes
    it has seen after two or three passes whatever the rate, the decay or the penalty
    (the "one-epoch phenomenon" of deep CTR models: Zhang et al., "Towards
    Understanding the Overfitting Phenomenon of Deep Click-Through Rate
    Prediction Models", CIKM 2022), so the hold-out restores an early epoch;
    under one cosine over all the epochs that epoch was trained at nearly the
    full rate, under ``restarts`` epoch 2 ends its cycle near 0 as a 2-epoch
    run does (100,000-row Criteo file, seed 1, 8 epochs, Laplace eps 1: 0.756
    -> 0.767, 2 epochs 0.770; ``docs/training.md``, "8 epochs at 100,000
    rows"). Smaller files keep ``cosine`` under the epoch budget
    (:func:`resolve_training`), where later epochs still help. Public facts
    only: the training rows, the epochs and the run's model.

    Examples
    --------
    >>> facts = dict(train_rows=80_000, beside_ftrl=True, held_out=True)
    >>> resolve_schedule("auto", epochs=8, **facts)
    'restarts'
    >>> resolve_schedule("auto", epochs=2, **facts)
    'cosine'
    >>> resolve_schedule("auto", epochs=8, **{**facts, "held_out": False})
    'cosine'
    >>> resolve_schedule("auto", epochs=8, **{**facts, "train_rows": 4_000})
    'cosine'
    >>> resolve_schedule("constant", epochs=8, **facts)
    'constant'
    """
    if schedule not in SCHEDULE_CHOICES:
        raise ConfigError(
            f"lr-schedule must be one of {', '.join(SCHEDULE_CHOICES)}, "
            f"got {schedule!r}"
        )
    if schedule != "auto":
        return schedule
    rows = check_int(train_rows, "training rows")
    epochs = check_int(epochs, "epochs")
    if held_out and beside_ftrl and rows > SMALL_DATA_ROWS and epochs > CYCLE_EPOCHS:
        return "restarts"
    return "cosine"


@dataclass(frozen=True)
class TrainingSettings:
    """A run's batch size and learning rate, ``auto`` (0) resolved.

    ``steps`` is the optimizer steps of the whole run the rule counted
    (``epochs * ceil(train_rows / batch_size)``); ``schedule`` the resolved
    ``lr-schedule`` (:func:`resolve_schedule`); ``budget_steps`` the steps'
    worth the epoch budget holds the run to (``2 * ceil(train_rows /
    batch_size)``, one epoch's under :data:`NOISY_BUDGET_EPOCHS`), 0 where no
    budget applies.

    ``still_learning``: the labels are heavily noisy (:func:`heavy_label_noise`)
    and the budget leaves fewer than :data:`MIN_STEPS_PER_EPOCH` steps an
    epoch. Such a model is still improving in its last epochs whatever their
    count, and the tail average
    (:func:`~tpsl_flwr.parties.weight_average.resolve_average`) would take in
    under-trained weights: 2,000-row files, seeds 0-4, 8 epochs, final - best
    epoch with the average and without, Criteo Laplace -.0073 / -.0002 and
    randomized response -.0076 / .0000, Avazu -.0029 / -.0006 and -.0021 /
    -.0013. Clean labels fit faster and peak mid-run, where the average is what
    holds the best (Avazu 2k ``none``, 16 epochs: -.0038 with it, -.0093
    without); ``docs/training.md``, "Every size, measured". Public facts only.
    """

    batch_size: int
    lr: float
    steps: int
    auto: tuple[str, ...]
    schedule: str = "cosine"
    budget_steps: int = 0
    still_learning: bool = False

    def to_dict(self) -> dict[str, object]:
        """JSON form (``auto`` names the run-config keys that were resolved)."""
        return {
            "batch_size": self.batch_size,
            "lr": self.lr,
            "steps": self.steps,
            "schedule": self.schedule,
            "budget_steps": self.budget_steps,
            "still_learning": self.still_learning,
            "auto": list(self.auto),
        }


def resolve_training(
    *,
    train_rows: int,
    epochs: int,
    batch_size: int = 0,
    lr: float = 0.0,
    beside_ftrl: bool = False,
    heavy_noise: bool = False,
    lr_schedule: str = "cosine",
    held_out: bool = False,
) -> TrainingSettings:
    """Batch size and learning rate for ``train_rows`` rows and ``epochs``.

    Explicit values (``> 0``) always win; ``0`` means auto:

    * ``batch_size``: the largest of 32, 64, 128, 256 that still gives each
      epoch :data:`MIN_STEPS_PER_EPOCH` (64) steps, else 32. A table of a
      few thousand rows then takes hundreds of steps, not a handful.
    * ``lr``: Adam's rate for the run's optimizer steps ``T = epochs *
      ceil(train_rows / batch_size)``: ``3e-3 * sqrt(4000 / T)``, clipped to
      ``[3e-3, 1e-2]``. Long runs keep the rate chosen on 200k rows; short
      ones (few rows or epochs, under a cosine schedule that ends at 0) take
      larger steps, up to ``1e-2`` from ~360 steps down. Beside an FTRL wide
      part (``beside_ftrl``), which learns the main effects with its own
      per-coordinate rate, the deep and top parts take
      :data:`BESIDE_FTRL_LR` (1e-3) whatever the steps: at a few thousand
      rows of hashed codes a faster deep part overfits within two epochs.
    * the epoch budget: on small data (at most :data:`SMALL_DATA_ROWS`
      training rows) where each row's signal is fixed, beside an FTRL wide
      part (``beside_ftrl``) or with labels noisy enough for the posterior
      (``heavy_noise``, :func:`heavy_label_noise`: each label is released
      once and reused every epoch), a run of ``E > 2`` epochs takes the
      rate of a 2-epoch run times ``2 / E`` (:data:`BUDGET_EPOCHS`): about
      two epochs' worth of steps, so it does not fit its few rows' codes or its
      noise ever harder (Yang et al., Section 6: one noisy label per sample
      for the whole run). The FTRL wide part keeps its own rate and goes on
      learning. Measured in ``docs/training.md`` ("Training longer never
      hurts"): 5000 generated Criteo rows, ``none``, 8 epochs, seeds 0-4,
      0.70 -> 0.77 (logistic regression 0.77). Under heavy noise with at
      least :data:`MIN_STEPS_PER_EPOCH` steps an epoch the budget is one
      epoch's worth (:data:`NOISY_BUDGET_EPOCHS`: times ``1 / E``): two took
      a 20,000-row file past its best mid-run. Fewer steps an epoch (a
      2,000-row file, breast-cancer) keep two: such a run is still learning
      at its end.

    ``lr_schedule`` is resolved by :func:`resolve_schedule` (``auto``; ``held_out``:
    the run holds ids out).

    Only public facts enter: the row count of the training split (the label
    party and every node derive it from the public data spec alike) and the
    run config, never a label.

    Examples
    --------
    >>> def show(s):
    ...     return s.batch_size, s.lr, s.steps
    >>> show(resolve_training(train_rows=1437, epochs=5))
    (32, 0.01, 225)
    >>> show(resolve_training(train_rows=160_000, epochs=8))
    (256, 0.003, 5000)
    >>> show(resolve_training(train_rows=160_000, epochs=8, batch_size=64, lr=0.02))
    (64, 0.02, 20000)
    >>> show(resolve_training(train_rows=3600, epochs=2, beside_ftrl=True))
    (32, 0.001, 226)
    >>> show(resolve_training(train_rows=3600, epochs=8, beside_ftrl=True))
    (32, 0.00025, 904)
    >>> show(resolve_training(train_rows=16_000, epochs=8, beside_ftrl=True,
    ...                       heavy_noise=True))
    (128, 0.000125, 1000)
    >>> show(resolve_training(train_rows=456, epochs=8, heavy_noise=True))
    (32, 0.0025, 120)
    >>> show(resolve_training(train_rows=160_000, epochs=8, heavy_noise=True))
    (256, 0.003, 5000)
    """
    rows = check_int(train_rows, "training rows")
    epochs = check_int(epochs, "epochs")
    batch_size = check_int(batch_size, "batch-size", minimum=0)
    if not (lr >= 0 and math.isfinite(lr)):
        raise ConfigError(f"lr must be >= 0 (0: auto) and finite, got {lr}")
    auto = tuple(
        key for key, value in (("batch-size", batch_size), ("lr", lr)) if not value
    ) + (("lr-schedule",) if lr_schedule == "auto" else ())
    if not batch_size:
        fits = [b for b in AUTO_BATCH_SIZES if rows // b >= MIN_STEPS_PER_EPOCH]
        batch_size = max(fits, default=AUTO_BATCH_SIZES[0])
    per_epoch = -(-rows // batch_size)
    steps = epochs * per_epoch
    budget_steps = 0
    if not lr:
        budget = (beside_ftrl or heavy_noise) and rows <= SMALL_DATA_ROWS
        worth = BUDGET_EPOCHS
        if heavy_noise and per_epoch >= MIN_STEPS_PER_EPOCH and epochs > BUDGET_EPOCHS:
            worth = NOISY_BUDGET_EPOCHS
        budget_steps = worth * per_epoch if budget else 0
        # The rate of a run of min(epochs, 2) epochs, times worth / epochs past 2
        counted = (min(epochs, BUDGET_EPOCHS) if budget else epochs) * per_epoch
        paid = min(epochs, worth) if budget else epochs
        if beside_ftrl:
            lr = BESIDE_FTRL_LR
        else:
            lr = min(MAX_LR, max(BASE_LR, BASE_LR * math.sqrt(BASE_LR_STEPS / counted)))
        lr = float(f"{lr * paid / epochs:.3g}")
    schedule = resolve_schedule(
        lr_schedule,
        train_rows=rows,
        epochs=epochs,
        beside_ftrl=beside_ftrl,
        held_out=held_out,
    )
    still_learning = (
        heavy_noise and bool(budget_steps) and per_epoch < MIN_STEPS_PER_EPOCH
    )
    return TrainingSettings(
        batch_size, float(lr), steps, auto, schedule, budget_steps, still_learning
    )
