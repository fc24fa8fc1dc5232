"""The train messages of one epoch, optionally pipelined (``pipeline-depth``).

On Flower's deployment runtime a SuperNode whose pull finds no message sleeps
3 s (hard-coded in flwr 1.42, ``supernode/start_client_internal.py``), and in
sequential split learning it always finds none between two steps: the label
party sends message ``k + 1`` only after it has read reply ``k``. With
``pipeline_depth = d > 0`` the label party keeps up to ``d + 1`` train
messages in flight per node: it pushes message ``k + d`` before it pulls
reply ``k``, so a node that sends a reply finds its next message waiting.

What that changes, precisely (``steps_per_message = 1``; message ``m`` asks
for batch ``m``):

- ``d = 0``: sequential split learning. Message ``m`` carries the perturbed
  gradient of batch ``m - 1``: a node embeds batch ``m`` with a bottom model
  that has applied the gradients of batches ``0 .. m - 1``.
- ``d >= 1``: message ``m`` carries the gradient of batch ``m - 1 - d``, the
  latest one computed when it is sent: the gradient of batch ``k`` reaches
  the nodes ``d`` messages later than with ``d = 0``, and a node embeds batch
  ``m`` with a bottom model that has applied the gradients of batches
  ``0 .. m - 1 - d`` only (staleness ``d`` steps for the bottom models). A
  node applies gradient ``k`` by recomputing batch ``k``'s forward pass with
  its current parameters (those that embedded batch ``k + d``); the label
  party's top model still steps once per batch, in order, on the embeddings
  the nodes returned. Once the epoch's last batch is sent, each gradient
  still due while a reply with embeddings is outstanding goes in a message of
  its own (no ids), so each message carries one step's gradient, with that
  step's ``lr-scale``; the last gradient goes with the epoch's test query, as
  with ``d = 0``. Every gradient of the epoch reaches the nodes before the
  test query asks for embeddings (so evaluation, the best-epoch decision and
  the checkpoints see every update, as with ``d = 0``).

A node must run its messages one at a time, in the order sent: a Flower
SuperNode does (it waits for each reply before it pulls again, and the
SuperLink hands out a node's messages oldest first), the in-process grid does;
Flower's Ray simulation (``InMemoryGrid``) does not (two messages of one node
may run on two actors at once and one node-state update would be lost), so
``d > 0`` is refused there.

Fail closed as with ``d = 0``: a bad reply stops the run before anything is
computed from it; the messages already in flight were computed before it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from flwr.superlink.grid import InMemoryGrid

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.strategies.exchange import Pushed, collect, push
from tpsl_flwr.strategies.progress import EpochProgress
from tpsl_flwr.strategies.step_state import StepState

__all__ = ["NOT_ON_RAY", "Aggregate", "Configure", "check_pipeline_grid", "train_steps"]

Configure = Callable[[int, ArrayRecord, ConfigRecord, Grid], Iterable[Message]]
"""A strategy's ``configure_train``: the train messages of one round."""
Aggregate = Callable[[int, Iterable[Message]], Any]
"""A strategy's ``aggregate_train``: one round's replies, taken in."""

NOT_ON_RAY = (
    "pipeline-depth {depth} needs nodes that run their messages one at a time, "
    "in order (a Flower deployment, or the in-process engine); Flower's Ray "
    "simulation may run two of a node's messages at once and lose a state "
    "update: use pipeline-depth = 0 there"
)
"""The refusal of ``pipeline-depth > 0`` on Flower's simulation engine."""


@dataclass(frozen=True)
class _InFlight:
    server_round: int
    batches: list[np.ndarray]
    pushed: Pushed


def check_pipeline_grid(grid: Grid, depth: int) -> None:
    """Refuse ``depth > 0`` on a grid that may run a node's messages at once.

    Raises
    ------
    ConfigError
        For ``depth > 0`` on Flower's simulation grid (``InMemoryGrid``).
    """
    if depth > 0 and isinstance(grid, InMemoryGrid):
        raise ConfigError(NOT_ON_RAY.format(depth=depth))


def train_steps(
    state: StepState,
    grid: Grid,
    server_round: int,
    timeout: float,
    *,
    depth: int,
    poll_interval: float,
    epochs: int,
    configure: Configure,
    aggregate: Aggregate,
) -> int:
    """Send the epoch's train messages, keep up to ``depth + 1`` in flight.

    Each message comes from ``configure`` (the strategy's ``configure_train``:
    it carries the gradients of ``state`` computed so far and not yet sent,
    then forgets them) and each reply, oldest first, goes to ``aggregate``
    (the strategy's ``aggregate_train``). Returns the last ``server_round``
    used; the gradients of the last reply stay pending for the test query.
    """
    check_pipeline_grid(grid, depth)
    queue: deque[_InFlight] = deque()
    total = sum(len(b) for b in state.batches)
    progress = EpochProgress(state.epoch, epochs, total)
    while state.cursor < len(state.batches) or queue:
        while len(queue) <= depth and (
            state.cursor < len(state.batches)
            or (state.pending and any(f.batches for f in queue))
        ):
            server_round += 1
            messages = configure(server_round, ArrayRecord(), ConfigRecord(), grid)
            sent = push(grid, messages)
            queue.append(_InFlight(server_round, state.in_flight, sent))
        oldest = queue.popleft()
        replies = collect(grid, oldest.pushed, timeout, poll_interval)
        state.in_flight = oldest.batches
        aggregate(oldest.server_round, replies)
        progress.update(state.samples)
    return server_round
