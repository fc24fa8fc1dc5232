"""A uniform sample of an epoch's batches, of bounded size (reservoir sampling).

The transcript audit (:mod:`~tpsl_flwr.attacks.transcript_audit`) scores what
left the label party. Keeping every batch of an epoch costs memory in
proportion to the rows (about 6.7 KB per row on Criteo's 39 columns), so the
audit keeps a fixed-size uniform sample of the epoch's *batches* instead:
Vitter's Algorithm R (J. S. Vitter, "Random sampling with a reservoir", ACM
TOMS 11(1), 1985) over batches, with ``slots = max(1, capacity_rows //
batch_size)`` slots fixed by the first batch. Whole batches are kept, so the
per-batch attacks still see real batches, and the pooled AUCs are computed on
the sampled rows; their standard errors (Hanley-McNeil over the sampled
positives and negatives) state the sampling error. Batches are formed by a
label-independent shuffle, so a sample of batches is a sample of rows.

Which batches are kept depends only on the step count and a public seed,
never on a label. When the epoch has no more batches than slots, every batch
is kept, in order: the report is then exactly the full-transcript report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from tpsl_flwr._util.checks import check_int

__all__ = ["DEFAULT_AUDIT_ROWS", "BatchReservoir"]

DEFAULT_AUDIT_ROWS = 65_536
"""Rows of an epoch's transcript the audit keeps and scores, at most."""

T = TypeVar("T")


@dataclass
class BatchReservoir(Generic[T]):
    """Algorithm R over batches: a uniform sample of at most ``capacity_rows``.

    Parameters
    ----------
    capacity_rows
        Rows the sample may hold; the slot count is ``capacity_rows //
        batch_size`` of the first batch offered (at least one).
    seed
        Seed of the sampling (public: the choice never depends on a label).

    Examples
    --------
    >>> r = BatchReservoir(capacity_rows=4)
    >>> [r.offer(2) for _ in range(2)], r.complete
    ([0, 1], True)
    >>> slots = [r.offer(2) for _ in range(100)]
    >>> r.seen_batches, r.complete, len(r.items())
    (102, False, 0)
    """

    capacity_rows: int
    seed: int = 0
    seen_batches: int = 0
    seen_rows: int = 0
    slots: int | None = None
    _steps: list[int] = field(default_factory=list)
    _items: list[T | None] = field(default_factory=list)
    _rng: np.random.Generator | None = None

    def __post_init__(self) -> None:
        check_int(self.capacity_rows, "capacity_rows")
        self._rng = np.random.default_rng([int(self.seed), 0x7E5E])

    def offer(self, rows: int) -> int | None:
        """Count a batch of ``rows`` rows; the slot to store it in, or None.

        Call :meth:`put` with the returned slot to store the batch's record.
        """
        assert self._rng is not None
        step = self.seen_batches
        self.seen_batches += 1
        self.seen_rows += int(rows)
        if self.slots is None:
            self.slots = max(1, self.capacity_rows // max(1, int(rows)))
        if step < self.slots:
            self._steps.append(step)
            self._items.append(None)
            return step
        slot = int(self._rng.integers(0, step + 1))
        if slot >= self.slots:
            return None
        self._steps[slot] = step
        self._items[slot] = None
        return slot

    def put(self, slot: int, item: T) -> None:
        """Store the record of the batch :meth:`offer` gave ``slot``."""
        self._items[slot] = item

    @property
    def complete(self) -> bool:
        """Whether every batch offered is in the sample."""
        return self.seen_batches == len(self._steps)

    def items(self) -> list[T]:
        """The stored records, in the order their batches were offered."""
        order = np.argsort(self._steps, kind="stable")
        return [item for i in order if (item := self._items[int(i)]) is not None]
