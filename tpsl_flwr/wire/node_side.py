"""The non-label node's half of the wire: a ClientApp over any ``NonLabelParty``.

Each SuperNode is one non-label party. Only ``context.state`` survives between
messages of a node, so the bottom model and its optimizer live there
(serialized with :mod:`tpsl_flwr.wire.state_codec`), unless the engine says it
reuses the ClientApp object (``protocol.APP_KEEPS_STATE``, the in-process
engine): then only the state's version is stored and a mismatch is an error.
The label party's half of the same messages is :mod:`tpsl_flwr.wire.label_side`.

Bring your own bottom model and feature store: write a factory
``(context) -> NonLabelParty`` and build the app with
``make_client_app(factory)``; the handlers, protocol and state handling stay.

A node writes nothing to disk unless it is given a folder: with
``checkpoint_dir`` it saves ``party-<partition>.pt`` (keeping the epoch before
as ``party-<partition>.previous.pt``) there when the label party
asks (only a label party with a store does); without one, a request to
checkpoint or to resume is refused.
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import Mod

from tpsl_flwr.errors import ConfigError, ProtocolError
from tpsl_flwr.parties import NonLabelParty
from tpsl_flwr.parties.weight_average import fold_average
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.arrays import to_array
from tpsl_flwr.wire.batch_pack import gradient_batches, id_batches
from tpsl_flwr.wire.node_edge import check_node_config, node_failure
from tpsl_flwr.wire.state_codec import UnsupportedStateError, decode_state, encode_state
from tpsl_flwr.wire.wire_dtype import FLOAT32, check_wire_dtype

PartyFactory = Callable[[Context], NonLabelParty]
Handler = Callable[[Message, Context], Message]
CheckpointDir = Callable[[Context], Path | None] | str | Path | None
"""Where a node keeps its checkpoint: a folder, a function of the context, or None."""
STATE_KEY = "tpsl.party-state"
BEST_KEY = "tpsl.best-state"
"""The state kept as the best epoch's (its ``version`` is the epoch)."""
AVERAGE_KEY = "tpsl.weight-average"
"""The running average of the bottom model's weights (``version``: epochs in it)."""
KEEP_RUNS = 4
"""Runs a handler object keeps the parties of (every node of each), the latest used."""
_KEEP_EVICTED = 64
"""Runs remembered as dropped from the cache, so their next message says so."""


def partition_of(context: Context) -> tuple[int, int]:
    """``(partition-id, num-partitions)`` from the node config."""
    config = context.node_config
    if P.PARTITION_ID not in config or P.NUM_PARTITIONS not in config:
        raise ProtocolError(
            "node config lacks partition-id/num-partitions; start the SuperNode with "
            '--node-config "partition-id=I num-partitions=N"'
        )
    return int(config[P.PARTITION_ID]), int(config[P.NUM_PARTITIONS])


def checkpoint_file(checkpoint_dir: CheckpointDir, context: Context) -> Path | None:
    """The node's checkpoint file in ``checkpoint_dir``; None without a folder.

    The folder is used exactly as stated (a relative one is relative to the
    node process's working directory; nothing is resolved or defaulted).

    Examples
    --------
    >>> from flwr.app import Context, RecordDict
    >>> context = Context(1, 7, {"partition-id": 1, "num-partitions": 2},
    ...                   RecordDict(), {})
    >>> checkpoint_file("/srv/node", context).as_posix()
    '/srv/node/party-1.pt'
    >>> checkpoint_file(None, context) is None
    True
    """
    folder = checkpoint_dir(context) if callable(checkpoint_dir) else checkpoint_dir
    if folder is None:
        return None
    partition, _ = partition_of(context)
    return Path(folder) / f"party-{partition}.pt"


def _state_record(state: dict[str, Any], version: int) -> ConfigRecord:
    """``state`` as a ConfigRecord: the fast exact codec, else ``torch.save``."""
    try:
        header, blob = encode_state(state)
    except UnsupportedStateError:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        header, blob = "", buffer.getvalue()
    return ConfigRecord({"header": header, "blob": blob, "version": version})


def _state_from_record(record: ConfigRecord) -> Any:
    header, blob = record["header"], record["blob"]
    if not isinstance(header, str) or not isinstance(blob, bytes):
        raise ProtocolError("this node's saved state in context.state is malformed")
    if header:
        return decode_state(header, blob)
    return torch.load(io.BytesIO(blob), weights_only=True)


