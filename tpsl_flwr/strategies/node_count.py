"""The number of non-label nodes, checked when the label party connects.

Flower may start the ServerApp before the SuperNodes register, so the label
party waits for them (:func:`wait_for_nodes`). How long depends on the
runtime:

* in simulation (Ray, ``InMemoryGrid``) and in process every node registers
  at once, right after the ServerApp starts: once some nodes are there and
  their count has not changed for :data:`SETTLE_S` seconds, it is final. Too
  few nodes then fail in seconds rather than after the whole ``node_wait``;
  in Ray simulation too many are refused before any message is sent, naming
  the extra partitions (simulation numbers its nodes
  ``0..num-supernodes-1``), and elsewhere after the hello, before the party
  factory of an extra node runs when the run config has ``num-parties``
  (:func:`~tpsl_flwr.wire.node_edge.check_node_config`) and else before any
  training step (:func:`refuse_extra_nodes`);
* on the deployment runtime (``HttpGrid``) SuperNodes join over the network
  whenever they are started, so the label party waits up to ``node_wait``;
  a SuperNode that restarted is listed under its old id too until its
  heartbeat expires, so more nodes than parties are sorted out after the
  hello (:func:`refuse_extra_nodes`).

Every refusal is one line naming ``num-parties`` and the setting that fixes
it: the federation's ``num-supernodes`` in simulation, one SuperNode per party
in deployment (:data:`~tpsl_flwr.wire.node_edge.SUPERNODES_HINT`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from flwr.serverapp import Grid
from flwr.superlink.grid import HttpGrid, InMemoryGrid

from tpsl_flwr.errors import ProtocolError
from tpsl_flwr.wire.label_side import Node
from tpsl_flwr.wire.node_edge import SUPERNODES_HINT

__all__ = [
    "POLL_S",
    "SETTLE_S",
    "refuse_extra_nodes",
    "registers_at_once",
    "wait_for_nodes",
]

POLL_S = 0.2
"""Seconds between two looks at the registered nodes."""
SETTLE_S = 3.0
"""Where nodes register at once: seconds of an unchanged count that make it final.

Flower 1.42's simulation registers its virtual nodes in one loop right after
starting the ServerApp's thread (``vce_api.start_vce``); 3 s leaves ample
room for that loop on a loaded machine and is far below the 60 s default wait.
"""
CONFIRM_S = 1.0
"""In Ray simulation, seconds the count must hold before it is compared.

A look taken in the middle of the registration loop would see too few nodes;
this makes sure an extra node is not left to register unseen.
"""


def registers_at_once(grid: Grid) -> bool:
    """Whether every node of ``grid`` registers at once (all but deployment)."""
    return not isinstance(grid, HttpGrid)


def _fix(parties: int) -> str:
    return SUPERNODES_HINT.format(parties=parties)


def wait_for_nodes(
    grid: Grid, expected: int | None, wait: float, settle: float | None = None
) -> list[int]:
    """The ids of the registered nodes, once ``expected`` of them are there.

    Parameters
    ----------
    grid
        Any Flower ``Grid``.
    expected
        The run's number of non-label parties (``num-parties``); ``None``:
        whoever is there now.
    wait
        Longest wait, in seconds, for ``expected`` nodes to register.
    settle
        Seconds of an unchanged, non-zero count after which it is final;
        ``None``: :data:`SETTLE_S` where nodes register at once
        (:func:`registers_at_once`), else never (wait the whole ``wait``).

    Raises
    ------
    ProtocolError
        In one line naming ``num-parties`` and the fix: fewer than
        ``expected`` nodes registered (within ``wait``, or as a final count),
        more than ``expected`` in Ray simulation (no message has been sent
        to any node then; elsewhere a SuperNode that restarted is listed
        twice for a while, and :func:`refuse_extra_nodes` decides after the
        hello), or none at all.
    """
    if settle is None and registers_at_once(grid):
        settle = SETTLE_S
    started = time.monotonic()
    node_ids = list(grid.get_node_ids())
    seen, since = len(node_ids), started
    while expected is not None and len(node_ids) < expected:
        now = time.monotonic()
        final = settle is not None and node_ids and now - since >= settle
        if final or now - started > wait:
            how = (
                f"and no more came within {settle:g} s (on this runtime every node "
                "registers at once)"
                if final
                else f"within {wait:g} s"
            )
            raise ProtocolError(
                f"expected {expected} non-label nodes, only {len(node_ids)} "
                f"registered {how}: the run has num-parties = {expected}; "
                + _fix(expected)
            )
        time.sleep(POLL_S)
        node_ids = list(grid.get_node_ids())
        if len(node_ids) != seen:
            seen, since = len(node_ids), time.monotonic()
    if not node_ids:
        raise ProtocolError("no non-label nodes are connected")
    simulated = isinstance(grid, InMemoryGrid)  # virtual nodes never restart
    if expected is not None and simulated:
        node_ids = _settled(grid, node_ids, CONFIRM_S)
        if len(node_ids) > expected:
            extra = ", ".join(str(p) for p in range(expected, len(node_ids)))
            raise ProtocolError(
                f"{len(node_ids)} non-label nodes registered but the run has "
                f"num-parties = {expected}: the node(s) of partition {extra} are "
                "extra, refused before any message was sent; " + _fix(expected)
            )
    return node_ids


def _settled(grid: Grid, node_ids: list[int], settle: float) -> list[int]:
    """``node_ids`` once their count has been unchanged for ``settle`` seconds."""
    since = time.monotonic()
    while time.monotonic() - since < settle:
        time.sleep(POLL_S)
        now = list(grid.get_node_ids())
        if len(now) != len(node_ids):
            node_ids, since = now, time.monotonic()
    return node_ids


def refuse_extra_nodes(nodes: Sequence[Node], expected: int | None) -> None:
    """Refuse more described nodes than ``expected``, naming each extra one.

    Raises
    ------
    ProtocolError
        Naming the extra nodes (id and partition), ``num-parties`` and the fix.
    """
    if expected is None or len(nodes) <= expected:
        return
    extra = ", ".join(
        f"node {n.node_id} (partition {n.partition})" for n in nodes[expected:]
    )
    raise ProtocolError(
        f"{len(nodes)} non-label nodes answered but the run has num-parties = "
        f"{expected}: {extra} refused before any training step; " + _fix(expected)
    )
