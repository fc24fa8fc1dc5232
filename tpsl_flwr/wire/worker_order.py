"""A party worker runs each run's numbered messages in the order they were sent.

With several SuperNodes per party (``supernodes-per-party``,
:mod:`~tpsl_flwr.strategies.relays`) the label party numbers the party's
messages (:data:`~tpsl_flwr.wire.protocol.SEQUENCE`) and the SuperNodes'
per-message processes reach the worker in whatever order they start. A
message is run only once every lower number of its run has run; one that
arrives early is held, its sender waiting, until then.

Fail closed, for the whole run: a number that comes twice (or below the next
one due), or a message held longer than ``hold_s`` seconds for a predecessor
that never came (a SuperNode of the party forwarding elsewhere, or lost), ends
the run at this worker: that message, every message held for the run and
every later message of it are refused with the reason. Messages without a
number (the hello, and every message of a run with one SuperNode per party)
run as they arrive.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["HOLD_S", "InOrder"]

HOLD_S = 120.0
"""Seconds a message may wait for its predecessors (twice the default reply-timeout)."""

Item = TypeVar("Item")


@dataclass
class InOrder(Generic[Item]):
    """The next number due per run, and the messages that came early.

    Parameters
    ----------
    hold_s
        Longest wait of a held message, in seconds.

    Examples
    --------
    >>> order = InOrder()
    >>> order.arrive(7, 1, "b")  # early: held
    ([], [])
    >>> order.arrive(7, 0, "a")  # a, then the held b
    (['a', 'b'], [])
    >>> refused = order.arrive(7, 1, "b again")[1]
    >>> refused[0][1].split(";")[0]
    'message 1 of run 7 came again (message 2 is due)'
    >>> order.arrive(7, 2, "c")[1][0][0]  # the run has ended here
    'c'
    """

    hold_s: float = HOLD_S
    due: dict[int, int] = field(default_factory=dict)
    held: dict[tuple[int, int], tuple[float, Item]] = field(default_factory=dict)
    ended: dict[int, str] = field(default_factory=dict)

    @property
    def waiting(self) -> bool:
        """Whether any message is held."""
        return bool(self.held)

    def arrive(
        self, run: int, number: int, item: Item
    ) -> tuple[list[Item], list[tuple[Item, str]]]:
        """Message ``number`` of ``run`` arrived: what to run now, what to refuse.

        Returns
        -------
        tuple
            The items to run now, in order (this one and any held ones it
            unblocks; none if it is held), and ``(item, reason)`` of those
            refused.
        """
        if run in self.ended:
            return [], [(item, self.ended[run])]
        due = self.due.get(run, 0)
        if number < due or (run, number) in self.held:
            reason = (
                f"message {number} of run {run} came again (message {due} is due); "
                "a SuperNode repeated it or another party's message was routed "
                "here: the run ends at this worker"
            )
            return [], [(item, reason), *self._end(run, reason)]
        if number > due:
            self.held[(run, number)] = (time.monotonic(), item)
            return [], []
        ready = [item]
        due += 1
        while (run, due) in self.held:
            ready.append(self.held.pop((run, due))[1])
            due += 1
        self.due[run] = due
        return ready, []

    def expire(self, now: float | None = None) -> list[tuple[Item, str]]:
        """Refuse every held message of a run one of whose waited too long."""
        now = time.monotonic() if now is None else now
        refused: list[tuple[Item, str]] = []
        for (run, number), (since, _) in list(self.held.items()):
            if run in self.ended or now - since <= self.hold_s:
                continue
            reason = (
                f"message {number} of run {run} waited {self.hold_s:g} s for message "
                f"{self.due.get(run, 0)}, which never came: every SuperNode of this "
                "party must forward to this worker (one worker-socket per party); "
                "the run ends at this worker"
            )
            refused += self._end(run, reason)
        return refused

    def _end(self, run: int, reason: str) -> list[tuple[Item, str]]:
        """End ``run``: refuse its held messages and every later one."""
        self.ended[run] = reason
        mine = [key for key in self.held if key[0] == run]
        return [(self.held.pop(key)[1], reason) for key in sorted(mine)]
