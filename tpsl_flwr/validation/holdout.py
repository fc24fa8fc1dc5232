"""When a run holds out validation ids: ``validation-fraction = "auto"``.

The label party can hold out a fraction of the training ids, score every epoch
on their noisy labels and restore the best epoch
(:mod:`~tpsl_flwr.validation.best_epoch`). That pays where a run trains long
enough to fit its reused noise (Yang et al., Section 6: one noisy label per
sample, every epoch) and the held-out labels are numerous enough to tell
epochs apart; elsewhere it only costs the held-out rows. ``auto`` (the
default) therefore holds out :data:`AUTO_FRACTION` of the training ids only
where the run has at least :data:`AUTO_MIN_EPOCHS` epochs *and* that fraction
is at least :data:`AUTO_MIN_IDS` ids; otherwise none, and the last epoch is
kept. The Gaussian baseline, whose labels stay clean, never holds out. A
number decides outright (``0``: no validation).

Measured (in-process, seed 0, test AUC or accuracy of the kept epoch, noise
seeds 0 / 1 / 2 where three values; with validation -> without):

* ``synthetic-ctr`` Laplace eps 1, 2 epochs: 20k rows .6292 -> .6295 (means
  of three; plain GradPerturb .5897 -> .6007); 40k rows .7100 -> .7229 (plain
  .7108 -> .7097); 100k rows .7360 -> .7471 (plain .7160 -> .7264); 200k rows
  .7584 -> .7619 (plain .7398 -> .7387).
* the same, 8 epochs: 40k rows .7035 -> .6757 (plain .6880 -> .6186: it
  collapses without the choice); 200k rows (noise seed 0) .7618 -> last
  epoch .7527.
* the small tables (5 or 2 epochs, 135-400 held-out ids, noise seed 0):
  digits ``none`` .9534 -> .9699, digits ``discrete`` eps 4 .9452 -> .9562,
  breast-cancer Laplace eps 1 .9877 -> .9908, 5000 Criteo rows ``none`` .7687
  -> .7706 and Laplace eps 1 .6787 -> .7067.

The rule reads the row count of the training split and the epochs, public
facts (no label). It is the label party's alone (the nodes train whatever ids
it sends); the resolved fraction is part of the noise binding and reported
in ``results.json`` (``training.validation_fraction``).
"""

from __future__ import annotations

import math

from tpsl_flwr.errors import ConfigError

__all__ = [
    "AUTO_FRACTION",
    "AUTO_MIN_EPOCHS",
    "AUTO_MIN_IDS",
    "MAX_FRACTION",
    "resolve_validation",
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
    value: float | str, *, train_rows: int, epochs: int, mechanism: str
) -> float:
    """The fraction of training ids held out, ``auto`` resolved.

    Examples
    --------
    >>> resolve_validation("auto", train_rows=160_000, epochs=8, mechanism="laplace")
    0.1
    >>> resolve_validation("auto", train_rows=160_000, epochs=2, mechanism="laplace")
    0.0
    >>> resolve_validation("auto", train_rows=4_000, epochs=8, mechanism="laplace")
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
        mechanism == "gaussian"
        or epochs < AUTO_MIN_EPOCHS
        or AUTO_FRACTION * train_rows < AUTO_MIN_IDS
    ):
        return 0.0
    return AUTO_FRACTION
