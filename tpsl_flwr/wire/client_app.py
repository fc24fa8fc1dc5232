"""The non-label node's half of the wire: a ClientApp over any ``NonLabelParty``.

Each SuperNode is one non-label party. Only ``context.state`` survives between
messages of a node, so the bottom model and its optimizer live there
(serialized with :mod:`tpsl_flwr.wire.state_codec`). The label party's half of
the same messages is :mod:`tpsl_flwr.wire.label_side`.

Bring your own bottom model and feature store: write a factory
``(context) -> NonLabelParty`` and build the app with
``make_client_app(factory)``; the handlers, protocol and state handling stay.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import Mod

from tpsl_flwr.errors import ProtocolError
from tpsl_flwr.parties import NonLabelParty
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.arrays import from_array, to_array
from tpsl_flwr.wire.state_codec import UnsupportedStateError, decode_state, encode_state

PartyFactory = Callable[[Context], NonLabelParty]
STATE_KEY = "tpsl.party-state"


def partition_of(context: Context) -> tuple[int, int]:
    """``(partition-id, num-partitions)`` from the node config."""
    config = context.node_config
    if P.PARTITION_ID not in config or P.NUM_PARTITIONS not in config:
        raise ProtocolError(
            "node config lacks partition-id/num-partitions; start the SuperNode with "
            '--node-config "partition-id=I num-partitions=N"'
        )
    return int(config[P.PARTITION_ID]), int(config[P.NUM_PARTITIONS])


def node_checkpoint_path(context: Context) -> Path:
    """Where this node keeps its own checkpoint (under the run's out-dir)."""
    out_dir = str(context.run_config.get("out-dir", "outputs"))
    partition, _ = partition_of(context)
    return Path(out_dir) / "checkpoints" / f"party-{partition}.pt"


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


class NonLabelHandlers:
    """The message handlers of a non-label party, over a party factory."""

    def __init__(self, factory: PartyFactory) -> None:
        self.factory = factory
        # A cache, not state: (run, node) -> (state version, party). Flower may
        # deliver a node's next message to another process, so context.state
        # stays the source of truth and a stale or missing entry is rebuilt.
        self._cache: dict[tuple[int, int], tuple[int, NonLabelParty]] = {}

    def _party(self, context: Context) -> NonLabelParty:
        record = context.state.config_records.get(STATE_KEY)
        version = -1 if record is None else P.as_int(record["version"], "state version")
        cache_key = (context.run_id, context.node_id)
        cached = self._cache.get(cache_key)
        if cached is not None and cached[0] == version:
            return cached[1]
        party = self.factory(context)
        if record is not None:
            party.load_state_dict(_state_from_record(record))
        self._cache[cache_key] = (version, party)
        return party

    def _save(self, party: NonLabelParty, context: Context) -> None:
        record = context.state.config_records.get(STATE_KEY)
        version = (
            0 if record is None else P.as_int(record["version"], "state version") + 1
        )
        context.state[STATE_KEY] = _state_record(party.state_dict(), version)
        self._cache[(context.run_id, context.node_id)] = (version, party)

    def hello(self, msg: Message, context: Context) -> Message:
        """Describe this node; on resume, restore its checkpoint first."""
        config = msg.content.config_records.get(P.CONFIG, ConfigRecord())
        party = self._party(context)
        if P.RESUME_EPOCH in config:
            path = node_checkpoint_path(context)
            if not path.exists():
                raise ProtocolError(f"cannot resume: no checkpoint at {path}")
            saved = torch.load(path, weights_only=True)
            if (
                int(saved["epoch"])
                != P.as_int(config[P.RESUME_EPOCH], "resume-epoch") - 1
            ):
                raise ProtocolError(
                    f"checkpoint {path} is from epoch {saved['epoch']}, the label "
                    f"party resumes after epoch "
                    f"{P.as_int(config[P.RESUME_EPOCH], 'resume-epoch') - 1}"
                )
            party.load_state_dict(saved["party"])
            self._save(party, context)
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
        grads = content.array_records.get(P.GRADS, ArrayRecord())
        j = 0
        while P.grad_keys(j)[0] in grads:
            ids_key, grad_key = P.grad_keys(j)
            party.apply_gradient(
                from_array(grads[ids_key]), from_array(grads[grad_key])
            )
            j += 1
        split = str(config.get(P.SPLIT, "train"))
        new_ids = content.array_records.get(P.NEW_IDS, ArrayRecord())
        embeddings = {}
        j = 0
        while P.batch_key(j) in new_ids:
            emb = party.embed(
                from_array(new_ids[P.batch_key(j)]), split, keep_graph=split == "train"
            )
            embeddings[P.batch_key(j)] = to_array(emb.numpy().astype(np.float32))
            j += 1
        self._save(party, context)
        if P.CHECKPOINT_EPOCH in config and bool(
            context.run_config.get("checkpoint", True)
        ):
            path = node_checkpoint_path(context)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            torch.save(
                {
                    "epoch": P.as_int(config[P.CHECKPOINT_EPOCH], "checkpoint-epoch"),
                    "party": party.state_dict(),
                },
                tmp,
            )
            tmp.replace(path)
        return Message(
            RecordDict({P.EMBEDDINGS: ArrayRecord(embeddings)}), reply_to=msg
        )


def make_client_app(factory: PartyFactory, mods: list[Mod] | None = None) -> ClientApp:
    """A ClientApp running the non-label protocol over ``factory``'s parties.

    ``mods`` are Flower ClientApp mods, e.g.
    :func:`~tpsl_flwr.wire.recorder.record_transcript` to keep what
    the node receives for an offline attack.
    """
    handlers = NonLabelHandlers(factory)
    client_app = ClientApp(mods=mods)
    client_app.query("hello")(handlers.hello)
    client_app.train()(handlers.step)
    client_app.query()(handlers.step)
    return client_app
