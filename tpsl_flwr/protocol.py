"""Every record and key the label party and the non-label parties exchange.

Named once here (as Flower's ``differential_privacy_constants.py`` does), so
the ServerApp, the ClientApp, the transcript test and the attacker's recorder
agree. What a non-label party may ever receive is exactly
:data:`ALLOWED_CONFIG_KEYS` and
:data:`ALLOWED_ARRAY_KEY_PREFIXES`: sample ids, perturbed gradients and public
configuration.
"""

from __future__ import annotations

from tpsl_flwr.errors import ProtocolError

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

# Keys of NODE.
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
EMBEDDING_DIM = "embedding-dim"
NUM_TRAIN = "num-train"
NUM_TEST = "num-test"

ALLOWED_CONFIG_KEYS = frozenset({EPOCH, ROUND, SPLIT, CHECKPOINT_EPOCH, RESUME_EPOCH})
"""The only keys of :data:`CONFIG` a non-label party may receive."""
ALLOWED_ARRAY_KEY_PREFIXES: dict[str, tuple[str, ...]] = {
    NEW_IDS: ("batch-",),
    GRADS: ("ids-", "grad-"),
}
"""The only array records (and key prefixes) a non-label party may receive."""


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
