"""The curious non-label party: record what a node receives, attack it offline.

:func:`record_transcript` is a Flower ClientApp *mod* (``(msg, context,
call_next) -> Message``, :data:`flwr.clientapp.typing.Mod`): put it in
``ClientApp(mods=[record_transcript("transcripts")])`` and every message
carrying gradients (:data:`tpsl_flwr.wire.protocol.GRADS`) that the node receives
is saved, before the node handles it, as
``<directory>/party-<partition-id>/msg-<counter>.npz`` with the arrays
``epoch`` (from :data:`tpsl_flwr.wire.protocol.CONFIG`; -1 if absent) and, for each
batch ``j``, ``ids-j`` and ``grad-j`` as received (split from the message's
stacked arrays, :mod:`~tpsl_flwr.wire.batch_pack`; float16 decoded to
float32). The mod changes neither the message nor the reply. Counters
increase in the order the node received the messages; a file is created
exclusively, so nothing is ever overwritten, and recording into a folder that
already holds a transcript continues its numbering.

:func:`load_transcript` reads the files back in message order, and
:func:`score_recorded_transcript` runs the black-box gradient attacks (norm, cosine,
spectral) of :func:`tpsl_flwr.attacks.attack_report` on each epoch, as an
offline attacker would: it has no white-box parameters, so no SDA.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp.typing import ClientAppCallable, Mod
from numpy.typing import ArrayLike

from tpsl_flwr.attacks import BatchRecord, attack_report
from tpsl_flwr.errors import ConfigError, ProtocolError
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.batch_pack import gradient_batches

_FILE = re.compile(r"^msg-(\d+)\.npz$")


@dataclass(frozen=True)
class TranscriptBatch:
    """One batch of gradients a node received.

    Attributes
    ----------
    epoch
        The epoch the message's config named (-1 if it named none).
    ids
        ``(n,)`` int64 sample ids.
    grad
        ``(n, d)`` the gradient slice as received (averaged over the batch).
    message
        The counter of the message that carried it.
    """

    epoch: int
    ids: np.ndarray
    grad: np.ndarray
    message: int


def party_folder(directory: str | os.PathLike[str], partition: int) -> Path:
    """``<directory>/party-<partition>``: where one node's transcript lives."""
    return Path(directory) / f"party-{partition}"


def _partition(context: Context) -> int:
    if "partition-id" not in context.node_config:
        raise ProtocolError(
            "record_transcript needs the node config's partition-id; start the "
            'SuperNode with --node-config "partition-id=I num-partitions=N"'
        )
    return P.as_int(context.node_config["partition-id"], "partition-id")


def _gradient_arrays(msg: Message) -> dict[str, np.ndarray] | None:
    if not msg.has_content():
        return None
    arrays: dict[str, np.ndarray] = {}
    for j, (ids, grad) in enumerate(gradient_batches(msg.content)):
        arrays[f"ids-{j}"], arrays[f"grad-{j}"] = ids, grad
    if not arrays:
        return None
    config = msg.content.config_records.get(P.CONFIG, ConfigRecord())
    epoch = P.as_int(config[P.EPOCH], P.EPOCH) if P.EPOCH in config else -1
    arrays["epoch"] = np.array(epoch, dtype=np.int64)
    return arrays


def _next_counter(folder: Path) -> int:
    found = [int(m.group(1)) for m in map(_FILE.match, os.listdir(folder)) if m]
    return max(found, default=-1) + 1