def _lr_scale(value: object) -> float:
    """The learning-rate scale of a message, or a ProtocolError naming it."""
    try:
        scale = float(str(value))
    except ValueError:
        raise ProtocolError(f"lr-scale must be a number, got {value!r}") from None
    if not 0.0 <= scale <= 1.0:
        raise ProtocolError(f"lr-scale must be in [0, 1], got {value!r}")
    return scale


def _batch_splits(config: ConfigRecord, batches: int) -> list[str]:
    """The split of each batch: ``splits`` (one per batch) or ``split`` for all."""
    if P.SPLITS not in config:
        return [str(config.get(P.SPLIT, "train"))] * batches
    splits = str(config[P.SPLITS]).split(",")
    if len(splits) != batches:
        raise ProtocolError(
            f"splits names {len(splits)} splits for {batches} batches of ids"
        )
    return splits


def _best_state(context: Context, epoch: object) -> Any:
    """The state kept as epoch ``epoch``'s best, or a ProtocolError."""
    wanted = P.as_int(epoch, "restore-best")
    record = context.state.config_records.get(BEST_KEY)
    kept = None if record is None else P.as_int(record["version"], "best epoch")
    if record is None or kept != wanted:
        raise ProtocolError(
            f"the label party asked to restore epoch {wanted}'s state, but this "
            f"node kept {'none' if kept is None else f'epoch {kept}'}"
        )
    return _state_from_record(record)


def _average_in(party: NonLabelParty, context: Context, epoch: int) -> int:
    """Fold the bottom model's weights in as epoch ``epoch``'s; the new count.

    The epochs a run averages follow one another (every epoch from the first
    averaged one on): an epoch folded twice, or after a gap, is refused.
    """
    record = context.state.config_records.get(AVERAGE_KEY)
    epochs = P.averaged_epochs(record)
    if epochs and epoch != epochs[-1] + 1:
        raise ProtocolError(
            f"the label party asked to fold epoch {epoch} into the average, but "
            f"this node's average holds epochs {epochs}: the next is {epochs[-1] + 1}"
        )
    average = None if record is None else _state_from_record(record)
    folded = fold_average(average, party.bottom.state_dict(), len(epochs))
    epochs.append(epoch)
    record = _state_record(folded, len(epochs))
    record["epochs"] = P.epochs_text(epochs)
    context.state[AVERAGE_KEY] = record
    return len(epochs)


def _average_state(context: Context, epochs: object, last: object) -> Any:
    """The running average of ``epochs`` epochs up to ``last``, or a ProtocolError.

    The label party averages every epoch from its first averaged one to its
    last; the node restores its average only if it holds exactly those epochs
    (the same count over other epochs is refused too).
    """
    count = P.as_int(epochs, "restore-average")
    last = P.as_int(last, "epoch")
    wanted = list(range(last - count + 1, last + 1))
    record = context.state.config_records.get(AVERAGE_KEY)
    kept = P.averaged_epochs(record)
    if record is None or kept != wanted:
        raise ProtocolError(
            f"the label party asked to restore the average of {count} epochs' "
            f"weights (epochs {wanted}), but this node averaged {len(kept)} "
            f"(epochs {kept})"
        )
    return _state_from_record(record)


def _previous(path: Path) -> Path:
    """Where the checkpoint before ``path``'s current one is kept."""
    return path.with_suffix(".previous.pt")


def _checkpoint_of_epoch(path: Path, epoch: int) -> dict[str, Any]:
    """The node's checkpoint of ``epoch``: the last one, or the one before it.

    A node saves its checkpoint of an epoch just before the label party saves
    its own; if the label party stopped in between, it resumes after the
    previous epoch, which the node still keeps.
    """
    found = []
    for candidate in (path, _previous(path)):
        if candidate.exists():
            saved: dict[str, Any] = torch.load(candidate, weights_only=True)
            if int(saved["epoch"]) == epoch:
                return saved
            found.append(f"{candidate} is from epoch {saved['epoch']}")
    if not found:
        raise ProtocolError(f"cannot resume: no checkpoint at {path}")
    raise ProtocolError(f"cannot resume after epoch {epoch}: {'; '.join(found)}")


