"""Copy a Flower message as (de)serialisation would, without ``copy.deepcopy``.

The in-process engine hands each ClientApp a copy of the message and of its
context, so that neither side can see the other's later mutations, as on
Flower's real engines where everything crosses a process boundary as
protobuf. ``copy.deepcopy`` walks every attribute of every Flower object and
was the largest per-message cost of the engine for small models. What needs
copying is less: ``Array`` data are immutable ``bytes`` and record values are
scalars, strings, bytes or lists of them, so new containers and new ``Array``
objects over the same bytes isolate exactly as much. Record types this module
does not know are deep-copied.
"""

from __future__ import annotations

import copy
from typing import Any

from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)

__all__ = ["copy_context", "copy_message", "copy_records"]


def copy_records(records: RecordDict) -> RecordDict:
    """An independent copy of ``records`` (new records, arrays sharing bytes)."""
    out = RecordDict()
    for name, record in records.items():
        out[name] = _copy_record(record)
    return out


def copy_message(message: Message) -> Message:
    """An independent copy of ``message``: metadata, content or error."""
    metadata = copy.copy(message.metadata)
    # Message(metadata=...) is the constructor path Flower's own deserialisation
    # takes; its public overloads leave it out.
    if message.has_error():
        error = copy.copy(message.error)
        return Message(metadata=metadata, error=error)  # type: ignore[call-overload]
    content = copy_records(message.content)
    return Message(metadata=metadata, content=content)  # type: ignore[call-overload]


def copy_context(context: Context) -> Context:
    """An independent copy of ``context``: node config, state and run config."""
    return Context(
        run_id=context.run_id,
        node_id=context.node_id,
        node_config=dict(context.node_config),
        state=copy_records(context.state),
        run_config=dict(context.run_config),
    )


def _copy_record(record: Any) -> Any:
    if isinstance(record, ArrayRecord):
        return ArrayRecord(
            {
                key: Array(
                    dtype=array.dtype,
                    shape=tuple(array.shape),
                    stype=array.stype,
                    data=bytes(array.data),  # the same object when already bytes
                )
                for key, array in record.items()
            }
        )
    if isinstance(record, ConfigRecord):
        return ConfigRecord({key: _copy_value(v) for key, v in record.items()})
    if isinstance(record, MetricRecord):
        return MetricRecord({key: _copy_value(v) for key, v in record.items()})
    return copy.deepcopy(record)


def _copy_value(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value
