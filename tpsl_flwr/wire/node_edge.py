"""A node's edge: its node config checked first, its errors named by partition.

Both halves side by side. The node's half (:func:`check_node_config`,
:func:`node_failure`) runs in :func:`~tpsl_flwr.wire.node_side.make_client_app`
before any handler or the embedder's party factory: a SuperNode started
without (or with a misspelt) ``partition-id``/``num-partitions`` is refused in
one line naming the key, and any error of a handler leaves the node as one
line that names its partition and the root cause (the exception's type and
message) behind a marker. The label party's half (:func:`read_node_error`)
finds that line again in whatever Flower made of it: ``<class 'X'>:<'...'>``
on the deployment runtime and in process, or Ray's
``RayTaskError(ClientAppException)`` wrapper with its traceback in
simulation, whose text then goes to the log only.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from tpsl_flwr.errors import ConfigError, ProtocolError
from tpsl_flwr.wire.protocol import NUM_PARTITIONS, PARTITION_ID

__all__ = [
    "NodeError",
    "NodeFailure",
    "check_node_config",
    "node_failure",
    "read_node_error",
]

NUM_PARTIES = "num-parties"
"""Run-config key of the number of non-label parties (this project's apps)."""
NODE_CONFIG_HINT = (
    'start the SuperNode with --node-config "partition-id=I num-partitions=N"'
)
SUPERNODES_HINT = (
    "in simulation set the federation's num-supernodes (flwr run . <federation> "
    '--federation-config "num-supernodes={parties}"); in deployment start one '
    'SuperNode per party with --node-config "partition-id=I num-partitions={parties}"'
)
"""How to give a run ``{parties}`` nodes, on either Flower runtime."""

_MARKER = "[tpsl partition {partition} of {partitions}] "
_MARKED = re.compile(r"\[tpsl partition (\d+) of (\d+)\] ([^\n]*)")
_FLOWER_REASON = re.compile(r"^<class '([\w.()]+)'>:<'(.*?)(?:'>)?$", re.DOTALL)
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)): (.+)$")


class NodeFailure(ProtocolError):
    """A node's handler failed: the message is ``[tpsl partition P of N] X: why``."""


def _integer(config: Mapping[str, object], key: str) -> int:
    """``config[key]`` as an int, or a ConfigError naming the key (and a typo)."""
    if key not in config:
        close = difflib.get_close_matches(key, [str(k) for k in config], 1, 0.7)
        found = f" (found {close[0]!r}: a typo?)" if close else ""
        raise ConfigError(f"the node config has no {key!r}{found}; {NODE_CONFIG_HINT}")
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"node config {key} must be an integer, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(
            f"node config {key} must be an integer, got {value!r}"
        ) from None


def check_node_config(
    node_config: Mapping[str, object], run_config: Mapping[str, object] | None = None
) -> tuple[int, int]:
    """``(partition-id, num-partitions)``, checked; the node's first act.

    Parameters
    ----------
    node_config
        The SuperNode's ``--node-config`` (Flower's simulation sets both keys).
    run_config
        The run config; when it holds ``num-parties``, ``num-partitions`` must
        equal it (an extra SuperNode, or one too few, is named here).

    Raises
    ------
    ConfigError
        In one line naming the key: missing (with the key found instead when
        it looks like a typo, e.g. ``partition_id``), not an integer, out of
        range (``0 <= partition-id < num-partitions``, ``num-partitions >=
        1``), or ``num-partitions`` other than the run's ``num-parties``.

    Examples
    --------
    >>> check_node_config({"partition-id": 1, "num-partitions": 3})
    (1, 3)
    >>> check_node_config({"partition_id": 1, "num-partitions": 3})
    Traceback (most recent call last):
    ...
    tpsl_flwr.errors.ConfigError: the node config has no 'partition-id' (found 'partition_id': a typo?); start the SuperNode with --node-config "partition-id=I num-partitions=N"
    """  # noqa: E501
    partitions = _integer(node_config, NUM_PARTITIONS)
    partition = _integer(node_config, PARTITION_ID)
    if partitions < 1:
        raise ConfigError(f"node config num-partitions must be >= 1, got {partitions}")
    if not 0 <= partition < partitions:
        raise ConfigError(
            f"node config partition-id must be in 0..{partitions - 1} "
            f"(num-partitions = {partitions}), got {partition}"
        )
    parties = (run_config or {}).get(NUM_PARTIES)
    if isinstance(parties, int) and not isinstance(parties, bool):
        if partitions != parties:
            more = partitions > parties
            raise ConfigError(
                f"this node is partition {partition} of num-partitions = "
                f"{partitions}, but the run config has num-parties = {parties}: "
                f"{'more' if more else 'fewer'} nodes than parties; "
                + SUPERNODES_HINT.format(parties=parties)
            )
    return partition, partitions


def node_failure(error: BaseException, partition: int, partitions: int) -> NodeFailure:
    r"""The error a node's handler raised, as one marked line naming the partition.

    Examples
    --------
    >>> str(node_failure(ValueError("bad\nmore"), 2, 3))
    '[tpsl partition 2 of 3] ValueError: bad'
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    cause = type(error).__name__ + (f": {lines[0]}" if lines else "")
    marker = _MARKER.format(partition=partition, partitions=partitions)
    return NodeFailure(marker + cause)


@dataclass(frozen=True)
class NodeError:
    """What the label party reads from a node's error reply."""

    cause: str
    """The root cause in one line: the exception's type and message."""
    partition: int | None
    """The partition the node named (``None`` when it named none)."""
    detail: str | None
    """The rest of the reason (Ray's wrapper and traceback), for the log only."""


def read_node_error(reason: str) -> NodeError:
    r"""The root cause of a node's error reply, and the partition it names.

    Examples
    --------
    >>> read_node_error("<class 'tpsl_flwr.wire.node_edge.NodeFailure'>:"
    ...                 "<'[tpsl partition 1 of 2] OSError: disk full'>")
    NodeError(cause='OSError: disk full', partition=1, detail=None)
    >>> read_node_error("<class 'ray.exceptions.RayTaskError(ClientAppException)'>"
    ...                 ":<'ray::A.run()\nTraceback (most recent call last):\n"
    ...                 "KeyError: 'x'\n'>").cause
    "KeyError: 'x'"
    >>> read_node_error("<class 'KeyError'>:<''x''>")
    NodeError(cause="KeyError: 'x'", partition=None, detail=None)
    """
    text = reason.strip()
    marked = _MARKED.search(text)
    flower = _FLOWER_REASON.match(text)
    if marked is not None:
        cause, partition = marked.group(3).strip(), int(marked.group(1))
        if cause.endswith("'>") and text.endswith(cause):
            cause = cause[:-2].rstrip()  # the last line of Flower's <'...'>
    elif flower is not None:
        name = flower.group(1).rsplit(".", 1)[-1]
        body = [line.strip() for line in flower.group(2).splitlines() if line.strip()]
        root = next((m.group(0) for m in map(_EXCEPTION_LINE.match, body) if m), None)
        plain = f"{name}: {body[0]}" if body else name
        cause, partition = (root if len(body) > 1 and root else plain), None
    else:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        cause, partition = (lines[0] if lines else "unknown error"), None
    simple = flower is not None and "\n" not in flower.group(2).strip()
    return NodeError(cause, partition, None if simple else text)
