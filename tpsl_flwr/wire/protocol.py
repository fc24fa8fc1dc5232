"""Every record and key the label party and the non-label parties exchange.

Named once here (as Flower's ``differential_privacy_constants.py`` does), so
the ServerApp, the ClientApp, the transcript test and the attacker's recorder
agree. What a non-label party may ever receive is exactly
:data:`ALLOWED_CONFIG_KEYS` and
:data:`ALLOWED_ARRAY_KEYS`: sample ids, perturbed gradients and public
configuration.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tpsl_flwr.errors import PrivacyError, ProtocolError

# Message types (Flower routes "query.hello" to @app.query("hello")).
MSG_HELLO = "query.hello"
MSG_TRAIN = "train"
MSG_EMBED_TEST = "query"

# Records in a message to a non-label party.
CONFIG = "tpsl.config"
"""ConfigRecord of public settings (keys below)."""
NEW_IDS = "tpsl.ids"
"""ArrayRecord: ``ids`` -> int64 sample ids to embed next, every batch's stacked."""
GRADS = "tpsl.grads"
"""ArrayRecord: ``ids`` -> int64 ids, ``grad`` -> float perturbed gradients, stacked."""

# Records in a reply from a non-label party.
EMBEDDINGS = "tpsl.embeddings"
"""ArrayRecord: ``embeddings`` -> float embeddings of the ids sent, stacked."""

# Array keys: one array per record, the batches stacked row-wise
# (:mod:`~tpsl_flwr.wire.batch_pack`).
IDS_KEY = "ids"
GRAD_KEY = "grad"
EMBEDDINGS_KEY = "embeddings"
NODE = "tpsl.node"
"""ConfigRecord describing a node (reply to hello)."""
ECHO = "tpsl.echo"
"""ConfigRecord: what a node did with a setting the label party must see done
(:data:`AVERAGE_IN` with :data:`AVERAGED`, :data:`RESTORE_AVERAGE`); the label
party refuses a reply that lacks it or says otherwise (a node that ignores a
key it does not know, such as an older tpsl-flwr, would otherwise return
other weights than the label party's, with no error)."""

# Keys of CONFIG.
EPOCH = "epoch"
ROUND = "round"
SPLIT = "split"
CHECKPOINT_EPOCH = "checkpoint-epoch"
RESUME_EPOCH = "resume-epoch"
CHECKPOINTS = "checkpoints"
"""In a hello: the label party will ask for a checkpoint after every epoch."""
SPLITS = "splits"
"""Comma-separated split of each batch of :data:`NEW_IDS` (overrides SPLIT)."""
BATCH_ROWS = "batch-rows"
"""Comma-separated row count of each batch stacked in :data:`NEW_IDS`."""
GRAD_ROWS = "grad-rows"
"""Comma-separated row count of each gradient slice stacked in :data:`GRADS`."""
LR_SCALE = "lr-scale"
"""Learning-rate multiplier of the gradients in the message (decimal string)."""
KEEP_BEST = "keep-best"
"""Keep the current state as the best epoch's (the epoch number)."""
RESTORE_BEST = "restore-best"
"""Load the state kept as the best epoch's (the epoch number)."""
AVERAGE_IN = "average-in"
"""Fold the current model into the running average of its weights, after
every gradient of the message is applied (the epoch number;
:mod:`~tpsl_flwr.parties.weight_average`)."""
RESTORE_AVERAGE = "restore-average"
"""Load the running average of the model's weights: the number of epochs it
holds, the last of which is the message's :data:`EPOCH`; the node checks both
against the epochs :data:`AVERAGE_IN` folded in."""
AVERAGED = "averaged"
"""In an :data:`ECHO`: the epochs the node's running average holds after an
:data:`AVERAGE_IN` (never sent to a node)."""

# Run-config key both parties read (public configuration, never sent in CONFIG).
WIRE_DTYPE = "wire-dtype"
"""Float dtype of embeddings and gradients on the wire (:mod:`.wire_dtype`)."""

# A record of a node's context.state written by an engine, never sent.
APP_KEEPS_STATE = "tpsl.app-keeps-state"
"""Present when the engine calls one ClientApp object for every message of a
node in one process (the in-process engine): the node keeps its party in that
object and stores only the state's version in ``context.state``."""

# Keys of NODE; the same two names are the keys of a SuperNode's node config
# (``flower-supernode --node-config "partition-id=I num-partitions=N"``).
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
EMBEDDING_DIM = "embedding-dim"
NUM_TRAIN = "num-train"
NUM_TEST = "num-test"

ALLOWED_CONFIG_KEYS = frozenset(
    {
        EPOCH,
        ROUND,
        SPLIT,
        SPLITS,
        BATCH_ROWS,
        GRAD_ROWS,
        CHECKPOINT_EPOCH,
        CHECKPOINTS,
        RESUME_EPOCH,
        LR_SCALE,
        KEEP_BEST,
        RESTORE_BEST,
        AVERAGE_IN,
        RESTORE_AVERAGE,
    }
)
"""The only keys of :data:`CONFIG` a non-label party may receive."""
ALLOWED_ARRAY_KEYS: dict[str, frozenset[str]] = {
    NEW_IDS: frozenset({IDS_KEY}),
    GRADS: frozenset({IDS_KEY, GRAD_KEY}),
}
"""The only array records (and their keys) a non-label party may receive."""
_ROWS_KEY = {NEW_IDS: BATCH_ROWS, GRADS: GRAD_ROWS}
_ARRAY_LAYOUT = {IDS_KEY: (1, ("int64",)), GRAD_KEY: (2, ("float32", "float16"))}
_COUNTS = re.compile(r"[0-9]{1,12}(,[0-9]{1,12})*")


