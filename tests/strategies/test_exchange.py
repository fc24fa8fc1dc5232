"""The strategy's round trip: push, then poll quickly with a capped backoff."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.strategies import exchange as exchange_module
from tpsl_flwr.strategies.exchange import exchange


class SlowGrid:
    """Replies become available only after ``ready_after`` pulls."""

    def __init__(self, count: int, ready_after: int) -> None:
        self.count = count
        self.ready_after = ready_after
        self.pulls = 0

    def push_messages(self, messages: object) -> list[str]:
        return [f"m{i}" for i in range(self.count)]

    def pull_messages(self, ids: set[str]) -> list[SimpleNamespace]:
        self.pulls += 1
        if self.pulls < self.ready_after:
            return []
        return [
            SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i))
            for i in ids
        ]


def test_replies_are_polled_with_a_doubling_capped_interval(monkeypatch) -> None:
    # Prepare: record the sleeps instead of sleeping
    sleeps: list[float] = []
    monkeypatch.setattr(exchange_module.time, "sleep", sleeps.append)
    grid = SlowGrid(count=3, ready_after=8)

    # Execute
    replies = exchange(grid, [], timeout=None, max_interval=0.01)  # type: ignore[arg-type]

    # Assert: all replies, one pull after each sleep, 1, 2, 4, 8 ms then the cap
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1", "m2"]
    assert grid.pulls == 8
    assert sleeps == pytest.approx([0.001, 0.002, 0.004, 0.008, 0.01, 0.01, 0.01])


def test_replies_ready_at_once_cost_no_sleep(monkeypatch) -> None:
    # Prepare
    sleeps: list[float] = []
    monkeypatch.setattr(exchange_module.time, "sleep", sleeps.append)

    # Execute
    replies = exchange(SlowGrid(2, ready_after=1), [], timeout=5)  # type: ignore[arg-type]

    # Assert
    assert len(replies) == 2 and sleeps == []


def test_missing_replies_are_left_out_when_the_timeout_passes() -> None:
    # Prepare: a grid that never answers
    grid = SlowGrid(count=2, ready_after=10**9)

    # Execute
    replies = exchange(grid, [], timeout=0.05)  # type: ignore[arg-type]

    # Assert: the caller gets what arrived (nothing) and decides, as with Flower
    assert replies == [] and grid.pulls >= 2


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "0.1"])
def test_bad_poll_intervals_are_refused_by_value(bad: object) -> None:
    # Execute / Assert
    with pytest.raises(ConfigError, match=f"max_interval must be .*got '?{bad}"):
        exchange(SlowGrid(1, 1), [], timeout=1, max_interval=bad)  # type: ignore[arg-type]
