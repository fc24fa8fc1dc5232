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

Where ids are row numbers (Criteo, Avazu), a copy of the file shifted by a
row (``tail -n +2``, a header line, a duplicated or dropped first row) pairs
every id with another label, so neither the whole-set nor the prefix
fingerprints match. The label *sequence* is still the same, and content-
defined fingerprints recognise it, as MOSS recognises copied documents
(Schleimer, Wilkerson and Aiken, "Winnowing: local algorithms for document
fingerprinting", SIGMOD 2003): for each class at most
:data:`MAX_CLASS_SHARE` of the records, the gaps between its consecutive
records form a sequence that a shift leaves unchanged; every run of
:data:`SHINGLE_GAPS` gaps is hashed under the secret, and winnowing keeps
the minimum hash of every window of ``w`` consecutive runs (:func:`shingles`).
Two sets that share a run of ``w + SHINGLE_GAPS`` class records share at
least one kept hash; sets sharing :data:`MIN_SHARED` kept hashes are linked.
So are copies with a few rows dropped or added anywhere: a change breaks the
runs that cover it, the rest match. The window grows with the records so
that at most ~:data:`MAX_SHINGLES` hashes are kept a set; the false-match
rate, measured on unrelated label sets, is in docs/privacy.md.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field

import numpy as np

from tpsl_flwr._util.compact_ints import chunks, is_strictly_increasing
from tpsl_flwr.errors import ConfigError

__all__ = [
    "MIN_PREFIX_BITS",
    "MIN_RECORDS",
    "LabelSet",
    "label_digest",
    "shingles",
]

MIN_PREFIX_BITS = 6
"""Prefixes of fewer than ``2^6`` records are not compared (too few to identify)."""
MIN_RECORDS = 1 << MIN_PREFIX_BITS
"""The fewest records whose label set is linked to its other row limits."""
_DOMAIN = b"tpsl-flwr label set v1"
SHINGLE_GAPS = 32
"""Gaps between one class's records hashed together (>= 52 bits of content
for a class of at most 60% of the records, >= 64 bits at 50% or less)."""
MAX_CLASS_SHARE = 0.6
"""Classes above this share of the records give runs of too little content."""
SPARSE_GAPS = 14
"""Gaps per run, in addition, for a class of at most :data:`SPARSE_SHARE`
(>= 65 bits of content there): small files of rare positives get hashes."""
SPARSE_SHARE = 0.1
MAX_SHINGLES = 8192
"""About the most winnowed hashes kept per label set (the window grows)."""
MIN_WINDOW = 8
"""The smallest winnowing window, in runs of gaps."""
MIN_SHARED = 4
"""Kept hashes two label sets must share to be linked as one."""
_CHUNK_ROWS = 1 << 22
_NO_HASH = np.uint64(2**64 - 1)


def _canonical(ids: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The records in increasing id order, each array in its own dtype.

    Records already in id order (what the views and
    :meth:`~tpsl_flwr.release.binding.LabelRecords.of_splits` give) are not
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


def _shingle_keys(secret: bytes) -> np.ndarray:
    """``SHINGLE_GAPS + 2`` odd 64-bit coefficients derived from ``secret``."""
    raw = b"".join(
        hashlib.blake2b(
            _DOMAIN + b" shingles" + bytes([block]), key=secret, digest_size=64
        ).digest()
        for block in range(-(-(SHINGLE_GAPS + 2) // 8))
    )
    words = np.frombuffer(raw, dtype="<u8")
    return words[: SHINGLE_GAPS + 2] | np.uint64(1)


def _window_minima(hashes: np.ndarray, width: int) -> np.ndarray:
    """The minimum of every ``width`` consecutive hashes, in O(n).

    van Herk / Gil-Werman: prefix and suffix minima within blocks of
    ``width``; a window spans at most two blocks.

    Examples
    --------
    >>> _window_minima(np.array([5, 3, 4, 1, 2, 6], np.uint64), 2).tolist()
    [3, 3, 1, 1, 2]
    """
    size = hashes.size
    if size < width:
        return hashes[:0]
    pad = (-size) % width
    blocks = np.concatenate([hashes, np.full(pad, _NO_HASH)]).reshape(-1, width)
    prefix = np.minimum.accumulate(blocks, axis=1).ravel()
    suffix = np.minimum.accumulate(blocks[:, ::-1], axis=1)[:, ::-1].ravel()
    return np.minimum(suffix[: size - width + 1], prefix[width - 1 : size])


def shingles(labels: np.ndarray, secret: bytes) -> frozenset[str]:
    """Winnowed, keyed hashes of the label sequence, unchanged by a row shift.

    For each class of at most :data:`MAX_CLASS_SHARE` of the records: the
    gaps between its consecutive records, every run of
    :data:`SHINGLE_GAPS` gaps hashed (a keyed linear hash, then mixed), the
    window minima kept (winnowing), each kept hash keyed again with BLAKE2b
    (16 hex digits). Rows are read in chunks: memory does not grow with
    the records beyond one chunk's.

    Parameters
    ----------
    labels
        The labels in record order (integers >= 0).
    secret
        The ledger's secret.

    Examples
    --------
    >>> y = (np.random.default_rng(0).random(5000) < 0.3).astype(np.int8)
    >>> a, b = shingles(y, b"s"), shingles(y[1:], b"s")  # one row shifted
    >>> len(a) > 50, len(a & b) >= MIN_SHARED
    (True, True)
    >>> z = (np.random.default_rng(1).random(5000) < 0.3).astype(np.int8)
    >>> len(a & shingles(z, b"s"))
    0
    """
    values = np.asarray(labels)
    size = values.size
    if size == 0:
        return frozenset()
    counts = np.bincount(values.astype(np.int64, copy=False))
    streams = [
        (label, gaps)
        for label in range(counts.size)
        for gaps, share in (
            (SHINGLE_GAPS, MAX_CLASS_SHARE),
            (SPARSE_GAPS, SPARSE_SHARE),
        )
        if gaps < counts[label] <= share * size
    ]
    runs = sum(int(counts[label]) - gaps for label, gaps in streams)
    width = max(MIN_WINDOW, -(-2 * runs // MAX_SHINGLES))
    coefficients = _shingle_keys(secret)
    kept: set[int] = set()
    for label, gaps in streams:
        kept.update(_class_minima(values, label, gaps, width, coefficients))
    return frozenset(
        hashlib.blake2b(
            value.to_bytes(8, "little"), key=secret, digest_size=8
        ).hexdigest()
        for value in kept
    )


def _class_minima(
    values: np.ndarray,
    label: int,
    run_gaps: int,
    width: int,
    coefficients: np.ndarray,
) -> set[int]:
    """The winnowed hashes of one class's runs of ``run_gaps`` gaps, by chunk."""
    kept: set[int] = set()
    last = -1  # the class's last record seen, -1 before the first
    gaps = np.zeros(0, np.uint64)  # the last run_gaps - 1 gaps carried over
    hashes = np.zeros(0, np.uint64)  # the last width - 1 hashes carried over
    # No class in the tag: a copy with its classes renamed (0 <-> 1) is the
    # same labels, and its gap sequences hash the same.
    tag = np.uint64(run_gaps * int(coefficients[-2]) % 2**64)
    for start in range(0, values.size, _CHUNK_ROWS):
        where = np.flatnonzero(values[start : start + _CHUNK_ROWS] == label) + start
        if where.size == 0:
            continue
        new = np.diff(where, prepend=last).astype(np.uint64)
        new = new[1:] if last < 0 else new  # the first record has no gap
        last = int(where[-1])
        gaps = np.concatenate([gaps, new])
        count = gaps.size - run_gaps + 1
        if count <= 0:
            continue
        run_hash = np.full(count, tag, np.uint64)
        for j in range(run_gaps):
            run_hash += gaps[j : j + count] * coefficients[j]
        run_hash ^= run_hash >> np.uint64(31)
        run_hash *= coefficients[-1]
        run_hash ^= run_hash >> np.uint64(29)
        gaps = gaps[count:]
        hashes = np.concatenate([hashes, run_hash])
        kept.update(np.unique(_window_minima(hashes, width)).tolist())
        hashes = hashes[max(0, hashes.size - width + 1) :]
    return kept


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
    shingles
        The label sequence's winnowed hashes (:func:`shingles`).
    """

    fingerprint: str
    rows: int
    prefixes: dict[int, str] = field(default_factory=dict)
    public: bool = False
    shingles: frozenset[str] = field(default_factory=frozenset, repr=False)

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
            shingles=shingles(values, secret),
        )

    def all_prefixes(self) -> dict[int, str]:
        """Prefixes, the whole set included when its size is a power of two."""
        out = dict(self.prefixes)
        if self.rows >= 1 << MIN_PREFIX_BITS and self.rows & (self.rows - 1) == 0:
            out[self.rows.bit_length() - 1] = self.fingerprint
        return out

    def overlaps(self, other: LabelSet) -> bool:
        """Whether the two sets hold (some of) the same labels.

        Equal, sharing a prefix of >= 64 records, or sharing
        :data:`MIN_SHARED` winnowed hashes of their label sequences.
        """
        if self.fingerprint == other.fingerprint:
            return True
        mine, theirs = self.all_prefixes(), other.all_prefixes()
        if any(theirs.get(bits) == value for bits, value in mine.items()):
            return True
        return len(self.shingles & other.shingles) >= MIN_SHARED

    def to_dict(self) -> dict[str, object]:
        """JSON-ready (prefix keys as strings)."""
        return {
            "fingerprint": self.fingerprint,
            "rows": self.rows,
            "prefixes": {str(k): v for k, v in self.prefixes.items()},
            "public": self.public,
            "shingles": sorted(self.shingles),
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
            shingles=frozenset(str(v) for v in record.get("shingles") or ()),  # type: ignore[attr-defined]
        )
