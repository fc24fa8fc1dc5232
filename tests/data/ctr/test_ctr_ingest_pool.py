"""The CTR loader's encoding pool: order, errors and clean stops."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tpsl_flwr.data.ctr.pool import ordered_map, usable_cores


class _Boom(RuntimeError):
    pass


def _threads(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def test_ordered_map_keeps_order_with_uneven_work() -> None:
    # Prepare: later items finish first (earlier ones wait on an event)
    release = threading.Event()

    def work(i: int) -> int:
        if i == 0:
            release.wait(timeout=5)
        if i == 3:
            release.set()
        return i * i

    # Execute
    got = list(ordered_map(work, range(20), workers=4, ahead=5))
    # Assert
    assert got == [i * i for i in range(20)]
    assert not _threads("ctr-encode")


def test_ordered_map_raises_in_turn() -> None:
    # Prepare
    def work(i: int) -> int:
        if i == 4:
            raise _Boom(f"item {i}")
        return i

    # Execute
    got: list[int] = []
    with pytest.raises(_Boom, match="item 4"):
        for r in ordered_map(work, range(10), workers=2):
            got.append(r)
    # Assert: every result before the failing item came first
    assert got == [0, 1, 2, 3]
    assert not _threads("ctr-encode")


def test_ordered_map_defers_a_source_error_past_submitted_items() -> None:
    # Prepare: the source fails while items before it are still being worked on
    def source() -> Iterator[int]:
        yield from range(3)
        raise _Boom("truncated")

    # Execute
    got: list[int] = []
    with pytest.raises(_Boom, match="truncated"):
        for r in ordered_map(lambda x: x + 10, source(), workers=2, ahead=4):
            got.append(r)
    # Assert
    assert got == [10, 11, 12]


def test_ordered_map_break_closes_the_source() -> None:
    # Prepare
    closed = threading.Event()

    def source() -> Iterator[int]:
        try:
            yield from range(1000)
        finally:
            closed.set()

    # Execute
    it = ordered_map(lambda x: x, source(), workers=2)
    head = [next(it) for _ in range(2)]
    it.close()
    # Assert
    assert head == [0, 1]
    assert closed.is_set()
    assert not _threads("ctr-encode")


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_bad_sizes_name_the_value(bad: object) -> None:
    with pytest.raises(ValueError, match=f"workers must be an int >= 1, got {bad!r}"):
        next(ordered_map(str, [1], workers=bad))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"ahead must be an int >= 1, got {bad!r}"):
        next(ordered_map(str, [1], workers=1, ahead=bad))  # type: ignore[arg-type]


def test_usable_cores_is_positive() -> None:
    assert usable_cores() >= 1


def test_ordered_map_reads_further_ahead_while_busy() -> None:
    # Prepare: the workers block until released; count items read meanwhile
    release = threading.Event()
    read: list[int] = []

    def source() -> Iterator[int]:
        for i in range(40):
            read.append(i)
            yield i

    def work(i: int) -> int:
        release.wait(timeout=5)
        return i

    def first_result(busy: bool) -> int:
        read.clear()
        release.clear()
        mapped = ordered_map(
            work, source(), workers=2, ahead=3, ahead_at_first=(20, lambda: busy)
        )
        timer = threading.Timer(0.3, release.set)
        timer.start()
        try:
            next(mapped)
            return len(read)
        finally:
            mapped.close()
            timer.cancel()

    # Execute
    while_busy, after = first_result(True), first_result(False)
    # Assert: 20 + 1 items submitted before the first result while busy, else 3 + 1
    assert (while_busy, after) == (21, 4)
    assert not _threads("ctr-encode")
