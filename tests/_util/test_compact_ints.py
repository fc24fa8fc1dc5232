"""Compact per-row arrays: same values, same fingerprints, across chunk boundaries.

Ids are held as int32 and labels as int8 (:mod:`tpsl_flwr._util.compact_ints`), and
the one-off passes over every row run in ``CHUNK_ROWS`` chunks. Every result
must equal the plain whole-array computation in int64, in particular the keyed
label-set fingerprint: were it to change with the held dtype, the privacy ledger
would take the same labels for a new label set and allow a second release.
"""

from __future__ import annotations

import hashlib
import hmac

import numpy as np
import pytest

from tpsl_flwr._util.compact_ints import (
    CHUNK_ROWS,
    compact_ids,
    index_dtype,
    is_strictly_increasing,
    label_dtype,
    true_positions,
)
from tpsl_flwr.data.view_records import _intersect, id_space_fingerprint
from tpsl_flwr.release.binding import LabelRecords
from tpsl_flwr.release.label_set import _DOMAIN, LabelSet, label_digest

ROWS = CHUNK_ROWS * 2 + 17  # three chunks, the last one short
KEY = b"k" * 32


def test_true_positions_equal_flatnonzero_across_chunks():
    mask = np.random.default_rng(0).random(ROWS) < 0.3
    out = true_positions(mask)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, np.flatnonzero(mask))
    assert true_positions(np.zeros(0, dtype=bool)).size == 0


@pytest.mark.parametrize("at", [1, CHUNK_ROWS - 1, CHUNK_ROWS, ROWS - 1])
def test_is_strictly_increasing_sees_a_tie_anywhere(at):
    values = np.arange(ROWS, dtype=np.int32)
    assert is_strictly_increasing(values)
    values[at] = values[at - 1]
    assert not is_strictly_increasing(values)
    values[at] = values[at - 1] - 1
    assert not is_strictly_increasing(values)


def test_is_strictly_increasing_on_short_arrays():
    assert is_strictly_increasing(np.zeros(0, dtype=np.int64))
    assert is_strictly_increasing(np.array([7]))


def test_compact_ids_narrow_only_what_fits():
    small = compact_ids(np.array([0, 2**31 - 1]))
    assert small.dtype == np.int32 and not small.flags.writeable
    assert small.tolist() == [0, 2**31 - 1]
    for values in ([0, 2**31], [-(2**31) - 1, 5]):
        out = compact_ids(np.array(values, dtype=np.int64))
        assert out.dtype == np.int64 and out.tolist() == values
    assert index_dtype(2**31 - 1, -(2**31)) == np.int32


def test_label_dtype_boundaries():
    assert label_dtype(128) == np.int8
    assert label_dtype(129) == np.int16
    assert label_dtype(2**15 + 1) == np.int32


def test_label_fingerprint_does_not_depend_on_the_held_dtype():
    rng = np.random.default_rng(1)
    ids = np.sort(rng.choice(3 * ROWS, size=ROWS, replace=False))
    labels = rng.integers(0, 2, size=ROWS)
    wide = label_digest(KEY, ids.astype(np.int64), labels.astype(np.int64))
    narrow = label_digest(KEY, ids.astype(np.int32), labels.astype(np.int8))
    assert wide == narrow
    shuffle = rng.permutation(ROWS)
    assert label_digest(KEY, ids[shuffle], labels[shuffle]) == wide
    flipped = labels.copy()
    flipped[CHUNK_ROWS] ^= 1  # the first row of the second chunk
    assert label_digest(KEY, ids, flipped) != wide
    # the ledgers' records: the whole-array int64 HMAC of earlier versions
    mac = hmac.new(KEY, _DOMAIN, hashlib.sha256)
    mac.update(ROWS.to_bytes(8, "little"))
    mac.update(ids.astype("<i8").tobytes() + labels.astype("<i8").tobytes())
    assert wide == mac.digest()
    held = LabelSet.of(ids.astype(np.int32), labels.astype(np.int8), secret=KEY,
                       public=False)  # fmt: skip
    assert held == LabelSet.of(ids, labels, secret=KEY, public=False)


def test_id_space_fingerprint_is_the_whole_array_hash():
    rng = np.random.default_rng(2)
    ids = np.sort(rng.choice(3 * ROWS, size=ROWS, replace=False))
    train, test = ids[::3], np.setdiff1d(ids, ids[::3])
    want = hashlib.sha256(b"tpsl-id-space-v1")
    for part in (train, test):
        want.update(len(part).to_bytes(8, "little"))
        want.update(part.astype("<i8").tobytes())
    got = id_space_fingerprint(train.astype(np.int32), test.astype(np.int32))
    assert got == want.hexdigest()


def test_records_of_splits_merge_in_id_order():
    rng = np.random.default_rng(3)
    ids = rng.choice(10 * ROWS, size=ROWS, replace=False)
    labels = rng.integers(0, 2, size=ROWS).astype(np.int8)
    is_test = rng.random(ROWS) < 0.2
    split = [np.argsort(ids[~is_test]), np.argsort(ids[is_test])]
    train_ids, test_ids = ids[~is_test][split[0]], ids[is_test][split[1]]
    train_labels, test_labels = labels[~is_test][split[0]], labels[is_test][split[1]]
    merged = LabelRecords.of_splits(
        train_ids.astype(np.int32), train_labels, test_ids.astype(np.int32), test_labels
    )
    order = np.argsort(ids)
    np.testing.assert_array_equal(merged.ids, ids[order])
    np.testing.assert_array_equal(merged.labels, labels[order])
    assert merged.ids.dtype == np.int32 and merged.labels.dtype == np.int8


def test_intersect_equals_intersect1d():
    rng = np.random.default_rng(4)
    ids = np.sort(rng.choice(4 * ROWS, size=ROWS, replace=False)).astype(np.int32)
    train, test = ids[::2], ids[1::2]
    assert not _intersect(train, test)
    for shared in (test[0], test[CHUNK_ROWS // 2 + 3], test[-1]):
        with_one = np.sort(np.append(train, shared))
        assert _intersect(with_one, test)
        assert np.intersect1d(with_one, test).tolist() == [shared]
    assert not _intersect(train[:0], test)
