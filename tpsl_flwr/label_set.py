"""What a label set *is*: its (record id, label) pairs, fingerprinted with a key.

The guarantee of one TPSL run is ``(eps, 0)``-DP per label (Yang et al.,
Theorem 4.2). A second run over the same labels is a second release, and the
two compose: the label party must recognise the same labels whatever path,
folder or split they come from. So a label set is identified by its content,
never by a path: an HMAC-SHA256, under a secret that never leaves the label
party, of its record ids and labels in record-id order. Keyed, so that the
fingerprint (which appears in the ledger and in error messages) cannot be
checked against guessed label vectors.

One row limit of the same file (``rows = 100000`` after ``rows = 0``) is a
subset of it: besides the whole set, the first ``2^j`` records
(``j >= MIN_PREFIX_BITS``) are fingerprinted too, and two sets that share a
prefix fingerprint share at least those ``2^j`` labelled records, so any two
row limits of one file of at least 64 rows each are linked. Two unrelated
tables share a prefix only if their first 64 (id, label) pairs are equal: for
real labels, the same labels, or by chance for very sparse labels (two tables
of 3% positives whose first 64 records are all negative, ~2% of such pairs),
where the ledger then counts one table's releases against the other: it errs
towards a larger total, never a smaller one. A label set of fewer than
:data:`MIN_RECORDS` records cannot be linked to its other row limits, and the
label party refuses to release one of a data file
(:func:`~tpsl_flwr.experiments.experiment.build_strategy`).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field

import numpy as np

from tpsl_flwr.compact_ints import chunks, is_strictly_increasing
from tpsl_flwr.errors import ConfigError

__all__ = ["MIN_PREFIX_BITS", "MIN_RECORDS", "LabelSet", "label_digest"]

MIN_PREFIX_BITS = 6
"""Prefixes of fewer than ``2^6`` records are not compared (too few to identify)."""
MIN_RECORDS = 1 << MIN_PREFIX_BITS
"""The fewest records whose label set is linked to its other row limits."""
_DOMAIN = b"tpsl-flwr label set v1"


def _canonical(ids: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The records in increasing id order, each array in its own dtype.

    Records already in id order (what the views and
    :meth:`~tpsl_flwr.noise_binding.LabelRecords.of_splits` give) are not
    sorted or copied: at the paper's 45M rows a sort's index and int64 copies
    would cost ~1.4 GB of temporaries. :func:`_digest` hashes int64 bytes
    whatever the held dtype, so the fingerprint does not depend on it.
    """
    record_ids = np.asarray(ids)
    values = np.asarray(labels)
    if record_ids.ndim != 1 or values.ndim != 1 or record_ids.size != values.size:
        raise ConfigError(
            f"a label set needs one label per record id, got ids of shape "
            f"{record_ids.shape} and labels of shape {values.shape}"
        )
    if record_ids.size == 0:
        raise ConfigError("a label set needs at least one record, got none")
    if not np.issubdtype(record_ids.dtype, np.integer) or record_ids.min() < 0:
        raise ConfigError(f"record ids must be integers >= 0, got {record_ids.dtype}")
    if is_strictly_increasing(record_ids):
        return record_ids, values
    order = np.argsort(record_ids, kind="stable")
    sorted_ids = record_ids[order]
    if not is_strictly_increasing(sorted_ids):
        raise ConfigError("record ids must be distinct in a label set")
    return sorted_ids, values[order]


def label_digest(key: bytes, ids: np.ndarray, labels: np.ndarray) -> bytes:
    """HMAC-SHA256 of the (id, label) pairs in record-id order under ``key``.

    Examples
    --------
    >>> a = label_digest(b"k", np.array([1, 0]), np.array([1, 0]))
    >>> a == label_digest(b"k", np.array([0, 1]), np.array([0, 1]))
    True
    >>> a == label_digest(b"k", np.array([0, 1]), np.array([1, 1]))
    False
    >>> a == label_digest(b"k", np.array([0, 1], np.int32), np.array([0, 1], np.int8))
    True
    """
    sorted_ids, values = _canonical(ids, labels)
    return _digest(key, sorted_ids, values)


