"""Progress within an epoch: a log line every few seconds at the label party.

A 45M-row Criteo epoch runs for more than an hour; without a line between the
epoch's start and its end a run cannot be told from a hung one. The label
party logs ``samples done/total``, samples per second since the epoch began
and the time left at that rate, through Flower's logger, so the line shows on
every engine that runs the strategy (in-process, Flower's ServerApp on Ray or
on a deployment). It counts only samples: nothing about a label.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from logging import INFO

from flwr.common.logger import log

__all__ = ["PROGRESS_EVERY_S", "EpochProgress", "format_eta"]

PROGRESS_EVERY_S = 5.0
"""Seconds between two progress lines of an epoch."""


def format_eta(seconds: float) -> str:
    """``seconds`` as ``1h02m``, ``3m05s`` or ``12s``.

    Examples
    --------
    >>> format_eta(3725), format_eta(185.2), format_eta(12.4)
    ('1h02m', '3m05s', '12s')
    """
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class EpochProgress:
    """Log an epoch's progress at most every ``every_s`` seconds.

    Parameters
    ----------
    epoch, epochs
        The epoch (0-based) and the run's epoch count, for the line.
    total
        Training samples of the epoch.
    every_s
        Seconds between lines (the first comes ``every_s`` after the start).
    clock
        Monotonic clock in seconds (a parameter so tests need not wait).

    Examples
    --------
    >>> ticks = iter([0.0, 6.0])
    >>> p = EpochProgress(0, 2, 4096, every_s=5.0, clock=lambda: next(ticks))
    >>> p.update(1024)
    'epoch 1/2  1,024/4,096 samples (25.0%)  171 samples/s  ETA 18s'
    """

    def __init__(
        self,
        epoch: int,
        epochs: int,
        total: int,
        *,
        every_s: float = PROGRESS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.epoch, self.epochs, self.total = epoch, epochs, total
        self.every_s = every_s
        self.clock = clock
        self.started = clock()
        self.last = self.started

    def update(self, done: int) -> str | None:
        """Log a line if ``every_s`` passed since the last one; return it."""
        now = self.clock()
        if now - self.last < self.every_s or done >= self.total:
            return None
        self.last = now
        rate = done / max(now - self.started, 1e-9)
        eta = format_eta((self.total - done) / rate) if rate > 0 else "-"
        line = (
            f"epoch {self.epoch + 1}/{self.epochs}  {done:,}/{self.total:,} samples "
            f"({100 * done / self.total:.1f}%)  {rate:,.0f} samples/s  ETA {eta}"
        )
        log(INFO, line)
        return line
