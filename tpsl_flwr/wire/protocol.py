"""Every record and key the label party and the non-label parties exchange.

Named once here (as Flower's ``differential_privacy_constants.py`` does), so
the ServerApp, the ClientApp, the transcript test and the attacker's recorder
agree. What a non-label party may ever receive is exactly
:data:`ALLOWED_CONFIG_KEYS` and
:data:`ALLOWED_ARRAY_KEY_PREFIXES`: sample ids, perturbed gradients and public
configuration.
"""

from __future__ import annotations

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
"""ArrayRecord: ``batch-j`` -> int64 sample ids to embed next."""
GRADS = "tpsl.grads"
"""ArrayRecord: ``ids-j`` -> int64 ids, ``grad-j`` -> float32 perturbed gradient."""

# Records in a reply from a non-label party.
EMBEDDINGS = "tpsl.embeddings"
"""ArrayRecord: ``batch-j`` -> float32 embeddings of the ids sent."""
NODE = "tpsl.node"
"""ConfigRecord describing a node (reply to hello)."""

# Keys of CONFIG.
EPOCH = "epoch"
ROUND = "round"
SPLIT = "split"
CHECKPOINT_EPOCH = "checkpoint-epoch"
RESUME_EPOCH = "resume-epoch"
SPLITS = "splits"
"""Comma-separated split of each batch of :data:`NEW_IDS` (overrides SPLIT)."""
LR_SCALE = "lr-scale"
"""Learning-rate multiplier of the gradients in the message (decimal string)."""
KEEP_BEST = "keep-best"
"""Keep the current state as the best epoch's (the epoch number)."""
RESTORE_BEST = "restore-best"
"""Load the state kept as the best epoch's (the epoch number)."""

# Run-config key both parties read (public configuration, never sent in CONFIG).
WIRE_DTYPE = "wire-dtype"
"""Float dtype of embeddings and gradients on the wire (:mod:`.wire_dtype`)."""

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
        CHECKPOINT_EPOCH,
        RESUME_EPOCH,
        LR_SCALE,
        KEEP_BEST,
        RESTORE_BEST,
    }
)
"""The only keys of :data:`CONFIG` a non-label party may receive."""
ALLOWED_ARRAY_KEY_PREFIXES: dict[str, tuple[str, ...]] = {
    NEW_IDS: ("batch-",),
    GRADS: ("ids-", "grad-"),
}
"""The only array records (and key prefixes) a non-label party may receive."""


def check_outgoing(content: Any) -> None:
    """Raise unless a message's content is on the allow-list; run before sending.

    ``content`` is a Flower ``RecordDict`` (read through its public
    ``config_records``, ``array_records`` and ``metric_records`` views, so this
    module needs no Flower import). Only :data:`CONFIG` with
    :data:`ALLOWED_CONFIG_KEYS` and plain values, and the array records of
    :data:`ALLOWED_ARRAY_KEY_PREFIXES` may leave the label party.

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
        prefixes = ALLOWED_ARRAY_KEY_PREFIXES.get(name)
        if prefixes is None:
            raise PrivacyError(f"array record {name!r} may not leave the label party")
        for key in record:
            if not key.startswith(prefixes):
                raise PrivacyError(
                    f"array {key!r} of {name!r} may not leave the label party; "
                    f"allowed prefixes: {list(prefixes)}"
                )


def batch_key(j: int) -> str:
    """Key of the ``j``-th batch in :data:`NEW_IDS` and :data:`EMBEDDINGS`."""
    return f"batch-{j}"


def grad_keys(j: int) -> tuple[str, str]:
    """Keys of the ids and the gradient of the ``j``-th batch in :data:`GRADS`."""
    return f"ids-{j}", f"grad-{j}"


def as_int(value: object, what: str) -> int:
    """An integer from a ConfigRecord value, or a ProtocolError naming it."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ProtocolError(f"{what} must be an integer, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ProtocolError(f"{what} must be an integer, got {value!r}") from None