class NonLabelHandlers:
    """The message handlers of a non-label party, over a party factory.

    ``checkpoint_dir`` as in :func:`make_client_app`.
    """

    def __init__(
        self, factory: PartyFactory, checkpoint_dir: CheckpointDir = None
    ) -> None:
        self.factory = factory
        self.checkpoint_dir = checkpoint_dir
        # A cache, not state: run -> node -> (state version, party). Flower may
        # deliver a node's next message to another process, so context.state
        # stays the source of truth and a stale or missing entry is rebuilt.
        # The parties of the KEEP_RUNS runs used last are kept, all nodes of
        # each (the in-process engine calls one object for every node; a
        # long-lived process, such as the warm executor, serves run after run).
        self._cache: OrderedDict[int, dict[int, tuple[int, NonLabelParty]]] = (
            OrderedDict()
        )
        self._evicted: OrderedDict[int, None] = OrderedDict()
        self._lock = threading.Lock()  # the in-process engine's node threads

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (Flower's Ray backend ships the ClientApp): no lock, no cache."""
        state = dict(self.__dict__)
        del state["_lock"]
        state["_cache"], state["_evicted"] = OrderedDict(), OrderedDict()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _party(self, context: Context) -> NonLabelParty:
        record = context.state.config_records.get(STATE_KEY)
        version = -1 if record is None else P.as_int(record["version"], "state version")
        with self._lock:
            cached = self._cache.get(context.run_id, {}).get(context.node_id)
            if cached is not None and cached[0] == version and version >= 0:
                self._cache.move_to_end(context.run_id)
                return cached[1]  # never at -1: a fresh context is a new run's node
        if record is not None and "blob" not in record:
            raise ProtocolError(self._kept_elsewhere(context, version, cached))
        party = self.factory(context)
        if record is not None:
            party.load_state_dict(_state_from_record(record))
        self._keep(context, version, party)
        return party

    def _kept_elsewhere(
        self,
        context: Context,
        version: int,
        cached: tuple[int, NonLabelParty] | None,
    ) -> str:
        """Why the party a version-only state names is not here, in one line."""
        kept = (
            f"this node's state (version {version}) was kept in the process that "
            "served the run's earlier messages (the engine's "
            f"{P.APP_KEEPS_STATE!r})"
        )
        if cached is None and context.run_id in self._evicted:
            return (
                f"{kept}, and this process dropped run {context.run_id}'s party "
                f"after serving {KEEP_RUNS} newer runs (it keeps the parties of "
                f"the {KEEP_RUNS} runs used last); resume the run (resume = "
                "true), whose hello loads the last checkpoint"
            )
        return (
            f"{kept}, and this process has "
            + ("none" if cached is None else f"version {cached[0]}")
            + ": it was restarted since; resume the run (resume = true)"
        )

    def _keep(self, context: Context, version: int, party: NonLabelParty) -> None:
        run = context.run_id
        with self._lock:
            self._cache.setdefault(run, {})[context.node_id] = (version, party)
            self._cache.move_to_end(run)
            self._evicted.pop(run, None)
            while len(self._cache) > KEEP_RUNS:
                dropped, _ = self._cache.popitem(last=False)
                self._evicted[dropped] = None
                while len(self._evicted) > _KEEP_EVICTED:
                    self._evicted.popitem(last=False)

    def _save(self, party: NonLabelParty, context: Context) -> None:
        record = context.state.config_records.get(STATE_KEY)
        version = (
            0 if record is None else P.as_int(record["version"], "state version") + 1
        )
        if P.APP_KEEPS_STATE in context.state.config_records:
            # The engine calls this object for every message of the node (the
            # in-process engine): encoding the state (tens of MB for a Criteo
            # bottom model and its Adam moments) after every step would only
            # copy it. Deployment and Ray never write the record.
            context.state[STATE_KEY] = ConfigRecord({"version": version})
        else:
            context.state[STATE_KEY] = _state_record(party.state_dict(), version)
        self._keep(context, version, party)

    def _checkpoint_file(self, context: Context, asked: str) -> Path:
        """The checkpoint file the label party ``asked`` for, or a ProtocolError."""
        path = checkpoint_file(self.checkpoint_dir, context)
        if path is None:
            raise ProtocolError(
                f"the label party asked this node to {asked}, but the ClientApp "
                "was built without checkpoint_dir (or it gave none for this run); "
                "build it with make_client_app(factory, checkpoint_dir=FOLDER)"
            )
        return path

    def hello(self, msg: Message, context: Context) -> Message:
        """Describe this node; on resume, restore its checkpoint first."""
        config = msg.content.config_records.get(P.CONFIG, ConfigRecord())
        party = self._party(context)
        if P.RESUME_EPOCH in config:
            path = self._checkpoint_file(context, "resume from its checkpoint")
            after = P.as_int(config[P.RESUME_EPOCH], "resume-epoch") - 1
            saved = _checkpoint_of_epoch(path, after)
            party.load_state_dict(saved["party"])
            if saved.get("best") is not None:
                context.state[BEST_KEY] = _state_record(
                    saved["best"], int(saved["best_epoch"])
                )
            if saved.get("average") is not None:
                record = _state_record(saved["average"], int(saved["average_count"]))
                record["epochs"] = str(saved.get("average_epochs"))
                P.averaged_epochs(record)  # a checkpoint without them is refused
                context.state[AVERAGE_KEY] = record
        if P.CHECKPOINTS in config:  # refused now, not after the first epoch
            self._checkpoint_file(context, "save a checkpoint after every epoch")
        self._save(party, context)  # version 0: later messages find this party
        partition, parties = partition_of(context)
        width = int(party.embed(np.array([0]), "train").shape[1])
        info = ConfigRecord(
            {
                P.PARTITION_ID: partition,
                P.NUM_PARTITIONS: parties,
                P.EMBEDDING_DIM: width,
                P.NUM_TRAIN: party.num_samples("train"),
                P.NUM_TEST: party.num_samples("test")
                if "test" in party.features
                else 0,
            }
        )
        return Message(RecordDict({P.NODE: info}), reply_to=msg)

    def step(self, msg: Message, context: Context) -> Message:
        """Apply the received perturbed gradients, then embed the requested ids."""
        party = self._party(context)
        content = msg.content
        config = content.config_records.get(P.CONFIG, ConfigRecord())
        # Parse and check the whole message before changing anything.
        pending = gradient_batches(content)
        batches = id_batches(content)
        splits = _batch_splits(config, len(batches))
        fold = None  # the epoch to fold into the average, after the gradients
        if P.AVERAGE_IN in config:
            fold = P.as_int(config[P.AVERAGE_IN], "average-in")
        echo = ConfigRecord()  # what the label party must see done
        if P.KEEP_BEST in config:
            best = P.as_int(config[P.KEEP_BEST], "keep-best")
            context.state[BEST_KEY] = _state_record(party.state_dict(), best)
        if P.RESTORE_BEST in config:
            party.load_state_dict(_best_state(context, config[P.RESTORE_BEST]))
        if P.LR_SCALE in config:
            party.set_lr_scale(_lr_scale(config[P.LR_SCALE]))
        for ids, grad in pending:
            party.apply_gradient(ids, grad)
        # The average takes the epoch's weights after its last gradient.
        if fold is not None:
            echo[P.AVERAGE_IN] = fold
            echo[P.AVERAGED] = _average_in(party, context, fold)
        if P.RESTORE_AVERAGE in config:
            restore = config[P.RESTORE_AVERAGE]
            party.load_weights(_average_state(context, restore, config.get(P.EPOCH)))
            echo[P.RESTORE_AVERAGE] = P.as_int(restore, "restore-average")
        training = msg.metadata.message_type == P.MSG_TRAIN
        wire_dtype = check_wire_dtype(context.run_config.get(P.WIRE_DTYPE, FLOAT32))
        embeddings = ArrayRecord()
        if batches:  # stacked in the order asked for (batch_pack)
            stacked = torch.cat(
                [
                    party.embed(ids, split, keep_graph=training and split == "train")
                    for ids, split in zip(batches, splits, strict=True)
                ]
            )
            embeddings[P.EMBEDDINGS_KEY] = to_array(
                stacked.numpy().astype(np.float32, copy=False), wire_dtype
            )
        self._save(party, context)
        if P.CHECKPOINT_EPOCH in config:
            epoch = P.as_int(config[P.CHECKPOINT_EPOCH], "checkpoint-epoch")
            path = self._checkpoint_file(context, f"save a checkpoint of epoch {epoch}")
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            saved: dict[str, Any] = {"epoch": epoch, "party": party.state_dict()}
            kept = context.state.config_records.get(BEST_KEY)
            if kept is not None:
                saved["best"] = _state_from_record(kept)
                saved["best_epoch"] = P.as_int(kept["version"], "best epoch")
            average = context.state.config_records.get(AVERAGE_KEY)
            if average is not None:
                saved["average"] = _state_from_record(average)
                saved["average_count"] = P.as_int(average["version"], "averaged")
                saved["average_epochs"] = average["epochs"]
            torch.save(saved, tmp)
            if path.exists():  # the label party may not have saved epoch `epoch`
                path.replace(_previous(path))
            tmp.replace(path)
        reply = RecordDict({P.EMBEDDINGS: embeddings})
        if echo:
            reply[P.ECHO] = echo
        return Message(reply, reply_to=msg)


def make_client_app(
    factory: PartyFactory,
    mods: list[Mod] | None = None,
    *,
    checkpoint_dir: CheckpointDir = None,
) -> ClientApp:
    """A ClientApp running the non-label protocol over ``factory``'s parties.

    Parameters
    ----------
    factory
        ``(context) -> NonLabelParty``: this node's features and bottom model.
    mods
        Flower ClientApp mods, e.g.
        :func:`~tpsl_flwr.wire.recorder.record_transcript` to keep what the
        node receives for an offline attack.
    checkpoint_dir
        The folder this node saves ``party-<partition>.pt`` in when the label
        party asks (at each epoch's end, only if the label party has a
        store), and resumes from; or a function ``(context) -> folder | None``
        choosing it per run. Used exactly as stated: a relative folder is
        relative to the node process's working directory. ``None`` (the
        default): the node never writes a file, and a label party asking it
        to checkpoint or to resume gets an error reply naming
        ``checkpoint_dir``.

    Returns
    -------
    ClientApp
        Serves ``query.hello``, ``train`` and ``query``. Each message first
        checks the node config (:func:`~tpsl_flwr.wire.node_edge.check_node_config`:
        ``partition-id`` and ``num-partitions`` present, integers, in range,
        ``num-partitions`` equal to the run config's ``num-parties`` when it
        has one), before ``factory`` runs; an error of a handler leaves the
        node as one line naming its partition and the root cause
        (:func:`~tpsl_flwr.wire.node_edge.node_failure`).

    Raises
    ------
    ConfigError
        At once, for a ``factory`` that is not callable, ``mods`` that are
        not a list of callables, or a ``checkpoint_dir`` that is neither a
        folder, a function nor None (an empty path included).

    Examples
    --------
    >>> from pathlib import Path
    >>> def factory(context):
    ...     raise NotImplementedError  # your features and bottom model
    >>> app = make_client_app(factory, checkpoint_dir=Path("/srv/node-a"))
    >>> per_run = make_client_app(
    ...     factory,
    ...     checkpoint_dir=lambda context: Path(context.run_config["out-dir"]),
    ... )
    """
    check_app_arguments(factory, mods, checkpoint_dir)
    handlers = NonLabelHandlers(factory, checkpoint_dir)
    client_app = ClientApp(mods=mods)
    client_app.query("hello")(_at_the_edge(handlers.hello))
    client_app.train()(_at_the_edge(handlers.step))
    client_app.query()(_at_the_edge(handlers.step))
    return client_app


def check_app_arguments(factory: object, mods: object, checkpoint_dir: object) -> None:
    """Refuse :func:`make_client_app`'s arguments at once, naming the bad one.

    Examples
    --------
    >>> check_app_arguments(lambda context: None, None, "")
    Traceback (most recent call last):
    ...
    tpsl_flwr.errors.ConfigError: checkpoint_dir must be a folder, a function (context) -> folder | None, or None, got ''
    """  # noqa: E501
    if not callable(factory):
        raise ConfigError(
            f"factory must be a function (context) -> NonLabelParty, got {factory!r}"
        )
    if mods is not None and not (
        isinstance(mods, list) and all(callable(m) for m in mods)
    ):
        raise ConfigError(f"mods must be a list of Flower mods, got {mods!r}")
    folder = isinstance(checkpoint_dir, str | Path) and str(checkpoint_dir) != ""
    if not (checkpoint_dir is None or callable(checkpoint_dir) or folder):
        raise ConfigError(
            "checkpoint_dir must be a folder, a function (context) -> folder | "
            f"None, or None, got {checkpoint_dir!r}"
        )


def _stated_partition(node_config: dict[str, Any]) -> tuple[int, int] | None:
    """``(partition-id, num-partitions)`` as stated, if both are integers."""
    values = [node_config.get(key) for key in (P.PARTITION_ID, P.NUM_PARTITIONS)]
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return values[0], values[1]  # type: ignore[return-value]
    return None


def _at_the_edge(handler: Handler) -> Handler:
    """``handler`` behind the node config check, its errors named by partition."""

    def checked(msg: Message, context: Context) -> Message:
        try:
            partition, partitions = check_node_config(
                context.node_config, context.run_config
            )
        except ConfigError as err:
            named = _stated_partition(context.node_config)
            if named is None:
                raise
            raise node_failure(err, *named) from err
        try:
            return handler(msg, context)
        except Exception as err:
            raise node_failure(err, partition, partitions) from err

    checked.__name__ = checked.__qualname__ = handler.__name__
    checked.__doc__ = handler.__doc__
    return checked
