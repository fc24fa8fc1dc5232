"""A message's batches in one array per record, their row counts in its config.

A train message carries ``K = steps-per-message`` batches of ids to embed and
up to ``K`` perturbed gradient slices (Sec. 4.1's step, ``K`` of them per round
trip). Flower's deployment runtime moves a message as content-addressed
objects, one per ``Array``, each pulled by its own call and hashed on both
ends, so one array per batch made a message's cost grow with ``K``
(``bench/README.md``, "Steps per message x pipeline depth"). Here the batches
of a record are stacked row-wise into one array and their row counts go as a
comma-separated string in the message's public config (:data:`.BATCH_ROWS`,
:data:`.GRAD_ROWS`); a reply's embeddings are stacked the same way and split
by the rows the label party asked for. The counts are the lengths of the id
arrays, which the receiver saw anyway: nothing new leaves the label party.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from tpsl_flwr.errors import ProtocolError
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.arrays import from_array
from tpsl_flwr.wire.protocol import row_counts

__all__ = [
    "gradient_batches",
    "id_batches",
    "row_counts",
    "split_rows",
    "stack_rows",
]


def stack_rows(parts: Sequence[np.ndarray]) -> tuple[np.ndarray, str]:
    """``parts`` stacked row-wise, and their row counts as ``"n0,n1,..."``.

    Examples
    --------
    >>> values, counts = stack_rows([np.arange(3), np.arange(2)])
    >>> values.tolist(), counts
    ([0, 1, 2, 0, 1], '3,2')
    """
    counts = ",".join(str(len(part)) for part in parts)
    return np.concatenate(parts), counts


def split_rows(
    values: np.ndarray, counts: Sequence[int], what: str
) -> list[np.ndarray]:
    """Split stacked ``values`` back into batches of ``counts`` rows.

    Raises
    ------
    ProtocolError
        If the counts do not add up to the rows of ``values``.

    Examples
    --------
    >>> [p.tolist() for p in split_rows(np.arange(5), [3, 2], "ids")]
    [[0, 1, 2], [3, 4]]
    """
    if values.ndim < 1 or sum(counts) != values.shape[0]:
        raise ProtocolError(
            f"{what} holds {values.shape[0] if values.ndim else 0} rows, but its "
            f"row counts {list(counts)} add up to {sum(counts)}"
        )
    return np.split(values, np.cumsum(counts)[:-1])


def _stacked(
    content: RecordDict, record: str, keys: tuple[str, ...], rows_key: str
) -> list[list[np.ndarray]] | None:
    """Each of ``keys`` of ``record`` split into its batches (None: no batches)."""
    arrays = content.array_records.get(record, ArrayRecord())
    if not len(arrays):
        return None
    missing = [key for key in keys if key not in arrays]
    extra = sorted(set(arrays.keys()) - set(keys))
    if missing or extra:
        raise ProtocolError(
            f"{record} must hold exactly the arrays {list(keys)}; "
            f"missing {missing}, unexpected {extra}"
        )
    config = content.config_records.get(P.CONFIG, ConfigRecord())
    counts = row_counts(config.get(rows_key), rows_key)
    return [
        split_rows(from_array(arrays[key]), counts, f"{record}[{key}]") for key in keys
    ]


def _integer_ids(values: np.ndarray, what: str) -> np.ndarray:
    """``values`` as int64, refusing anything but a 1-D integer array."""
    if values.ndim != 1 or values.dtype.kind not in "iu":
        raise ProtocolError(
            f"{what} must be a 1-D integer array, got {values.dtype} of shape "
            f"{values.shape}"
        )
    return values.astype(np.int64, copy=False)


def id_batches(content: RecordDict) -> list[np.ndarray]:
    """The batches of ids a message asks a node to embed (int64), in order."""
    found = _stacked(content, P.NEW_IDS, (P.IDS_KEY,), P.BATCH_ROWS)
    if found is None:
        return []
    return [_integer_ids(ids, f"{P.NEW_IDS}[{P.IDS_KEY}]") for ids in found[0]]


def gradient_batches(content: RecordDict) -> list[tuple[np.ndarray, np.ndarray]]:
    """The ``(ids, perturbed gradient)`` pairs a message carries, in order."""
    found = _stacked(content, P.GRADS, (P.IDS_KEY, P.GRAD_KEY), P.GRAD_ROWS)
    if found is None:
        return []
    what = f"{P.GRADS}[{P.IDS_KEY}]"
    pairs = []
    for ids, grad in zip(*found, strict=True):
        if grad.ndim != 2 or grad.dtype.kind != "f":
            raise ProtocolError(
                f"{P.GRADS}[{P.GRAD_KEY}] must be a 2-D float array, got "
                f"{grad.dtype} of shape {grad.shape}"
            )
        pairs.append((_integer_ids(ids, what), grad))
    return pairs
