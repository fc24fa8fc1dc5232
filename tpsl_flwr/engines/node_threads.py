"""A thread per virtual node, so the in-process engine's nodes work at once.

In a deployment every non-label party is its own machine: while one node runs
its backward pass and optimizer step, the others run theirs. The in-process
engine calls the nodes one after another by default, so a step costs the *sum*
of the nodes' times where a deployment pays their *maximum*. With
``InProcessGrid(concurrent_nodes=True)`` each node gets one worker thread of
its own (:class:`NodeThreads`): messages to one node still run one at a time
and in the order they were pushed (Flower keeps one outstanding message per
node in TPSL's protocol anyway), messages to different nodes run side by side.
torch releases the GIL inside its kernels, so the nodes' forward, backward and
Adam steps use as many cores as there are nodes (each at the process's torch
thread count).

Nothing a node computes depends on another node's thread: a seeded run trains
bit for bit as with the nodes in sequence (``tests/engines/test_node_threads.py``).
Measured on 2 cores (``bench/README.md``, "Nodes side by side"): 1.2x the
samples/s of the Criteo DLRM split at one torch thread, but 0.84x on the small
default model, whose steps are mostly Python (the nodes' threads then wait for
the GIL). So it is an option, not the in-process default.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable, Iterable
from typing import TypeVar

from flwr.app import Message

__all__ = ["PULL_WAIT", "NodeThreads", "Replies"]

T = TypeVar("T")

PULL_WAIT = 0.1
"""Longest :meth:`Replies.ready` waits for a first reply of concurrent nodes."""


class NodeThreads:
    """One single-worker executor per node id, started on first use.

    Examples
    --------
    >>> threads = NodeThreads()
    >>> futures = [threads.submit(n, lambda x: 2 * x, n) for n in (1, 2, 3)]
    >>> sorted(f.result() for f in futures)
    [2, 4, 6]
    >>> threads.close()
    """

    def __init__(self) -> None:
        self._executors: dict[int, cf.ThreadPoolExecutor] = {}

    def submit(self, node_id: int, fn: Callable[..., T], *args: object) -> cf.Future[T]:
        """Run ``fn(*args)`` on ``node_id``'s thread, after its earlier work."""
        executor = self._executors.get(node_id)
        if executor is None:
            executor = cf.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"tpsl-node-{len(self._executors)}"
            )
            self._executors[node_id] = executor
        return executor.submit(fn, *args)

    @staticmethod
    def wait_any(futures: Iterable[cf.Future[T]], timeout: float) -> None:
        """Return once one of ``futures`` is done, or after ``timeout`` seconds."""
        pending = list(futures)
        if pending and not any(f.done() for f in pending):
            cf.wait(pending, timeout=timeout, return_when=cf.FIRST_COMPLETED)

    def close(self) -> None:
        """Let every node finish what it was given, then end the threads."""
        executors, self._executors = self._executors, {}
        for executor in executors.values():
            executor.shutdown(wait=True)


class Replies:
    """The replies to pushed messages, made at once or on each node's thread.

    Parameters
    ----------
    concurrent : bool
        ``False``: :meth:`start` runs the delivery now. ``True``: on the
        destination node's thread (:class:`NodeThreads`).
    """

    def __init__(self, concurrent: bool) -> None:
        self._threads = NodeThreads() if concurrent else None
        self._replies: dict[str, Message | cf.Future[Message]] = {}

    def start(
        self, message_id: str, node_id: int, deliver: Callable[[], Message]
    ) -> None:
        """Make the reply to ``message_id`` with ``deliver()``."""
        if self._threads is None:
            self._replies[message_id] = deliver()
        else:
            self._replies[message_id] = self._threads.submit(node_id, deliver)

    def ready(self, message_ids: Iterable[str], wait: float = PULL_WAIT) -> list[str]:
        """The ids among ``message_ids`` whose reply is made (unknown ids left out).

        With concurrent nodes and none ready, waits up to ``wait`` s for one.
        """
        known = [mid for mid in message_ids if mid in self._replies]
        futures = [r for mid in known if isinstance(r := self._replies[mid], cf.Future)]
        NodeThreads.wait_any(futures, wait)
        return [mid for mid in known if _done(self._replies[mid])]

    def wait_all(self, message_ids: Iterable[str]) -> None:
        """Return once the reply to every one of ``message_ids`` is made."""
        replies = [self._replies.get(mid) for mid in message_ids]
        cf.wait([r for r in replies if isinstance(r, cf.Future)])

    def take(self, message_id: str) -> Message:
        """The reply (forgotten here); what a delivery raised is raised here."""
        reply = self._replies.pop(message_id)
        return reply.result() if isinstance(reply, cf.Future) else reply

    def close(self) -> None:
        """End the nodes' threads once they finish their work (if any)."""
        if self._threads is not None:
            self._threads.close()


def _done(reply: Message | cf.Future[Message]) -> bool:
    return not isinstance(reply, cf.Future) or reply.done()
