"""Encode chunks in a small thread pool, results in order, memory bounded.

The CTR loaders spend their time in pyarrow's CSV parser and in numpy, both of
which release the GIL: while the calling thread parses the next chunk, a pool
of threads encodes the chunks before it, which puts every core to work.
:func:`ordered_map` holds at most a few items, so memory stays bounded by a few
chunks; results arrive in the order of the source, an exception is raised in
the consumer where the item it belongs to would have been, and closing the
consumer (a ``break``, an error) stops the pool and waits for it.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["ordered_map", "usable_cores"]

T = TypeVar("T")
R = TypeVar("R")


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where known)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def ordered_map(
    fn: Callable[[T], R],
    items: Iterable[T],
    workers: int,
    ahead: int | None = None,
    ahead_at_first: tuple[int, Callable[[], bool]] | None = None,
) -> Generator[R, None, None]:
    """Yield ``fn(item)`` for every item, in order, computed by a thread pool.

    Parameters
    ----------
    fn : callable
        Applied to each item in a worker thread.
    items : iterable
        The source, iterated in the consumer's thread; closed (if it can be)
        when this iterator is.
    workers : int
        Threads (at least 1).
    ahead : int, optional
        Items submitted ahead of the one consumed (default ``workers + 1``).
    ahead_at_first : (int, callable), optional
        ``(more, busy)``: up to ``more`` items instead of ``ahead`` while
        ``busy()`` is true (e.g. while the workers' code is still loading, so
        the source goes on being read meanwhile).

    Yields
    ------
    object
        ``fn(item)``, in the order of ``items``.

    Raises
    ------
    ValueError
        If ``workers`` or ``ahead`` is below 1.
    Exception
        What ``fn`` raised for the earliest failing item, or what the source
        raised, when its turn comes (after the results of the items before).

    Examples
    --------
    >>> list(ordered_map(lambda x: x * x, range(5), workers=2))
    [0, 1, 4, 9, 16]
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    ahead = workers + 1 if ahead is None else ahead
    if isinstance(ahead, bool) or not isinstance(ahead, int) or ahead < 1:
        raise ValueError(f"ahead must be an int >= 1, got {ahead!r}")
    pending: deque[Future[R]] = deque()
    source = iter(items)
    pool = ThreadPoolExecutor(workers, thread_name_prefix="ctr-encode")
    failure: Exception | None = None
    try:
        while True:
            try:
                item = next(source)
            except StopIteration:
                break
            except Exception as exc:  # the source failed past the items submitted:
                failure = exc  # their results come first, as they would in order
                break
            pending.append(pool.submit(fn, item))
            limit = ahead
            if ahead_at_first is not None and ahead_at_first[1]():
                limit = max(ahead, ahead_at_first[0])
            if len(pending) > limit:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
        if failure is not None:
            raise failure
    finally:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True)
        close = getattr(source, "close", None)
        if close is not None:
            close()
