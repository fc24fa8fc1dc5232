"""A cold ingest writes the same cache bytes, and the same errors, as a plain read.

Chunks are parsed ahead in a thread and encoded in a pool; these tests pin what
that must not change: the bytes of every ``.npy`` file of a cache entry (checked
against a reference implementation written out here, line by line), the line
and column an error names when problems sit in different chunks, and the rows
counted as skipped when a row limit stops the read early.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import tpsl_flwr.data.ctr.files as files
import tpsl_flwr.data.ctr.reader as reader
from tpsl_flwr.data import load_criteo
from tpsl_flwr.data.ctr.formats import CRITEO_CATEGORICAL, CRITEO_NUMERIC
from tpsl_flwr.data.ctr.gather import gather_rows
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.testing import write_criteo
from tpsl_flwr.testing.reference_hash import reference_hash

BUCKETS = 2**15


def _npy(array: np.ndarray) -> bytes:
    """The cache's ``.npy`` layout: a 128-byte version 1.0 header, then the data."""
    text = repr(
        {
            "descr": np.lib.format.dtype_to_descr(array.dtype),
            "fortran_order": False,
            "shape": array.shape,
        }
    ).encode("latin1")
    return (
        b"\x93NUMPY\x01\x00"
        + struct.pack("<H", 118)
        + text.ljust(117)
        + b"\n"
        + np.ascontiguousarray(array).tobytes()
    )


def _reference_entry(path: Path) -> dict[str, bytes]:
    """The cache files of a Criteo ``train.txt``, computed line by line."""
    rows = [line.split(b"\t") for line in path.read_bytes().splitlines()]
    labels = np.array([int(r[0]) for r in rows], dtype=np.int8)
    raw = np.array([[int(v) if v else 0 for v in r[1:14]] for r in rows], np.int64)
    missing = np.array([[not v for v in r[1:14]] for r in rows])
    numeric = np.empty(raw.shape, dtype=np.float32)
    for j in range(raw.shape[1]):
        x = raw[:, j].astype(np.float64)
        t = np.sign(x) * np.log1p(np.abs(x))
        t[missing[:, j]] = 0.0
        numeric[:, j] = t.astype(np.float32)
    categorical = np.array(
        [
            [
                reference_hash(r[14 + j], c, BUCKETS)
                for j, c in enumerate(CRITEO_CATEGORICAL)
            ]
            for r in rows
        ],
        dtype=np.int32,
    )
    return {
        "labels.npy": _npy(labels),
        "numeric.npy": _npy(numeric),
        "categorical.npy": _npy(categorical),
    }


def _entry_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.npy"))}


def _line(label: str = "0", **fields: str) -> str:
    values = {"label": label, **dict.fromkeys(CRITEO_NUMERIC, "1")}
    values.update(dict.fromkeys(CRITEO_CATEGORICAL, "deadbeef"))
    values.update(fields)
    return "\t".join(values[c] for c in ("label", *CRITEO_NUMERIC, *CRITEO_CATEGORICAL))


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """4 KiB chunks (about 15 lines): every file spans many chunks and threads."""
    monkeypatch.setattr(reader, "BLOCK_BYTES", 4096)


@pytest.mark.usefixtures("small_chunks")
def test_cache_bytes_equal_a_line_by_line_reference(tmp_path: Path) -> None:
    # Prepare: a generated file (missing counts and tokens, negative counts)
    path = write_criteo(tmp_path / "train.txt", 1500, seed=3).path
    # Execute
    split = load_criteo(path, hash_buckets=BUCKETS, cache_dir=tmp_path / "cache")
    # Assert: every array file byte for byte, header included
    got = _entry_bytes(Path(str(split.info["cache_path"])))
    want = _reference_entry(path)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name
    assert got["labels.npy"].startswith(
        b"\x93NUMPY\x01\x00v\x00{'descr': '|i1', 'fortran_order': False, "
        b"'shape': (1500,)}"
    )


@pytest.mark.usefixtures("small_chunks")
def test_one_encoder_thread_writes_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare
    path = write_criteo(tmp_path / "train.txt", 1200, seed=4).path
    many = load_criteo(path, hash_buckets=BUCKETS, cache_dir=tmp_path / "many")
    monkeypatch.setattr(files, "ENCODE_THREADS", 1)
    # Execute
    one = load_criteo(path, hash_buckets=BUCKETS, cache_dir=tmp_path / "one")
    # Assert
    assert _entry_bytes(Path(str(one.info["cache_path"]))) == _entry_bytes(
        Path(str(many.info["cache_path"]))
    )


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize(
    ("field_line", "short_line", "message"),
    [
        (40, 70, r"line 40, column I3: '\?' is not an integer"),
        (70, 40, r"line 40: expected 40 tab-separated fields"),
    ],
)
def test_earliest_problem_across_chunks_is_reported(
    tmp_path: Path, field_line: int, short_line: int, message: str
) -> None:
    # Prepare: a bad value and a short row in different chunks
    lines = [_line(str(i % 2)) for i in range(200)]
    lines[field_line - 1] = _line("0", I3="?")
    lines[short_line - 1] = "0\t1"
    path = tmp_path / "train.txt"
    path.write_text("\n".join(lines) + "\n")
    # Execute / Assert
    with pytest.raises(ConfigError, match=message):
        load_criteo(path, hash_buckets=BUCKETS, cache=False)


@pytest.mark.usefixtures("small_chunks")
def test_row_limit_ignores_rows_skipped_in_chunks_read_ahead(tmp_path: Path) -> None:
    # Prepare: a short row far past the rows asked for (in a chunk read ahead)
    lines = [_line(str(i % 2)) for i in range(300)]
    lines[150] = "0\t1"
    path = tmp_path / "train.txt"
    path.write_text("\n".join(lines) + "\n")
    # Execute
    split = load_criteo(
        path, rows=20, hash_buckets=BUCKETS, cache=False, on_bad_rows="skip"
    )
    everything = load_criteo(
        path, hash_buckets=BUCKETS, cache=False, on_bad_rows="skip"
    )
    # Assert
    assert (split.info["rows"], split.info["rows_skipped"]) == (20, 0)
    assert (everything.info["rows"], everything.info["rows_skipped"]) == (299, 1)


@pytest.mark.parametrize("mapped", [False, True])
def test_gather_rows_equals_fancy_index_then_cast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mapped: bool
) -> None:
    # Prepare: blocks smaller than the selection; a table in memory or mapped
    import tpsl_flwr.data.ctr.gather as gather

    monkeypatch.setattr(gather, "GATHER_ROWS", 7)
    rng = np.random.default_rng(0)
    table = rng.integers(-(2**31), 2**31 - 1, size=(100, 3), dtype=np.int32)
    if mapped:
        np.save(tmp_path / "t.npy", table)
        table = np.load(tmp_path / "t.npy", mmap_mode="r")
    increasing = np.sort(rng.permutation(100)[:45])
    shuffled = rng.permutation(100)[:45]
    for rows in (increasing, shuffled, np.array([0, 99]), np.arange(100)):
        # Execute
        got = gather_rows(table, rows, np.int64)
        col = gather_rows(table[:, 1], rows, np.float64)  # a view: no file read
        # Assert
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, np.asarray(table)[rows].astype(np.int64))
        np.testing.assert_array_equal(col, np.asarray(table)[rows, 1])
    assert gather_rows(table, increasing[:0], np.int64).shape == (0, 3)
