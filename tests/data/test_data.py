"""Tests of the data layer: records, partitions, synthetic CTR, built-in loaders."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import sparse
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import OneHotEncoder

from tpsl_flwr.data import (
    DATASETS,
    DatasetSplit,
    PartyColumns,
    PartyFeatures,
    TabularData,
    binary_auc,
    load_dataset,
    make_synthetic_ctr,
    partition_columns,
    party_features,
)
from tpsl_flwr.errors import ConfigError


def _table(n: int = 6, **overrides: Any) -> TabularData:
    fields: dict[str, Any] = {
        "numeric": np.arange(2 * n, dtype=np.float32).reshape(n, 2),
        "categorical": np.stack([np.arange(n) % 3, np.arange(n) % 2], axis=1),
        "cardinalities": (3, 2),
        "labels": np.arange(n) % 2,
        "num_classes": 2,
        "numeric_names": ("a", "b"),
        "categorical_names": ("x", "y"),
    }
    fields.update(overrides)
    return TabularData(**fields)


@pytest.fixture(scope="module")
def synthetic() -> DatasetSplit:
    return load_dataset("synthetic-ctr", seed=0)


# --------------------------------------------------------------------- records


def test_table_fields_and_len() -> None:
    # Prepare / Execute
    t = _table()
    # Assert
    assert len(t) == 6
    assert t.names == ("a", "b", "x", "y")
    assert t.numeric.dtype == np.float32
    assert t.categorical.dtype == np.int64
    assert t.labels.dtype == np.int64


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"numeric": np.zeros((6, 2))}, "float64"),
        ({"numeric": np.zeros(6, np.float32)}, "(6,)"),
        ({"categorical": np.zeros((6, 2), np.int32)}, "int32"),
        ({"categorical": np.zeros((5, 2), np.int64)}, "5"),
        ({"categorical": np.full((6, 2), 3, np.int64)}, "[3, 3]"),
        ({"categorical": np.full((6, 2), -1, np.int64)}, "[-1, -1]"),
        ({"cardinalities": (3,)}, "1 entries"),
        ({"cardinalities": (3, 0)}, "got 0"),
        ({"labels": np.array([0, 1, 2, 0, 1, 0])}, "[0, 2]"),
        ({"labels": np.array([0, 1, -1, 0, 1, 0])}, "[-1, 1]"),
        ({"labels": np.zeros(6, np.int32)}, "int32"),
        ({"labels": np.zeros(5, np.int64)}, "(5,)"),
        ({"num_classes": 1}, "got 1"),
        ({"numeric_names": ("a",)}, "1 names"),
        ({"categorical_names": ("a", "y")}, "['a']"),
    ],
)
def test_table_rejects_bad_fields(overrides: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        _table(**overrides)
    assert needle in str(info.value)


def test_features_only_drops_labels_and_keeps_table_order() -> None:
    # Prepare
    t = _table()
    # Execute
    f = t.features_only(["y", "a"])
    # Assert
    assert isinstance(f, PartyFeatures)
    assert not hasattr(f, "labels")
    assert f.numeric_names == ("a",)
    assert f.categorical_names == ("y",)
    assert f.cardinalities == (2,)
    np.testing.assert_array_equal(f.numeric[:, 0], t.numeric[:, 0])
    np.testing.assert_array_equal(f.categorical[:, 0], t.categorical[:, 1])
    assert len(f) == len(t)
    assert t.features_only().names == t.names


def test_features_only_rejects_unknown_and_repeated_names() -> None:
    t = _table()
    with pytest.raises(ConfigError, match="'nope'"):
        t.features_only(["a", "nope"])
    with pytest.raises(ConfigError, match="repeat"):
        t.features_only(["a", "a"])
    with pytest.raises(ConfigError, match="'a'"):
        t.features_only("a")


def test_take_selects_rows() -> None:
    t = _table()
    s = t.take([4, 1])
    np.testing.assert_array_equal(s.labels, t.labels[[4, 1]])
    np.testing.assert_array_equal(s.categorical, t.categorical[[4, 1]])
    assert len(t.features_only().take([0, 0, 2])) == 3


def test_split_rejects_mismatched_schemas() -> None:
    a = _table()
    b = _table(cardinalities=(4, 2))
    with pytest.raises(ConfigError, match="cardinalities"):
        DatasetSplit(train=a, test=b, name="t")


# ------------------------------------------------------------------- partition


def test_partition_round_robin_example() -> None:
    parts = partition_columns(["a", "b", "c"], ["x", "y"], 2)
    assert parts == [
        PartyColumns(0, ("a", "c"), ("y",)),
        PartyColumns(1, ("b",), ("x",)),
    ]


@settings(max_examples=100, deadline=None)
@given(
    num_numeric=st.integers(0, 12),
    num_categorical=st.integers(0, 12),
    data=st.data(),
)
def test_partition_properties(
    num_numeric: int, num_categorical: int, data: st.DataObject
) -> None:
    # Prepare
    total = num_numeric + num_categorical
    if total == 0:
        return
    parties = data.draw(st.integers(1, total))
    numeric = [f"n{i}" for i in range(num_numeric)]
    categorical = [f"c{i}" for i in range(num_categorical)]
    # Execute
    parts = partition_columns(numeric, categorical, parties)
    # Assert: every column exactly once, with its type
    assert [p.party for p in parts] == list(range(parties))
    got_num = [c for p in parts for c in p.numeric]
    got_cat = [c for p in parts for c in p.categorical]
    assert sorted(got_num) == sorted(numeric)
    assert sorted(got_cat) == sorted(categorical)
    # balanced: overall and per column type sizes differ by at most 1
    for sizes in (
        [len(p) for p in parts],
        [len(p.numeric) for p in parts],
        [len(p.categorical) for p in parts],
    ):
        assert max(sizes) - min(sizes) <= 1
    # table order within a party, and determinism
    for p in parts:
        assert list(p.numeric) == [c for c in numeric if c in p.numeric]
    assert partition_columns(numeric, categorical, parties) == parts


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=4, max_size=10))
def test_partition_by_assignment(owners: list[int]) -> None:
    # Prepare: make every party non-empty
    owners = [*owners[:-4], 0, 1, 2, 3]
    names = [f"n{i}" for i in range(len(owners))]
    numeric, categorical = names[::2], names[1::2]
    # Execute
    parts = partition_columns(
        numeric, categorical, 4, dict(zip(names, owners, strict=True))
    )
    # Assert
    for name, owner in zip(names, owners, strict=True):
        holders = [p.party for p in parts if name in p.names]
        assert holders == [owner]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((["a"], ["x"], 0), "got 0"),
        ((["a"], ["x"], -2), "got -2"),
        ((["a"], ["x"], 3), "num_parties=3"),
        ((["a"], ["a"], 1), "['a']"),
        ((["a", "b"], ["x"], 2, {"a": 0, "b": 1, "x": 0, "zz": 1}), "['zz']"),
        ((["a", "b"], ["x"], 2, {"a": 0, "b": 1}), "['x']"),
        ((["a", "b"], ["x"], 2, {"a": 0, "b": 0, "x": 0}), "parties [1]"),
        ((["a", "b"], ["x"], 2, {"a": 0, "b": 2, "x": 1}), "got 2"),
    ],
)
def test_partition_errors_name_the_value(args: tuple, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        partition_columns(*args)
    assert needle in str(info.value)


def test_party_features_reassemble_the_table(synthetic: DatasetSplit) -> None:
    # Prepare
    t = synthetic.train
    parts = partition_columns(t.numeric_names, t.categorical_names, 3)
    # Execute
    slices = [party_features(t, p) for p in parts]
    # Assert
    for part, f in zip(parts, slices, strict=True):
        assert f.names == part.names
        for name, col in zip(f.numeric_names, f.numeric.T, strict=True):
            np.testing.assert_array_equal(
                col, t.numeric[:, t.numeric_names.index(name)]
            )
        for name, col in zip(f.categorical_names, f.categorical.T, strict=True):
            j = t.categorical_names.index(name)
            np.testing.assert_array_equal(col, t.categorical[:, j])
            assert (
                f.cardinalities[f.categorical_names.index(name)] == t.cardinalities[j]
            )
    assert sum(len(f.names) for f in slices) == len(t.names)


def test_party_features_rejects_wrong_column_type() -> None:
    t = _table()
    with pytest.raises(ConfigError, match="'x'"):
        party_features(t, PartyColumns(0, ("x",), ()))


# ------------------------------------------------------------------- synthetic


def test_synthetic_shapes_dtypes_and_determinism() -> None:
    # Execute
    a = make_synthetic_ctr(rows=3000, num_numeric=5, num_categorical=3, seed=7)
    b = make_synthetic_ctr(rows=3000, num_numeric=5, num_categorical=3, seed=7)
    c = make_synthetic_ctr(rows=3000, num_numeric=5, num_categorical=3, seed=8)
    # Assert
    assert a.numeric.shape == (3000, 5) and a.numeric.dtype == np.float64
    assert a.categorical.shape == (3000, 3) and a.categorical.dtype == np.int64
    assert a.labels.shape == (3000,) and a.labels.dtype == np.int64
    assert len(a.cardinalities) == 3
    assert all(3 <= k <= 100 for k in a.cardinalities)
    assert (a.categorical < np.array(a.cardinalities)).all()
    assert (a.categorical >= 0).all()
    assert set(np.unique(a.labels)) == {0, 1}
    for field in ("numeric", "categorical", "labels", "probabilities"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert not np.array_equal(a.numeric, c.numeric)


@pytest.mark.parametrize("rate", [0.01, 0.05, 0.1, 0.3, 0.5])
def test_synthetic_positive_rate(rate: float) -> None:
    # Execute
    d = make_synthetic_ctr(rows=50_000, positive_rate=rate, seed=3)
    # Assert: realized count exact; mean true probability within 1% relative
    # plus 4 binomial standard errors of the target.
    assert d.labels.sum() == round(rate * 50_000)
    se = np.sqrt(rate * (1 - rate) / 50_000)
    assert abs(d.probabilities.mean() - rate) < 0.01 * rate + 4 * se


@pytest.mark.parametrize("logit_sd", [0.5, 1.5, 3.0])
def test_synthetic_logit_has_the_requested_spread(logit_sd: float) -> None:
    d = make_synthetic_ctr(rows=100_000, seed=2, logit_sd=logit_sd)
    feature_logit = d.logits - d.intercept
    assert abs(feature_logit.mean()) < 0.02 * logit_sd
    assert feature_logit.std() == pytest.approx(logit_sd, rel=0.02)
    # winsorized features: the logit is bounded, no saturated probabilities
    assert np.abs(feature_logit).max() < 15 * logit_sd
    np.testing.assert_allclose(d.probabilities, 1 / (1 + np.exp(-d.logits)))


def _integrate(f: Any, lo: float, hi: float, n: int = 400_001) -> float:
    # Composite Simpson's rule on a fine grid (numpy only; scipy.stats is slow to
    # import).
    x = np.linspace(lo, hi, n)
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return float((hi - lo) / (n - 1) / 3.0 * (w * f(x)).sum())


def test_synthetic_clipped_moment_constants() -> None:
    # Golden values: recompute the winsorized moments by numerical integration,
    # with the closed-form t(3) and log-normal(0, 1) densities and tails.
    from tpsl_flwr.data import synthetic_terms as syn

    assert (syn._CLIP, syn._T_DF, syn._LOGNORMAL_SIGMA) == (4.0, 3.0, 1.0)
    t_sd = np.sqrt(3.0)
    a = 4.0 * t_sd

    def t_pdf(x: np.ndarray) -> np.ndarray:
        return 6 * np.sqrt(3) / (np.pi * (3 + x**2) ** 2)

    u = a / np.sqrt(3)
    t_sf = 0.5 - (u / (1 + u**2) + np.arctan(u)) / np.pi
    t_var = _integrate(lambda x: (x / t_sd) ** 2 * t_pdf(x), -a, a) + 16 * 2 * t_sf
    assert np.sqrt(t_var) == pytest.approx(syn._T_CLIPPED_SD, rel=1e-6)

    def ln_pdf(x: np.ndarray) -> np.ndarray:
        safe = np.maximum(x, 1e-300)
        return np.where(
            x > 0, np.exp(-(np.log(safe) ** 2) / 2) / (safe * np.sqrt(2 * np.pi)), 0.0
        )

    mu, sd = np.exp(0.5), np.sqrt((np.e - 1) * np.e)
    up = mu + 4.0 * sd
    ln_sf = 0.5 * math.erfc(math.log(up) / math.sqrt(2))
    m1 = _integrate(lambda x: (x - mu) / sd * ln_pdf(x), 0.0, up) + 4.0 * ln_sf
    m2 = _integrate(lambda x: ((x - mu) / sd) ** 2 * ln_pdf(x), 0.0, up)
    m2 += 16.0 * ln_sf
    assert m1 == pytest.approx(syn._LOGNORMAL_CLIPPED_MEAN, rel=1e-6)
    assert np.sqrt(m2 - m1**2) == pytest.approx(syn._LOGNORMAL_CLIPPED_SD, rel=1e-6)


def _excess_kurtosis(x: np.ndarray) -> np.ndarray:
    z = (x - x.mean(axis=0)) / x.std(axis=0)
    return (z**4).mean(axis=0) - 3.0


def test_synthetic_features_are_heavy_tailed_and_zipf() -> None:
    d = make_synthetic_ctr(rows=50_000, seed=1, zipf_exponent=1.1)
    # Student-t(3) and log-normal columns: large excess kurtosis.
    assert (_excess_kurtosis(d.numeric) > 3).all()
    # Code 0 is the most frequent and frequencies decrease.
    for j, card in enumerate(d.cardinalities):
        counts = np.bincount(d.categorical[:, j], minlength=card)
        assert counts.argmax() == 0
        assert counts[0] > 2 * counts[min(3, card - 1)]


def test_synthetic_zero_columns_of_a_kind() -> None:
    only_cat = make_synthetic_ctr(rows=500, num_numeric=0, num_categorical=2)
    only_num = make_synthetic_ctr(rows=500, num_numeric=3, num_categorical=0)
    assert only_cat.numeric.shape == (500, 0)
    assert only_num.categorical.shape == (500, 0)
    assert only_num.cardinalities == ()


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"rows": 0}, "got 0"),
        ({"rows": 1.5}, "1.5"),
        ({"num_numeric": -1}, "got -1"),
        ({"num_numeric": 0, "num_categorical": 0}, "num_numeric=0"),
        ({"cardinality_range": (1, 5)}, "(1, 5)"),
        ({"cardinality_range": (9, 5)}, "(9, 5)"),
        ({"positive_rate": 0.0}, "0.0"),
        ({"positive_rate": 1.0}, "1.0"),
        ({"rows": 10, "positive_rate": 0.01}, "rows=10"),
        ({"logit_sd": -1.0}, "-1.0"),
        ({"zipf_exponent": float("nan")}, "nan"),
    ],
)
def test_synthetic_errors_name_the_value(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_synthetic_ctr(**kwargs)
    assert needle in str(info.value)


# ----------------------------------------------------------------- load_dataset


@pytest.mark.parametrize("name", DATASETS)
def test_load_dataset_schema_and_standardization(name: str) -> None:
    # Execute
    s = load_dataset(name, seed=0)
    # Assert
    tr, te = s.train, s.test
    assert s.name == name
    assert s.info["rows"] == len(tr) + len(te)
    assert s.info["train_rows"] == len(tr) and s.info["test_rows"] == len(te)
    # membership by record id: each row is test with probability 0.2
    n, q = s.info["rows"], 0.2
    assert abs(len(te) - n * q) < 4 * math.sqrt(n * q * (1 - q))
    assert s.train_ids is not None and s.test_ids is not None
    ids = np.concatenate([s.train_ids, s.test_ids])
    assert np.unique(ids).size == n and (np.diff(s.train_ids) > 0).all()
    assert tr.numeric.dtype == np.float32 and tr.categorical.dtype == np.int64
    mean, std = tr.numeric.mean(axis=0), tr.numeric.std(axis=0)
    np.testing.assert_allclose(mean, 0.0, atol=1e-4)
    varying = std > 0
    np.testing.assert_allclose(std[varying], 1.0, atol=1e-3)
    # not stratified, but label-blind: each class sends a binomial share to test
    k = s.num_classes
    n_c = np.bincount(np.concatenate([tr.labels, te.labels]), minlength=k)
    t_c = np.bincount(te.labels, minlength=k)
    assert (np.abs(t_c - n_c * q) < 4 * np.sqrt(n_c * q * (1 - q)) + 1).all()


def test_load_dataset_facts() -> None:
    bc = load_dataset("breast-cancer")
    digits = load_dataset("digits")
    assert (bc.info["rows"], bc.num_classes, bc.info["num_numeric"]) == (569, 2, 30)
    assert "mean_radius" in bc.train.numeric_names
    assert (digits.info["rows"], digits.num_classes) == (1797, 10)
    assert digits.train.categorical.shape == (len(digits.train), 0)
    assert "positive_rate" not in digits.info


def test_load_dataset_deterministic_and_seeded() -> None:
    a = load_dataset("synthetic-ctr", rows=2000, seed=5)
    b = load_dataset("synthetic-ctr", rows=2000, seed=5)
    c = load_dataset("synthetic-ctr", rows=2000, seed=6)
    for part in ("train", "test"):
        for field in ("numeric", "categorical", "labels"):
            np.testing.assert_array_equal(
                getattr(getattr(a, part), field), getattr(getattr(b, part), field)
            )
    assert a.info == b.info
    assert not np.array_equal(a.train.numeric, c.train.numeric)
    d1 = load_dataset("breast-cancer", rows=300, seed=1)
    d2 = load_dataset("breast-cancer", rows=300, seed=1)
    assert d1.info["rows"] == 300
    np.testing.assert_array_equal(d1.test.numeric, d2.test.numeric)


def test_load_dataset_synthetic_rate_and_bayes_auc(synthetic: DatasetSplit) -> None:
    info = synthetic.info
    assert info["rows"] == 20_000
    assert info["positive_rate"] == pytest.approx(0.1, rel=0.01)
    # the split ignores labels: the test rate is binomial around the overall rate
    n_test = info["test_rows"]
    se = math.sqrt(0.1 * 0.9 / n_test)
    assert abs(info["test_positive_rate"] - info["positive_rate"]) < 4 * se
    assert 0.75 < info["bayes_test_auc"] < 0.95
    s = load_dataset("synthetic-ctr", rows=10_000, positive_rate=0.03)
    assert s.info["positive_rate"] == pytest.approx(0.03, rel=0.01)


def test_logistic_regression_on_synthetic_is_below_bayes(
    synthetic: DatasetSplit,
) -> None:
    # Prepare: numeric features plus one-hot categories
    tr, te = synthetic.train, synthetic.test
    enc = OneHotEncoder(categories=[np.arange(k) for k in tr.cardinalities])
    x_tr = sparse.hstack([tr.numeric, enc.fit_transform(tr.categorical)]).tocsr()
    x_te = sparse.hstack([te.numeric, enc.transform(te.categorical)]).tocsr()
    # Execute
    model = LogisticRegression(max_iter=500).fit(x_tr, tr.labels)
    auc = roc_auc_score(te.labels, model.decision_function(x_te))
    # Assert
    assert 0.6 < auc < synthetic.info["bayes_test_auc"] + 0.01


def test_logistic_regression_on_breast_cancer() -> None:
    s = load_dataset("breast-cancer", seed=0)
    model = LogisticRegression(max_iter=1000).fit(s.train.numeric, s.train.labels)
    auc = roc_auc_score(s.test.labels, model.decision_function(s.test.numeric))
    assert auc > 0.97


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"name": "mnist"}, "'synthetic-ctr', 'breast-cancer', 'digits'"),
        ({"rows": 0}, "got 0"),
        ({"rows": -5}, "got -5"),
        ({"test_fraction": 0.0}, "got 0.0"),
        ({"test_fraction": 1.0}, "got 1.0"),
        ({"test_fraction": 1.5}, "got 1.5"),
        ({"name": "breast-cancer", "rows": 600}, "rows=600"),
        ({"name": "digits", "positive_rate": 0.2}, "positive_rate=0.2"),
        ({"positive_rate": 0.0}, "got 0.0"),
    ],
)
def test_load_dataset_errors_name_the_value(kwargs: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_dataset(**kwargs)
    assert needle in str(info.value)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 1), st.integers(-3, 3)), min_size=2, max_size=60)
)
def test_binary_auc_matches_sklearn_with_ties(pairs: list[tuple[int, int]]) -> None:
    labels = np.array([p[0] for p in pairs])
    if np.unique(labels).size < 2:
        return
    scores = np.array([p[1] for p in pairs], dtype=np.float64)
    assert binary_auc(labels, scores) == pytest.approx(roc_auc_score(labels, scores))


@given(
    st.lists(st.tuples(st.integers(0, 1), st.integers(-3, 3)), min_size=2, max_size=60)
)
def test_the_one_auc_is_nan_for_one_class_and_sklearns_otherwise(pairs):
    from tpsl_flwr.metrics.auc import binary_auc

    labels = np.array([p[0] for p in pairs])
    scores = np.array([p[1] for p in pairs], dtype=float)
    if np.unique(labels).size < 2:
        assert np.isnan(binary_auc(labels, scores))
    else:
        assert binary_auc(labels, scores) == pytest.approx(
            roc_auc_score(labels, scores)
        )