def check_outgoing(content: Any) -> None:
    """Raise unless a message's content is on the allow-list; run before sending.

    ``content`` is a Flower ``RecordDict`` (read through its public
    ``config_records``, ``array_records`` and ``metric_records`` views, so this
    module needs no Flower import). Only :data:`CONFIG` with
    :data:`ALLOWED_CONFIG_KEYS` and plain values, and the array records and
    keys of :data:`ALLOWED_ARRAY_KEYS` may leave the label party.

    Raises
    ------
    PrivacyError
        Naming the record or key that is not allowed; the message must not be
        sent (fail closed).
    """
    for name in content.metric_records:
        raise PrivacyError(f"metric record {name!r} may not leave the label party")
    for name, record in content.config_records.items():
        if name != CONFIG:
            raise PrivacyError(f"config record {name!r} may not leave the label party")
        for key, value in record.items():
            if key not in ALLOWED_CONFIG_KEYS:
                raise PrivacyError(
                    f"config key {key!r} of {CONFIG!r} may not leave the label party; "
                    f"allowed: {sorted(ALLOWED_CONFIG_KEYS)}"
                )
            if not isinstance(value, int | str):
                raise PrivacyError(
                    f"config key {key!r} holds a {type(value).__name__}; only ints "
                    "and strings may leave the label party"
                )
    for name, record in content.array_records.items():
        allowed = ALLOWED_ARRAY_KEYS.get(name)
        if allowed is None:
            raise PrivacyError(f"array record {name!r} may not leave the label party")
        for key in record:
            if key not in allowed:
                raise PrivacyError(
                    f"array {key!r} of {name!r} may not leave the label party; "
                    f"allowed: {sorted(allowed)}"
                )
        _check_stacked(name, record, content.config_records.get(CONFIG, {}))


def _check_stacked(name: str, record: Any, config: Any) -> None:
    """Raise unless ``record`` holds its keys' layout and the rows its config lists.

    The row-count config keys carry nothing but the lengths of the batches of
    ids sent (:mod:`~tpsl_flwr.wire.batch_pack`): digits and commas, adding up
    to every array's rows; present exactly when the record holds arrays.
    """
    rows_key = _ROWS_KEY[name]
    if not len(record):
        if rows_key in config:
            raise PrivacyError(f"{rows_key!r} is sent without arrays in {name!r}")
        return
    if set(record.keys()) != ALLOWED_ARRAY_KEYS[name]:
        raise PrivacyError(
            f"{name!r} must hold all of {sorted(ALLOWED_ARRAY_KEYS[name])}"
        )
    try:
        total = sum(row_counts(config.get(rows_key), rows_key))
    except ProtocolError as err:
        raise PrivacyError(f"{name!r} may not leave the label party: {err}") from None
    for key, array in record.items():
        ndim, dtypes = _ARRAY_LAYOUT[key]
        shape = tuple(array.shape)
        if len(shape) != ndim or array.dtype not in dtypes or shape[0] != total:
            raise PrivacyError(
                f"array {key!r} of {name!r} ({array.dtype}, shape {shape}) may not "
                f"leave the label party: expected {ndim}-D {' or '.join(dtypes)} "
                f"with the {total} rows that {rows_key!r} lists"
            )


def row_counts(text: object, what: str) -> list[int]:
    """Parse a ``"n0,n1,..."`` config value into row counts (ASCII digits only).

    Raises
    ------
    ProtocolError
        Naming ``what`` and the value, if it is not such a list.

    Examples
    --------
    >>> row_counts("1024,512", "batch-rows")
    [1024, 512]
    """
    if not isinstance(text, str) or not _COUNTS.fullmatch(text):
        raise ProtocolError(
            f"{what} must list the row count of each batch as digits separated by "
            f"commas, got {text!r}"
        )
    return [int(part) for part in text.split(",")]


def parse_bool(raw: object) -> bool:
    """A run-config boolean: "true", "1", "false" or "0" in any case, else truth.

    The one rule for both sides: the label party's config
    (:func:`~tpsl_flwr.experiments.config_fields.coerce_value`) and a node's
    light ClientApp, which must not import the config's modules.

    Raises
    ------
    ValueError
        If ``raw`` is any other string.

    Examples
    --------
    >>> [parse_bool(v) for v in (True, "TRUE", 1, "0", False)]
    [True, True, True, False, False]
    """
    if isinstance(raw, str):
        if raw.lower() not in ("true", "false", "1", "0"):
            raise ValueError(raw)
        return raw.lower() in ("true", "1")
    return bool(raw)


def as_int(value: object, what: str) -> int:
    """An integer from a ConfigRecord value, or a ProtocolError naming it."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ProtocolError(f"{what} must be an integer, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ProtocolError(f"{what} must be an integer, got {value!r}") from None


def epochs_text(epochs: list[int]) -> str:
    """Epoch numbers as the node keeps them with its average: ``"1,2,3"``."""
    return ",".join(str(e) for e in epochs)


def averaged_epochs(record: Mapping[str, Any] | None) -> list[int]:
    """The epochs folded into the node's running average (none without one)."""
    if record is None:
        return []
    text = record.get("epochs")
    if not isinstance(text, str) or not re.fullmatch(r"[0-9]{1,9}(,[0-9]{1,9})*", text):
        raise ProtocolError(
            "this node's running average does not say which epochs it holds "
            f"(epochs {text!r}, written by an older tpsl-flwr?), so it cannot be "
            "restored: start a fresh run"
        )
    epochs = [int(e) for e in text.split(",")]
    count = as_int(record["version"], "averaged epochs")
    if len(epochs) != count:
        raise ProtocolError(
            f"this node's running average holds {count} epochs but lists {text!r}"
        )
    return epochs