def record_transcript(directory: str | os.PathLike[str]) -> Mod:
    """A ClientApp mod that saves every gradient message the node receives.

    Parameters
    ----------
    directory
        Root folder; each node writes under ``party-<partition-id>/``.

    Returns
    -------
    Mod
        ``mod(msg, context, call_next)`` for ``ClientApp(mods=[...])``.

    Examples
    --------
    >>> from flwr.clientapp import ClientApp
    >>> app = ClientApp(mods=[record_transcript("transcripts")])
    """
    root = Path(directory)
    next_counter: dict[Path, int] = {}

    def save(folder: Path, arrays: dict[str, np.ndarray]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        counter = next_counter.get(folder)
        if counter is None:
            counter = _next_counter(folder)
        while True:
            try:
                handle = (folder / f"msg-{counter:06d}.npz").open("xb")
            except FileExistsError:  # another process wrote it: go past it
                counter += 1
                continue
            with handle:
                np.savez(handle, **arrays)  # type: ignore[arg-type]
            break
        next_counter[folder] = counter + 1

    def mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        arrays = _gradient_arrays(msg)
        if arrays is not None:
            save(party_folder(root, _partition(context)), arrays)
        return call_next(msg, context)

    return mod


def load_transcript(
    directory: str | os.PathLike[str], partition: int
) -> list[TranscriptBatch]:
    """The batches one node received, in the order it received them.

    Parameters
    ----------
    directory
        The folder given to :func:`record_transcript`.
    partition
        The node's partition id.

    Returns
    -------
    list of TranscriptBatch
        Message by message, and batch ``j = 0, 1, ...`` within a message.

    Raises
    ------
    ConfigError
        If there is no transcript of that partition.
    """
    folder = party_folder(directory, partition)
    if not folder.is_dir():
        raise ConfigError(f"no transcript of partition {partition} at {folder}")
    files = sorted(
        (int(m.group(1)), folder / m.group(0))
        for m in map(_FILE.match, os.listdir(folder))
        if m
    )
    out: list[TranscriptBatch] = []
    for counter, path in files:
        with np.load(path, allow_pickle=False) as data:
            epoch = int(data["epoch"])
            j = 0
            while f"ids-{j}" in data.files:
                out.append(
                    TranscriptBatch(epoch, data[f"ids-{j}"], data[f"grad-{j}"], counter)
                )
                j += 1
    return out


def score_recorded_transcript(
    directory: str | os.PathLike[str],
    labels: ArrayLike,
    partition: int = 0,
    *,
    spectral: str = "size",
) -> dict[int, dict[str, Any]]:
    """Black-box attack report (norm, cosine, spectral) of each recorded epoch.

    Parameters
    ----------
    directory
        The folder given to :func:`record_transcript`.
    labels
        The true training labels indexed by sample id (to score the attacks).
    partition
        The attacking node's partition id.
    spectral
        Orientation of the spectral attack (see
        :func:`~tpsl_flwr.attacks.attack_report`).

    Returns
    -------
    dict
        ``epoch -> attack_report(...)`` of that epoch's batches (each batch's
        size is its number of ids), in epoch order. ``sda`` is ``None``: an
        offline attacker has no white-box parameters.

    Raises
    ------
    ConfigError
        If there is no transcript, or a recorded id has no label.
    """
    y = np.asarray(labels)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ConfigError(
            f"labels must be a 1-D integer array, got {y.dtype} {y.shape}"
        )
    classes = max(2, int(y.max(initial=0)) + 1)
    by_epoch: dict[int, list[BatchRecord]] = {}
    for batch in load_transcript(directory, partition):
        if batch.ids.size and (batch.ids.min() < 0 or batch.ids.max() >= y.size):
            raise ConfigError(
                f"message {batch.message} holds sample ids outside [0, {y.size})"
            )
        record = BatchRecord(batch.ids, batch.grad, y[batch.ids])
        by_epoch.setdefault(batch.epoch, []).append(record)
    return {
        epoch: attack_report(batches, classes=classes, spectral=spectral)
        for epoch, batches in sorted(by_epoch.items())
    }


TRANSCRIPT_DIR_KEY = "transcript-dir"
"""Run-config key: where :func:`record_if_configured` records (empty: nowhere)."""


def record_if_configured(
    msg: Message, context: Context, call_next: ClientAppCallable
) -> Message:
    """Mod: record like :func:`record_transcript` into the run's ``transcript-dir``.

    Does nothing when the run config leaves ``transcript-dir`` empty, so the
    project's ClientApp can carry it always and a run switches it on by config.
    """
    directory = str(context.run_config.get(TRANSCRIPT_DIR_KEY, "") or "")
    if not directory:
        return call_next(msg, context)
    recorder = _RECORDERS.get(directory)
    if recorder is None:
        recorder = _RECORDERS[directory] = record_transcript(directory)
    return recorder(msg, context, call_next)


_RECORDERS: dict[str, Mod] = {}
