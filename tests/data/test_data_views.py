"""Tests of the label-free party views, the label view and id-based membership.

Every Criteo/Avazu file is generated in ``tmp_path`` (a few hundred rows).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from tpsl_flwr.data import (
    DatasetSplit,
    DataSpec,
    LabelView,
    PartyView,
    dataset_columns,
    hash_is_test,
    hash_uniform,
    id_space_fingerprint,
    load_dataset,
    load_label_view,
    load_party_view,
    make_synthetic_ctr,
    make_synthetic_features,
    partition_columns,
)
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.testing import write_avazu, write_criteo

_M = (1 << 64) - 1


def _ref_uniform(record_id: int, seed: int) -> float:
    """The documented membership hash in plain Python integers."""

    def mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M
        return z ^ (z >> 31)

    key = mix((seed * 0x9E3779B97F4A7C15 + 0x7470736C2D73706C) & _M)
    return (mix((key + (record_id + 1) * 0x9E3779B97F4A7C15) & _M) >> 11) * 2.0**-53


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("ctr")
    return {
        "criteo": write_criteo(d / "train.txt", 600, seed=1).path,
        "kaggle": write_criteo(d / "train.csv", 300, seed=2, kaggle=True).path,
        "avazu": write_avazu(d / "a.csv", 600, seed=3, days=3).path,
    }


def _specs(files: dict[str, Path]) -> dict[str, DataSpec]:
    return {
        "synthetic-ctr": DataSpec("synthetic-ctr", rows=1500, seed=3),
        "synthetic-rate": DataSpec(
            "synthetic-ctr", rows=800, seed=1, positive_rate=0.3
        ),
        "breast-cancer": DataSpec("breast-cancer", seed=1),
        "digits": DataSpec("digits", rows=400, seed=2, test_fraction=0.3),
        "criteo": DataSpec(
            "criteo", data_path=str(files["criteo"]), hash_buckets=64, seed=5
        ),
        "criteo-kaggle-time": DataSpec(
            "criteo", data_path=str(files["kaggle"]), split="time", rows=250
        ),
        "avazu": DataSpec("avazu", data_path=str(files["avazu"]), hash_buckets=32),
        "avazu-time": DataSpec("avazu", data_path=str(files["avazu"]), split="time"),
    }


SPEC_NAMES = (
    "synthetic-ctr",
    "synthetic-rate",
    "breast-cancer",
    "digits",
    "criteo",
    "criteo-kaggle-time",
    "avazu",
    "avazu-time",
)


# ------------------------------------------------------------------ membership


def test_membership_hash_matches_the_documented_formula() -> None:
    # Prepare
    ids = np.array([0, 1, 2, 17, 10**9, 2**40 + 3])
    for seed in (0, 1, -7, 2**63 + 5):
        # Execute
        got = hash_uniform(ids, seed).tolist()
        # Assert
        assert got == [_ref_uniform(int(i), seed) for i in ids]


def test_membership_fraction_is_binomial_and_seeded() -> None:
    # Prepare
    n, q = 50_000, 0.2
    ids = np.arange(n)
    # Execute
    a = hash_is_test(ids, seed=0, test_fraction=q)
    b = hash_is_test(ids, seed=1, test_fraction=q)
    # Assert: within 4 binomial standard deviations of n q
    tol = 4 * np.sqrt(n * q * (1 - q))
    assert abs(int(a.sum()) - n * q) < tol
    assert abs(int(b.sum()) - n * q) < tol
    # different seeds: about q^2 + (1-q)^2 agreement, not identical
    agree = float((a == b).mean())
    assert abs(agree - (q**2 + (1 - q) ** 2)) < 0.01
    # a record's membership depends on its own id only
    sub = ids[::7]
    np.testing.assert_array_equal(hash_is_test(sub, seed=0, test_fraction=q), a[sub])


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_realized_test_fraction_is_within_binomial_tolerance(
    name: str, files: dict[str, Path]
) -> None:
    # Prepare
    spec = _specs(files)[name]
    # Execute
    lv = load_label_view(spec)
    # Assert
    n = lv.info["rows"]
    n_test = len(lv.test_ids)
    if spec.split == "random":
        q = spec.test_fraction
        assert abs(n_test - n * q) < 4 * np.sqrt(n * q * (1 - q))
    assert n_test + len(lv.train_ids) == n
    assert lv.info["train_rows"] == len(lv.train_ids)
    assert np.intersect1d(lv.train_ids, lv.test_ids).size == 0


def test_different_seeds_give_different_splits(files: dict[str, Path]) -> None:
    for name in ("synthetic-ctr", "breast-cancer", "criteo"):
        spec = _specs(files)[name]
        a = load_label_view(spec)
        b = load_label_view(dataclasses.replace(spec, seed=spec.seed + 1))
        assert a.id_space != b.id_space
        if name != "synthetic-ctr":  # same rows, another membership
            ids = np.sort(np.concatenate([b.train_ids, b.test_ids]))
            np.testing.assert_array_equal(
                np.sort(np.concatenate([a.train_ids, a.test_ids])), ids
            )


def test_permuting_or_flipping_labels_keeps_the_ids(tmp_path: Path) -> None:
    # Prepare: the same rows with permuted and with flipped labels
    base = write_criteo(tmp_path / "base.txt", 500, seed=4).path
    lines = [line.split("\t") for line in base.read_text().splitlines()]
    labels = [f[0] for f in lines]
    perm = np.random.default_rng(0).permutation(len(labels))
    variants = {"base": labels, "perm": [labels[i] for i in perm]}
    variants["flip"] = ["1" if y == "0" else "0" for y in labels]
    paths = {}
    for key, ys in variants.items():
        path = tmp_path / f"{key}.txt"
        rows = ["\t".join([y, *f[1:]]) for y, f in zip(ys, lines, strict=True)]
        path.write_text("\n".join(rows) + "\n")
        paths[key] = path
    # Execute
    views = {
        key: load_label_view(DataSpec("criteo", data_path=str(p), seed=9))
        for key, p in paths.items()
    }
    full = {
        key: load_dataset("criteo", data_path=p, seed=9) for key, p in paths.items()
    }
    # Assert: labels changed, membership did not
    assert not np.array_equal(views["base"].train_labels, views["perm"].train_labels)
    np.testing.assert_array_equal(
        views["base"].train_labels, 1 - views["flip"].train_labels
    )
    for key in ("perm", "flip"):
        np.testing.assert_array_equal(views[key].train_ids, views["base"].train_ids)
        np.testing.assert_array_equal(views[key].test_ids, views["base"].test_ids)
        assert full[key].train_ids is not None
        np.testing.assert_array_equal(full[key].train_ids, views["base"].train_ids)


def test_bundled_membership_ignores_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: flip every breast-cancer label on the real read path
    from tpsl_flwr.data import bundled

    spec = DataSpec("breast-cancer", seed=3)
    before = load_dataset(**spec.load_dataset_kwargs())
    real = bundled.bundled_labels

    def flipped(name: str, ids: np.ndarray) -> tuple[np.ndarray, int]:
        y, k = real(name, ids)
        return 1 - y, k

    monkeypatch.setattr(bundled, "bundled_labels", flipped)
    import tpsl_flwr.data.builtin as builtin

    monkeypatch.setattr(builtin, "bundled_labels", flipped)
    # Execute
    after = load_dataset(**spec.load_dataset_kwargs())
    # Assert
    np.testing.assert_array_equal(after.train.labels, 1 - before.train.labels)
    assert before.train_ids is not None and after.train_ids is not None
    np.testing.assert_array_equal(after.train_ids, before.train_ids)
    np.testing.assert_array_equal(after.test.numeric, before.test.numeric)


# ---------------------------------------------------------------- consistency


@pytest.mark.parametrize("name", SPEC_NAMES)
@pytest.mark.parametrize("num_parties", [1, 2, 3])
def test_views_equal_load_dataset(
    name: str, num_parties: int, files: dict[str, Path]
) -> None:
    # Prepare
    spec = _specs(files)[name]
    full = load_dataset(**spec.load_dataset_kwargs())
    numeric, categorical = dataset_columns(spec)
    assert (numeric, categorical) == (
        full.train.numeric_names,
        full.train.categorical_names,
    )
    parts = partition_columns(numeric, categorical, num_parties)
    # Execute
    lv = load_label_view(spec)
    views = [load_party_view(spec, p.names) for p in parts]
    # Assert: labels, ids and facts
    assert isinstance(full, DatasetSplit)
    assert full.train_ids is not None and full.test_ids is not None
    np.testing.assert_array_equal(lv.train_labels, full.train.labels)
    np.testing.assert_array_equal(lv.test_labels, full.test.labels)
    assert lv.num_classes == full.num_classes
    np.testing.assert_array_equal(lv.train_ids, full.train_ids)
    np.testing.assert_array_equal(lv.test_ids, full.test_ids)
    same_info = {
        k: v for k, v in full.info.items() if k not in ("cache_path", "cache_hit")
    }
    assert same_info == {k: lv.info[k] for k in same_info}
    # columns, bitwise, and the same ids on every side
    for part, view in zip(parts, views, strict=True):
        assert view.id_space == lv.id_space
        for side in ("train", "test"):
            want = getattr(full, side).features_only(part.names)
            got = getattr(view, side)
            assert got.names == part.names
            assert got.cardinalities == want.cardinalities
            assert _bits_equal(got.numeric, want.numeric)
            assert _bits_equal(got.categorical, want.categorical)
    # together the views hold every column once
    assert sorted(c for v in views for c in v.train.names) == sorted(
        numeric + categorical
    )


def test_ids_are_increasing_read_only_and_fingerprinted(
    files: dict[str, Path],
) -> None:
    spec = _specs(files)["digits"]
    lv = load_label_view(spec)
    pv = load_party_view(spec, ["pixel_3_3"])
    for ids in (lv.train_ids, lv.test_ids, pv.train_ids):
        # held compact: int32 below 2**31 records (tpsl_flwr._util.compact_ints)
        assert ids.dtype == np.int32 and (np.diff(ids) > 0).all()
        with pytest.raises(ValueError, match="read-only"):
            ids[0] = 5
    # digits rows=400 keeps the original row numbers of the 1797-row table
    assert max(lv.train_ids.max(), lv.test_ids.max()) > 400
    assert lv.id_space == id_space_fingerprint(lv.train_ids, lv.test_ids)
    assert len(lv.id_space) == 64
    assert lv.id_space != id_space_fingerprint(lv.test_ids, lv.train_ids)


# ------------------------------------------------------- the node never sees y


def _garbage_labels(path: Path, column: int, sep: str, header: bool) -> Path:
    lines = path.read_text().splitlines()
    out = lines[:1] if header else []
    for line in lines[1:] if header else lines:
        fields = line.split(sep)
        fields[column] = "spam"
        out.append(sep.join(fields))
    bad = path.with_name("garbage-" + path.name)
    bad.write_text("\n".join(out) + "\n")
    return bad


@pytest.mark.parametrize(
    ("name", "column", "sep", "header", "label"),
    [
        ("criteo", 0, "\t", False, "label"),
        ("kaggle", 1, ",", True, "Label"),
        ("avazu", 1, ",", True, "click"),
    ],
)
def test_garbage_label_column_loads_for_parties_only(
    files: dict[str, Path], name: str, column: int, sep: str, header: bool, label: str
) -> None:
    # Prepare: every label field is "spam"
    path = _garbage_labels(files[name], column, sep, header)
    dataset = "avazu" if name == "avazu" else "criteo"
    for split in ("random", "time"):
        spec = DataSpec(dataset, data_path=str(path), split=split, hash_buckets=16)
        numeric, categorical = dataset_columns(spec)
        # Execute / Assert: every party loads, with the ids of the clean file
        clean = load_label_view(dataclasses.replace(spec, data_path=str(files[name])))
        for part in partition_columns(numeric, categorical, 3):
            view = load_party_view(spec, part.names)
            np.testing.assert_array_equal(view.test_ids, clean.test_ids)
        # ... but the label party cannot, naming the line and the label column
        line = 2 if header else 1
        with pytest.raises(
            ConfigError, match=rf"line {line}, column {label}: 'spam' is not 0 or 1"
        ):
            load_label_view(spec)


def test_party_view_never_touches_labels(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: every label path raises
    import sklearn.datasets

    from tpsl_flwr.data import builtin, bundled, synthetic, views
    from tpsl_flwr.data.ctr import files as ctr_files

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("a label was touched")

    real_read = bundled._read

    def features_only_read(name: str, target: bool) -> np.ndarray:
        if target:
            boom()
        return real_read(name, target)

    monkeypatch.setattr(sklearn.datasets, "load_breast_cancer", boom)
    monkeypatch.setattr(sklearn.datasets, "load_digits", boom)
    monkeypatch.setattr(synthetic, "_draw_labels", boom)
    monkeypatch.setattr(synthetic, "make_synthetic_ctr", boom)
    monkeypatch.setattr(views, "make_synthetic_ctr", boom)
    monkeypatch.setattr(builtin, "make_synthetic_ctr", boom)
    monkeypatch.setattr(bundled, "_read", features_only_read)
    monkeypatch.setattr(ctr_files, "parse_labels", boom)
    views._party_view.cache_clear()
    views._label_view.cache_clear()
    for name in SPEC_NAMES:
        spec = _specs(files)[name]
        numeric, categorical = dataset_columns(spec)
        # Execute
        got = [
            load_party_view(spec, p.names, cache_dir=files["criteo"].parent / name)
            for p in partition_columns(numeric, categorical, 2)
        ]
        # Assert: loaded, and no field holds labels
        assert [f.name for f in dataclasses.fields(PartyView)] == [
            "train",
            "test",
            "train_ids",
            "test_ids",
        ]
        for view in got:
            assert len(view.train) == len(view.train_ids) > 0
            assert not hasattr(view.train, "labels")
        # the patches sit on the real label path: the label view fails
        with pytest.raises(AssertionError, match="a label was touched"):
            load_label_view(spec, cache_dir=files["criteo"].parent / f"{name}-y")
    views._party_view.cache_clear()
    views._label_view.cache_clear()


def test_party_cache_holds_only_the_party_columns(tmp_path: Path) -> None:
    # Prepare
    path = write_criteo(tmp_path / "train.txt", 300, seed=0).path
    spec = DataSpec("criteo", data_path=str(path), hash_buckets=16)
    cache = tmp_path / "cache"
    # Execute
    load_party_view(spec, ["I2", "C5", "C7"], cache_dir=cache)
    load_party_view(spec, ["I1"], cache_dir=cache)
    load_label_view(spec, cache_dir=cache)
    # Assert: three entries; only the label party's holds labels
    entries = sorted(p for p in cache.iterdir() if p.is_dir())
    assert len(entries) == 3
    shapes = []
    for entry in entries:
        names = sorted(f.name for f in entry.glob("*.npy"))
        num = np.load(entry / "numeric.npy", mmap_mode="r")
        cat = np.load(entry / "categorical.npy", mmap_mode="r")
        shapes.append((num.shape[1], cat.shape[1], "labels.npy" in names))
    assert sorted(shapes) == [(0, 0, True), (1, 0, False), (1, 2, False)]


def test_views_treat_malformed_rows_as_errors(tmp_path: Path) -> None:
    # Prepare: line 17 has a bad I5, line 30 a missing field
    path = write_criteo(tmp_path / "train.txt", 60, seed=0).path
    lines = path.read_text().splitlines()
    f = lines[16].split("\t")
    f[5] = "abc"
    lines[16] = "\t".join(f)
    path.write_text("\n".join(lines) + "\n")
    spec = DataSpec("criteo", data_path=str(path))
    # Execute / Assert
    with pytest.raises(ConfigError, match=r"line 17, column I5: 'abc' is not an int"):
        load_party_view(spec, ["I5", "C1"])
    assert len(load_party_view(spec, ["I4"]).train) > 0  # never converts I5
    lines[29] = lines[29].rsplit("\t", 1)[0]
    path.write_text("\n".join(lines) + "\n")
    for load in (
        lambda: load_party_view(spec, ["I4"]),
        lambda: load_label_view(spec),
    ):
        with pytest.raises(ConfigError, match=r"line 30: expected 40 tab-separated"):
            load()


# ------------------------------------------------------------------ pieces


def test_features_only_generator_is_bitwise_the_full_one() -> None:
    for kwargs in (
        {"rows": 700, "seed": 4},
        {"rows": 300, "num_numeric": 3, "num_categorical": 0, "seed": 1},
        {"rows": 300, "num_numeric": 0, "num_categorical": 5, "zipf_exponent": 0.5},
    ):
        full = make_synthetic_ctr(positive_rate=0.2, logit_sd=2.0, **kwargs)
        feats = make_synthetic_features(**kwargs)
        assert _bits_equal(feats.numeric, full.numeric)
        assert _bits_equal(feats.categorical, full.categorical)
        assert feats.cardinalities == full.cardinalities
        assert feats.numeric_names == full.numeric_names
        assert not hasattr(feats, "labels")


def test_bundled_tables_equal_sklearns_loaders() -> None:
    from sklearn.datasets import load_breast_cancer, load_digits

    for name, loader in (
        ("breast-cancer", load_breast_cancer),
        ("digits", load_digits),
    ):
        bunch = loader()
        full = load_dataset(name, test_fraction=0.5, seed=0)
        assert full.train_ids is not None and full.test_ids is not None
        x = np.empty_like(np.asarray(bunch.data, dtype=np.float64))
        y = np.empty(len(x), dtype=np.int64)
        # undo the standardization by reading the raw values back by record id
        from tpsl_flwr.data.bundled import bundled_features, bundled_labels

        ids = np.arange(len(x))
        x[:] = bundled_features(name, ids)
        y[:] = bundled_labels(name, ids)[0]
        assert _bits_equal(x, np.asarray(bunch.data, dtype=np.float64))
        np.testing.assert_array_equal(y, bunch.target)
        np.testing.assert_array_equal(full.train.labels, bunch.target[full.train_ids])
        assert full.num_classes == len(bunch.target_names)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"dataset": "mnist"}, "'mnist'"),
        ({"dataset": "criteo"}, "give data_path"),
        ({"dataset": "digits", "data_path": "x.csv"}, "data_path='x.csv'"),
        ({"dataset": "digits", "rows": 0}, "got 0"),
        ({"dataset": "digits", "rows": True}, "got True"),
        ({"dataset": "digits", "seed": 1.5}, "got 1.5"),
        ({"dataset": "digits", "test_fraction": 1.0}, "got 1.0"),
        ({"dataset": "digits", "split": "time"}, "split='time'"),
        ({"dataset": "criteo", "data_path": "f", "split": "day"}, "'day'"),
        ({"dataset": "criteo", "data_path": "f", "hash_buckets": 1}, "got 1"),
        ({"dataset": "digits", "hash_buckets": 8}, "hash_buckets=8"),
        ({"dataset": "digits", "positive_rate": 0.2}, "positive_rate=0.2"),
        ({"dataset": "synthetic-ctr", "positive_rate": 1.5}, "got 1.5"),
    ],
)
def test_data_spec_errors_name_the_value(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        DataSpec(**kwargs)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("columns", "needle"),
    [
        (["num_0", "nope"], "['nope']"),
        (["num_0", "num_0"], "repeat"),
        ([], "at least one"),
        ("num_0", "'num_0'"),
    ],
)
def test_party_view_rejects_bad_columns(columns: object, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_party_view(DataSpec("synthetic-ctr", rows=100), columns)  # type: ignore[arg-type]
    assert needle in str(info.value)


def test_label_view_validates_its_fields() -> None:
    ids = np.array([0, 2], dtype=np.int64)
    with pytest.raises(ConfigError, match=r"lie in \[0, 2\)"):
        LabelView(np.array([0, 2]), np.array([1]), 2, ids, np.array([1]))
    with pytest.raises(ConfigError, match="disjoint"):
        LabelView(np.array([0, 1]), np.array([1]), 2, ids, np.array([2]))
    with pytest.raises(ConfigError, match="increasing"):
        LabelView(np.array([0, 1]), np.array([1]), 2, ids[::-1].copy(), np.array([1]))
