"""The tail average of a party's weights over the later epochs of a run.

Tail (Polyak-Ruppert) averaging returns the mean of the weights a run passed
through over its last epochs instead of its last weights (Polyak and Juditsky,
"Acceleration of Stochastic Approximation by Averaging", SIAM J. Control Optim.
30(4), 1992; the epoch-snapshot form is stochastic weight averaging, Izmailov
et al., "Averaging Weights Leads to Wider Optima and Better Generalization",
UAI 2018). In split learning each party averages only its own weights: the
label party its top model, each node its bottom model, so nothing new crosses
the boundary and nothing reads a label; the label party says when (the
``average-in`` and ``restore-average`` keys of
:mod:`~tpsl_flwr.wire.protocol`), from public facts alone
(:func:`resolve_average`: the epochs and whether the run holds ids out).

Plain torch, no Flower.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from tpsl_flwr._util.checks import check_int
from tpsl_flwr.errors import ConfigError, ResumeRefused

__all__ = [
    "AVERAGE_MODES",
    "average_mode",
    "average_start",
    "check_resumed_average",
    "fold_average",
    "resolve_average",
    "stopped_average",
]

AVERAGE_MODES = ("auto", "on", "off")
"""Values of ``average`` (``true``/``false`` are read as ``on``/``off``)."""
AUTO_MIN_EPOCHS = 5
"""``average = auto``: the fewest epochs a run averages over. Runs of 3 epochs are
still learning in their last one and gained nothing (the three examples, 10 keys
each: test metric -0.0008, -0.0001, -0.0072 on the mean); from 5 on it holds
longer runs at their best (``docs/training.md``, "The tail average")."""


def average_mode(value: object) -> str:
    """``average`` in one spelling: ``auto``, ``on`` or ``off``.

    Examples
    --------
    >>> average_mode(True), average_mode("false"), average_mode("auto")
    ('on', 'off', 'auto')
    """
    spelled = {True: "on", False: "off", "true": "on", "false": "off"}
    mode = spelled.get(value, value) if isinstance(value, bool | str) else value
    if mode not in AVERAGE_MODES:
        raise ConfigError(
            f"average must be one of {', '.join(AVERAGE_MODES)} (or true/false), "
            f"got {value!r}"
        )
    return str(mode)


def average_start(epochs: int) -> int:
    """The first averaged epoch (0-based): every epoch after the first.

    The first epoch is the burn-in (Polyak and Juditsky average the iterates
    after one): it starts from the random initialization, far from where the
    run ends. Averaging only the last half of the epochs was measured too, and
    under the cosine schedule, whose late epochs barely move, it returned
    nearly the last epoch (``docs/training.md``, "Training longer never
    hurts"). A one-epoch run averages its one epoch: the last.

    Examples
    --------
    >>> [average_start(e) for e in (1, 2, 3, 8, 16)]
    [0, 1, 1, 1, 1]
    """
    return min(1, check_int(epochs, "epochs") - 1)


def resolve_average(
    average: object, *, epochs: int, held_out: bool, still_learning: bool = False
) -> int | None:
    """The first epoch (0-based) whose weights the run averages, or ``None``.

    ``on`` averages every epoch after the first (:func:`average_start`);
    ``auto`` does so for runs of at least
    :data:`AUTO_MIN_EPOCHS` epochs that hold no ids out (a run with a
    hold-out restores its best epoch instead) and are not ``still_learning``
    (heavily noisy labels, and an epoch budget of so few steps that the model
    still improves in its last epochs:
    :attr:`~tpsl_flwr.parties.training_rules.TrainingSettings.still_learning`);
    ``off`` never. Public facts
    only: the label party resolves it and tells every node when to fold its
    weights in, so all parties average the same epochs.

    Raises
    ------
    ConfigError
        For an unknown value, or ``on`` beside a hold-out (its best-epoch
        restore and the average would each choose the returned model).

    Examples
    --------
    >>> resolve_average("auto", epochs=8, held_out=False)
    1
    >>> resolve_average("auto", epochs=2, held_out=False) is None
    True
    >>> resolve_average("auto", epochs=8, held_out=True) is None
    True
    >>> resolve_average("auto", epochs=8, held_out=False, still_learning=True) is None
    True
    >>> resolve_average("on", epochs=8, held_out=False, still_learning=True)
    1
    """
    mode = average_mode(average)
    epochs = check_int(epochs, "epochs")
    if mode == "on" and held_out:
        raise ConfigError(
            "average = on cannot go with a validation hold-out (the run restores "
            "its best held-out epoch): set validation-fraction = 0, or average = "
            "auto or off"
        )
    if mode == "off" or held_out:
        return None
    if mode == "auto" and (epochs < AUTO_MIN_EPOCHS or still_learning):
        return None
    return average_start(epochs)


def stopped_average(party_state: Mapping[str, object]) -> int | None:
    """The first epoch (0-based) a checkpoint's run averaged from, or ``None``.

    The label party's checkpoint records its resolved ``average``
    (:func:`resolve_average`) as ``average_from``. One that does not was
    written before the tail average (it averaged nothing), unless it holds a
    running average, whose first epoch it cannot tell: that one is refused.

    Raises
    ------
    ConfigError
        For a running average without its first epoch.

    Examples
    --------
    >>> stopped_average({"average_from": 1}), stopped_average({})
    (1, None)
    """
    if "average_from" in party_state:
        start = party_state["average_from"]
        return None if start is None else check_int(start, "average_from", minimum=0)
    if party_state.get("average") is not None:
        raise ConfigError(
            "cannot resume: the checkpoint holds a running average of weights but "
            "not the epoch it began at (written by an older tpsl-flwr); start a "
            "fresh run"
        )
    return None


def check_resumed_average(
    stopped: int | None, resumed: int | None, *, average: str, epochs: int
) -> None:
    """Refuse a resume that resolves ``average`` otherwise than the stopped run.

    ``stopped``: the checkpoint's first averaged epoch (:func:`stopped_average`);
    ``resumed``: the resuming run's (:func:`resolve_average` of its
    ``average`` over its ``epochs``). Were they to differ, the resumed run
    would return the average of only the epochs after the stop (``on`` after
    ``off``), or the stopped run's partial average (``off`` after ``on``), as
    if it were the run's.

    Raises
    ------
    ResumeRefused
        Naming both, in one line.

    Examples
    --------
    >>> check_resumed_average(1, None, average="off", epochs=8)
    Traceback (most recent call last):
    ...
    tpsl_flwr.errors.ResumeRefused: cannot resume: the stopped run averages the weights of every epoch from epoch 2 on but this one (average = off, 8 epochs) averages no weights; resume with the stopped run's average
    """  # noqa: E501
    if stopped != resumed:
        raise ResumeRefused(
            f"cannot resume: the stopped run {_averages(stopped)} but this one "
            f"(average = {average}, {epochs} epochs) {_averages(resumed)}; resume "
            "with the stopped run's average"
        )


def _averages(start: int | None) -> str:
    if start is None:
        return "averages no weights"
    return f"averages the weights of every epoch from epoch {start + 1} on"


def fold_average(
    average: Mapping[str, Tensor] | None, weights: Mapping[str, Tensor], count: int
) -> dict[str, Tensor]:
    """The running mean of ``count`` snapshots with ``weights`` folded in.

    ``average`` is the mean of the ``count`` snapshots so far (``None`` when
    ``count`` is 0); the result is the mean of ``count + 1``, computed as
    ``a + (w - a) / (count + 1)`` in float64 and stored in each tensor's own
    dtype. Tensors that are not floating point (counters, index buffers) take
    the latest snapshot's value.

    Raises
    ------
    ConfigError
        If ``count`` and ``average`` disagree, or the snapshot's keys or
        shapes differ from the average's.

    Examples
    --------
    >>> w = [{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, 6.0])}]
    >>> fold_average(fold_average(None, w[0], 0), w[1], 1)["w"]
    tensor([2., 4.])
    """
    count = check_int(count, "averaged snapshots", minimum=0)
    if (average is None) != (count == 0):
        raise ConfigError(
            f"a running average of {count} snapshots must "
            + ("have" if count else "not have")
            + " an average so far"
        )
    if average is not None and set(average) != set(weights):
        raise ConfigError(
            "the weights to average do not match the average so far: "
            f"{sorted(set(average) ^ set(weights))[:5]}"
        )
    out: dict[str, Tensor] = {}
    for name, value in weights.items():
        value = value.detach()
        if average is None or not torch.is_floating_point(value):
            out[name] = value.clone()
            continue
        kept = average[name]
        if kept.shape != value.shape:
            raise ConfigError(
                f"{name}: weights of shape {tuple(value.shape)} do not match the "
                f"average's {tuple(kept.shape)}"
            )
        mean = kept.double() + (value.double() - kept.double()) / (count + 1)
        out[name] = mean.to(value.dtype)
    return out