def _digest(key: bytes, ids: np.ndarray, labels: np.ndarray) -> bytes:
    """HMAC of the count, then every id, then every label, as int64 bytes."""
    mac = hmac.new(key, _DOMAIN, hashlib.sha256)
    mac.update(len(ids).to_bytes(8, "little"))
    for column in (ids, labels):
        for part in chunks(len(column)):
            mac.update(np.ascontiguousarray(column[part], dtype="<i8").tobytes())
    return mac.digest()


@dataclass(frozen=True)
class LabelSet:
    """The identity of a label set under a ledger's secret.

    Attributes
    ----------
    fingerprint
        Keyed fingerprint of all (id, label) pairs (32 hex digits).
    rows
        Number of labelled records.
    prefixes
        ``{j: fingerprint of the first 2^j records}`` for
        ``MIN_PREFIX_BITS <= j`` and ``2^j < rows``.
    public
        Rehearsal data whose labels are public anyway (built-in synthetic or
        bundled tables): releases are recorded but never refused.
    """

    fingerprint: str
    rows: int
    prefixes: dict[int, str] = field(default_factory=dict)
    public: bool = False

    @classmethod
    def of(
        cls, ids: np.ndarray, labels: np.ndarray, *, secret: bytes, public: bool
    ) -> LabelSet:
        """Fingerprint ``labels`` (one per record id in ``ids``) under ``secret``.

        Examples
        --------
        >>> ids = np.arange(3000)
        >>> full = LabelSet.of(ids, ids % 2, secret=b"s", public=False)
        >>> head = LabelSet.of(ids[:2048], ids[:2048] % 2, secret=b"s", public=False)
        >>> full.overlaps(head), full.fingerprint == head.fingerprint
        (True, False)
        """
        sorted_ids, values = _canonical(ids, labels)
        prefixes = {}
        bits = MIN_PREFIX_BITS
        while (1 << bits) < sorted_ids.size:
            n = 1 << bits
            prefixes[bits] = _digest(secret, sorted_ids[:n], values[:n]).hex()[:32]
            bits += 1
        return cls(
            fingerprint=_digest(secret, sorted_ids, values).hex()[:32],
            rows=int(sorted_ids.size),
            prefixes=prefixes,
            public=bool(public),
        )

    def _all_prefixes(self) -> dict[int, str]:
        """Prefixes, the whole set included when its size is a power of two."""
        out = dict(self.prefixes)
        if self.rows >= 1 << MIN_PREFIX_BITS and self.rows & (self.rows - 1) == 0:
            out[self.rows.bit_length() - 1] = self.fingerprint
        return out

    def overlaps(self, other: LabelSet) -> bool:
        """Whether the two sets are equal or share a prefix of >= 64 records."""
        if self.fingerprint == other.fingerprint:
            return True
        mine, theirs = self._all_prefixes(), other._all_prefixes()
        return any(theirs.get(bits) == value for bits, value in mine.items())

    def to_dict(self) -> dict[str, object]:
        """JSON-ready (prefix keys as strings)."""
        return {
            "fingerprint": self.fingerprint,
            "rows": self.rows,
            "prefixes": {str(k): v for k, v in self.prefixes.items()},
            "public": self.public,
        }

    @classmethod
    def from_dict(cls, record: dict[str, object]) -> LabelSet:
        """Inverse of :meth:`to_dict`."""
        prefixes = record.get("prefixes") or {}
        if not isinstance(prefixes, dict):
            raise ValueError(f"prefixes must be a mapping, got {prefixes!r}")
        rows = record["rows"]
        if not isinstance(rows, int):
            raise ValueError(f"rows must be an int, got {rows!r}")
        return cls(
            fingerprint=str(record["fingerprint"]),
            rows=rows,
            prefixes={int(k): str(v) for k, v in prefixes.items()},
            public=bool(record.get("public", False)),
        )
