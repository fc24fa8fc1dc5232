"""Tests of the Criteo/Avazu loaders, the hashing trick, the cache and the generator.

Every fixture file is generated in ``tmp_path`` (a few thousand rows): no real
Criteo or Avazu row is stored anywhere.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from tpsl_flwr.data import (
    DEFAULT_HASH_BUCKETS,
    DatasetSplit,
    binary_auc,
    hash_tokens,
    load_avazu,
    load_criteo,
    load_dataset,
    partition_columns,
    party_features,
)
from tpsl_flwr.data.ctr.formats import AVAZU_COLUMNS, CRITEO_CATEGORICAL, CRITEO_NUMERIC
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.models import BottomModel, TopModel
from tpsl_flwr.testing import write_avazu, write_criteo
from tpsl_flwr.testing.reference_hash import reference_hash

BUCKETS = 1000


def _criteo_line(label: str = "0", **fields: str) -> str:
    """One train.txt line: every count 1, every token 'deadbeef', then overrides."""
    values = {"label": label}
    values.update({c: "1" for c in CRITEO_NUMERIC})
    values.update({c: "deadbeef" for c in CRITEO_CATEGORICAL})
    values.update(fields)
    return "\t".join(values[c] for c in ("label", *CRITEO_NUMERIC, *CRITEO_CATEGORICAL))


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _load(path: Path, **kw: object) -> DatasetSplit:
    kw.setdefault("hash_buckets", BUCKETS)
    kw.setdefault("cache", False)
    return load_criteo(path, **kw)  # type: ignore[arg-type]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def criteo_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("criteo") / "train.txt"
    write_criteo(path, 3000, seed=1, positive_rate=0.2)
    return path


# ------------------------------------------------------------------- hashing


def test_hash_golden_values() -> None:
    # Prepare / Execute / Assert: fixed forever (changing them breaks caches and
    # every trained embedding table).
    assert hash_tokens(["68fd1e64", "", "05db9164", "a"], "C1", 1000).tolist() == [
        601,
        0,
        966,
        497,
    ]
    assert hash_tokens(["68fd1e64", "05db9164"], "C2", 2**15).tolist() == [10847, 7239]
    assert hash_tokens(["68fd1e64", "05db9164"], "C1", 2**15, seed=1).tolist() == [
        7241,
        12443,
    ]
    assert hash_tokens(["a99f214a"], "device_id", 2**15).tolist() == [21086]


def test_hash_matches_the_documented_formula() -> None:
    # Prepare: tokens of mixed lengths (variable-width path) and of one length
    rng = np.random.default_rng(0)
    mixed = [bytes(rng.integers(33, 127, size=rng.integers(0, 12))) for _ in range(300)]
    fixed = [f"{int(v):08x}".encode() for v in rng.integers(0, 2**32, size=300)]
    for tokens in (mixed, fixed):
        for column, buckets, seed in (("C7", 1000, 0), ("site_id", 2**20, 5)):
            # Execute
            got = hash_tokens(tokens, column, buckets, seed).tolist()
            # Assert
            assert got == [reference_hash(t, column, buckets, seed) for t in tokens]


# -------------------------------------------------------------- criteo loads


def test_criteo_schema_and_info(criteo_file: Path) -> None:
    # Execute
    s = _load(criteo_file)
    # Assert
    assert s.name == "criteo"
    assert s.train.numeric_names == CRITEO_NUMERIC
    assert s.train.categorical_names == CRITEO_CATEGORICAL
    assert s.train.cardinalities == (BUCKETS,) * 26
    assert s.info["rows"] == s.info["rows_read"] == 3000
    assert s.info["rows_skipped"] == 0
    assert s.info["train_rows"] + s.info["test_rows"] == 3000
    assert s.info["source"] == str(criteo_file)
    assert 0.15 < s.info["positive_rate"] < 0.25
    assert s.train.numeric.dtype == np.float32
    np.testing.assert_allclose(s.train.numeric.mean(axis=0), 0.0, atol=1e-4)
    assert s.train.categorical.dtype == np.int64


def test_encoding_matches_the_file_line_by_line(criteo_file: Path) -> None:
    # Prepare: parse the first 200 lines by hand
    lines = criteo_file.read_text().splitlines()[:200]
    fields = [line.split("\t") for line in lines]
    # Execute: a time split keeps file order (train = the first 80%)
    s = _load(criteo_file, rows=250, split="time")
    # Assert
    labels = [int(f[0]) for f in fields]
    assert s.train.labels[:200].tolist() == labels
    for j, col in enumerate(CRITEO_CATEGORICAL):
        tokens = [f[14 + j].encode() for f in fields]
        want = [reference_hash(t, col, BUCKETS) for t in tokens]
        assert s.train.categorical[:200, j].tolist() == want
    raw = np.array(
        [[int(v) if v else 0 for v in f[1:14]] for f in fields], dtype=np.float64
    )
    missing = np.array([[v == "" for v in f[1:14]] for f in fields])
    t = np.where(missing, 0.0, np.sign(raw) * np.log1p(np.abs(raw)))
    # standardized columns are an affine map of the transform: compare correlations
    for j in range(13):
        if t[:, j].std() > 0:
            r = np.corrcoef(t[:, j], s.train.numeric[:200, j])[0, 1]
            assert r > 0.9999


def test_missing_values(tmp_path: Path) -> None:
    # Prepare
    path = _write_lines(
        tmp_path / "train.txt",
        [
            _criteo_line("1", I1="", I2="-2", C1="", C26=""),
            _criteo_line("0", I1="4", I2="", C1="abcd1234"),
            _criteo_line("0", I1="", I2="0"),
            _criteo_line("1", I1="9", I2="3", C3=""),
        ],
    )
    # Execute
    s = _load(path, split="time", test_fraction=0.25)
    # Assert
    cat = s.train.categorical
    assert cat[0, 0] == 0 and cat[0, 25] == 0 and cat[2, 2] != 0
    assert cat[1, 0] == reference_hash(b"abcd1234", "C1", BUCKETS)
    assert cat[2, 0] == reference_hash(b"deadbeef", "C1", BUCKETS)
    # I1 missing on rows 0 and 2 -> the same transformed value (0) before scaling
    assert s.train.numeric[0, 0] == s.train.numeric[2, 0]
    # I2: -2 keeps its sign, missing and 0 both map to 0
    assert s.train.numeric[0, 1] < s.train.numeric[1, 1] == s.train.numeric[2, 1]


def test_missing_indicators(tmp_path: Path) -> None:
    # Prepare
    lines = [_criteo_line(str(i % 2), I1="" if i < 3 else "0", I2="") for i in range(8)]
    path = _write_lines(tmp_path / "train.txt", lines)
    # Execute
    s = _load(path, split="time", test_fraction=0.25, missing_indicators=True)
    # Assert
    names = s.train.numeric_names
    assert names[:13] == CRITEO_NUMERIC and names[13] == "I1_missing"
    assert len(names) == 26 and names[-1] == "I13_missing"
    i1_missing = s.train.numeric[:, 13]
    assert (i1_missing[:3] > i1_missing[3:].max()).all()
    assert s.train.numeric[0, 0] == s.train.numeric[3, 0]  # missing and 0 alike


def test_kaggle_variant_and_gzip_read_the_same_rows(tmp_path: Path) -> None:
    # Prepare: the same seed writes the same rows in three containers
    plain = write_criteo(tmp_path / "train.txt", 1500, seed=7).path
    kaggle = write_criteo(tmp_path / "train.csv", 1500, seed=7, kaggle=True).path
    packed = write_criteo(tmp_path / "train.txt.gz", 1500, seed=7).path
    assert kaggle.read_text().startswith("Id,Label,I1,")
    with gzip.open(packed, "rt") as f:
        assert f.readline().count("\t") == 39
    # Execute
    a, b, c = (_load(p) for p in (plain, kaggle, packed))
    # Assert
    assert (a.name, b.name, c.name) == ("criteo", "criteo-kaggle", "criteo")
    for other in (b, c):
        np.testing.assert_array_equal(a.train.categorical, other.train.categorical)
        np.testing.assert_array_equal(a.train.numeric, other.train.numeric)
        np.testing.assert_array_equal(a.test.labels, other.test.labels)


def test_rows_reads_the_first_rows(criteo_file: Path) -> None:
    # Execute
    head = _load(criteo_file, rows=500, split="time")
    full = _load(criteo_file, split="time")
    # Assert
    assert head.info["rows"] == 500 and len(head.train) == 400
    np.testing.assert_array_equal(head.train.categorical, full.train.categorical[:400])
    np.testing.assert_array_equal(head.train.labels, full.train.labels[:400])


def test_criteo_time_split_holds_out_the_last_rows(criteo_file: Path) -> None:
    # Execute
    s = _load(criteo_file, split="time", test_fraction=0.1)
    full = _load(criteo_file, split="time", test_fraction=0.5)
    # Assert
    assert (len(s.train), len(s.test)) == (2700, 300)
    np.testing.assert_array_equal(s.test.categorical, full.test.categorical[-300:])


def test_per_column_buckets(criteo_file: Path) -> None:
    # Execute
    s = _load(criteo_file, hash_buckets={"C9": 4, "C20": 2})
    # Assert
    cards = dict(zip(s.train.categorical_names, s.train.cardinalities, strict=True))
    assert (
        cards["C9"] == 4 and cards["C20"] == 2 and cards["C1"] == DEFAULT_HASH_BUCKETS
    )
    assert s.train.categorical[:, 19].max() <= 1


# --------------------------------------------------------------------- cache


def test_cache_hit_is_identical(tmp_path: Path) -> None:
    # Prepare (timing lives in bench/loader.py)
    path = write_criteo(tmp_path / "train.txt", 8000, seed=2).path
    cache = tmp_path / "cache"
    # Execute
    cold = load_criteo(path, hash_buckets=BUCKETS, cache_dir=cache)
    warm = load_criteo(path, hash_buckets=BUCKETS, cache_dir=cache)
    # Assert
    assert not cold.info["cache_hit"] and warm.info["cache_hit"]
    assert Path(warm.info["cache_path"]).parent == cache
    # the entry (labels.npy, meta.json's positive count) is its owner's alone
    entry = Path(warm.info["cache_path"])
    assert (entry / "labels.npy").exists()
    assert entry.stat().st_mode & 0o777 == 0o700
    assert {f.stat().st_mode & 0o777 for f in entry.iterdir()} == {0o600}
    for a, b in ((cold.train, warm.train), (cold.test, warm.test)):
        np.testing.assert_array_equal(a.numeric, b.numeric)
        np.testing.assert_array_equal(a.categorical, b.categorical)
        np.testing.assert_array_equal(a.labels, b.labels)


def test_cache_misses_on_new_parameters_or_a_changed_file(tmp_path: Path) -> None:
    # Prepare
    path = write_criteo(tmp_path / "train.txt", 600, seed=2).path
    load_criteo(path, hash_buckets=BUCKETS)  # default cache beside the file
    assert any((tmp_path / ".tpsl-cache").iterdir())
    # Execute / Assert
    assert load_criteo(path, hash_buckets=BUCKETS).info["cache_hit"]
    assert not load_criteo(path, hash_buckets=BUCKETS + 1).info["cache_hit"]
    assert not load_criteo(path, hash_buckets=BUCKETS, rows=100).info["cache_hit"]
    write_criteo(path, 600, seed=3)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    changed = load_criteo(path, hash_buckets=BUCKETS)
    assert not changed.info["cache_hit"]


# --------------------------------------------------------------------- avazu


def test_avazu_schema_and_time_split(tmp_path: Path) -> None:
    # Prepare
    path = write_avazu(tmp_path / "train.csv", 3000, seed=4, days=3).path
    assert path.read_text().splitlines()[0] == ",".join(AVAZU_COLUMNS)
    # Execute
    s = load_avazu(path, split="time", hash_buckets=BUCKETS, cache=False)
    r = load_avazu(path, hash_buckets=BUCKETS, cache=False)
    # Assert
    assert s.name == "avazu"
    assert s.train.numeric.shape == (len(s.train), 0)
    assert s.train.categorical_names == ("hour", *AVAZU_COLUMNS[3:])
    assert s.train.cardinalities[0] == 24
    assert s.info["rows"] == 3000
    assert len(s.test) == 1000  # the last of 3 evenly filled days
    # random split by record id: binomial(3000, 0.2) test rows
    assert abs(len(r.test) - 600) < 4 * np.sqrt(3000 * 0.2 * 0.8)
    hours = s.test.categorical[:, 0]
    assert hours.min() == 0 and hours.max() == 23


def test_avazu_gzip_and_single_day_time_split(tmp_path: Path) -> None:
    # Prepare
    path = write_avazu(tmp_path / "train.csv.gz", 800, seed=4, days=1).path
    # Execute / Assert
    s = load_avazu(path, hash_buckets=BUCKETS, cache=False)
    assert s.info["rows"] == 800
    with pytest.raises(ConfigError, match=r"cover 1 day\(s\) \(141021\.\.141021"):
        load_avazu(path, split="time", cache=False)


# -------------------------------------------------------------------- errors


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "train.txt"
    with pytest.raises(ConfigError, match=r"not found.*nope/train\.txt"):
        load_criteo(missing)
    with pytest.raises(ConfigError, match=r"not found.*nope/train\.txt"):
        load_avazu(missing)


def test_bad_integer_names_line_and_column(criteo_file: Path, tmp_path: Path) -> None:
    # Prepare: line 17, column I5 (field 6)
    lines = criteo_file.read_text().splitlines()[:40]
    f = lines[16].split("\t")
    f[5] = "abc"
    lines[16] = "\t".join(f)
    path = _write_lines(tmp_path / "train.txt", lines)
    # Execute / Assert
    with pytest.raises(
        ConfigError, match=r"line 17, column I5: 'abc' is not an integer"
    ):
        _load(path)


def test_bad_row_past_the_first_chunk(tmp_path: Path, monkeypatch) -> None:
    # Prepare: small chunks, so the bad line sits in a later chunk
    import tpsl_flwr.data.ctr.reader as reader

    monkeypatch.setattr(reader, "BLOCK_BYTES", 4096)
    lines = [_criteo_line(str(i % 2)) for i in range(400)]
    lines[333] = _criteo_line("0", C7="x" * 9, I13="1.5")
    path = _write_lines(tmp_path / "train.txt", lines)
    # Execute / Assert
    with pytest.raises(ConfigError, match=r"line 334, column I13: '1.5' is not an"):
        _load(path)


def test_wrong_field_count_names_the_line(tmp_path: Path) -> None:
    # Prepare
    lines = [_criteo_line(str(i % 2)) for i in range(30)]
    lines[8] = lines[8].rsplit("\t", 1)[0]
    path = _write_lines(tmp_path / "train.txt", lines)
    # Execute / Assert
    with pytest.raises(ConfigError, match=r"line 9: expected 40 tab-separated fields"):
        _load(path)


def test_earlier_bad_value_is_reported_before_a_later_short_row(
    tmp_path: Path,
) -> None:
    lines = [_criteo_line(str(i % 2)) for i in range(30)]
    lines[4] = _criteo_line("7")
    lines[20] = "1\t2"
    path = _write_lines(tmp_path / "train.txt", lines)
    with pytest.raises(ConfigError, match=r"line 5, column label: '7' is not 0 or 1"):
        _load(path)


def test_blank_line_and_csv_given_as_tsv(tmp_path: Path) -> None:
    lines = [_criteo_line(str(i % 2)) for i in range(10)]
    blank = _write_lines(tmp_path / "blank.txt", [*lines[:3], "", *lines[3:]])
    with pytest.raises(ConfigError, match=r"line 4"):
        _load(blank)
    comma = _write_lines(tmp_path / "comma.txt", [x.replace("\t", ",") for x in lines])
    with pytest.raises(ConfigError, match=r"line 1: expected 40 tab-separated.*got 1"):
        _load(comma)


def test_header_formats_count_the_header_line(tmp_path: Path) -> None:
    # Prepare: Avazu data row 5 is line 6; a bad hour
    path = write_avazu(tmp_path / "train.csv", 50, seed=0).path
    lines = path.read_text().splitlines()
    f = lines[5].split(",")
    f[2] = "14102199"
    lines[5] = ",".join(f)
    _write_lines(path, lines)
    # Execute / Assert
    with pytest.raises(ConfigError, match=r"line 6, column hour: '14102199' is not"):
        load_avazu(path, cache=False)
    kaggle = write_criteo(tmp_path / "k.csv", 50, seed=0, kaggle=True).path
    lines = kaggle.read_text().splitlines()
    lines[10] += ",extra"
    _write_lines(kaggle, lines)
    with pytest.raises(ConfigError, match=r"line 11: expected 41 ','-separated"):
        _load(kaggle)


def test_wrong_header_names_the_column(tmp_path: Path) -> None:
    path = write_avazu(tmp_path / "train.csv", 50, seed=0).path
    text = path.read_text().replace("id,click,hour,", "id,click,hr,", 1)
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"line 1, column 3: header says 'hr', exp"):
        load_avazu(path, cache=False)


def test_no_positives_and_no_rows(tmp_path: Path) -> None:
    zeros = _write_lines(tmp_path / "z.txt", [_criteo_line("0") for _ in range(20)])
    with pytest.raises(ConfigError, match="no positive labels in 20 rows"):
        _load(zeros)
    empty = tmp_path / "e.txt"
    empty.write_text("")
    with pytest.raises(ConfigError, match="no data rows"):
        _load(empty)


@pytest.mark.parametrize("rows", [0, -5, True, 2.5])
def test_rows_must_be_positive(criteo_file: Path, rows: object) -> None:
    with pytest.raises(ConfigError, match="rows must be a positive int"):
        _load(criteo_file, rows=rows)


def test_rows_stops_before_a_later_bad_row(tmp_path: Path) -> None:
    lines = [_criteo_line(str(i % 2)) for i in range(100)]
    lines[60] = "0\t1"
    lines[70] = _criteo_line("0", I3="?")
    path = _write_lines(tmp_path / "train.txt", lines)
    assert _load(path, rows=60).info["rows"] == 60
    with pytest.raises(ConfigError, match="line 61: expected 40"):
        _load(path, rows=61)


def test_truncated_gzip(tmp_path: Path) -> None:
    path = write_criteo(tmp_path / "train.txt.gz", 3000, seed=0).path
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ConfigError, match="cannot read as criteo"):
        _load(cut)


def test_skip_mode_counts_bad_rows(tmp_path: Path) -> None:
    lines = [_criteo_line(str(i % 2)) for i in range(50)]
    lines[3] = _criteo_line("1", I4="x")
    lines[10] = "0\t1"
    path = _write_lines(tmp_path / "train.txt", lines)
    s = _load(path, on_bad_rows="skip")
    assert (s.info["rows"], s.info["rows_read"], s.info["rows_skipped"]) == (48, 50, 2)


# ------------------------------------------------------------------ registry


def test_load_dataset_reads_files(criteo_file: Path, tmp_path: Path) -> None:
    # Execute
    s = load_dataset(
        "criteo", data_path=str(criteo_file), hash_buckets=64, cache_dir=tmp_path
    )
    a = load_dataset("avazu", data_path=write_avazu(tmp_path / "a.csv", 300).path)
    # Assert
    assert s.name == "criteo" and s.train.cardinalities == (64,) * 26
    assert s.info["seed"] == 0 and s.info["cache_hit"] is False
    assert a.name == "avazu" and a.info["rows"] == 300
    with pytest.raises(ConfigError, match="give data_path"):
        load_dataset("criteo")
    with pytest.raises(ConfigError, match="data_path applies only to"):
        load_dataset("breast-cancer", data_path=str(criteo_file))
    with pytest.raises(ConfigError, match="split='time' applies only to"):
        load_dataset("digits", split="time")


# -------------------------------------------------------------- it trains


def test_split_model_learns_generated_criteo(tmp_path: Path) -> None:
    # Prepare: two parties by column name (counts | tokens), as partition_columns does
    path = write_criteo(tmp_path / "train.txt", 4000, seed=5, positive_rate=0.2).path
    s = load_dataset("criteo", data_path=path, hash_buckets=256, seed=0)
    parts = partition_columns(
        s.train.numeric_names,
        s.train.categorical_names,
        2,
        assignment={
            **dict.fromkeys(CRITEO_NUMERIC, 0),
            **dict.fromkeys(CRITEO_CATEGORICAL, 1),
        },
    )
    g = torch.Generator().manual_seed(0)
    tr = [party_features(s.train, p) for p in parts]
    te = [party_features(s.test, p) for p in parts]
    bottoms = [
        BottomModel(len(x.numeric_names), x.cardinalities, 4, (16,), 8, generator=g)
        for x in tr
    ]
    top = TopModel(16, (16,), 1, generator=g)
    params = [p for m in (*bottoms, top) for p in m.parameters()]
    y = torch.tensor(s.train.labels, dtype=torch.float32)

    def logits(xs: list, idx: np.ndarray | slice) -> torch.Tensor:
        emb = [
            f(torch.from_numpy(x.numeric[idx]), torch.from_numpy(x.categorical[idx]))
            for f, x in zip(bottoms, xs, strict=True)
        ]
        return top(torch.cat(emb, dim=1)).squeeze(1)

    # Execute: plain SGD by hand (torch.optim imports torch._dynamo: seconds)
    rng = np.random.default_rng(0)
    for _ in range(4):
        for idx in np.array_split(rng.permutation(len(y)), len(y) // 128):
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                logits(tr, idx), y[idx]
            )
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, grad in zip(params, grads, strict=True):
                    p -= 1.0 * grad
    with torch.no_grad():
        scores = logits(te, slice(None)).numpy()
    # Assert
    assert binary_auc(s.test.labels, scores) > 0.65
