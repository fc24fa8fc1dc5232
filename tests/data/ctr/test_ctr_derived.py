"""Facts derived from a CTR cache entry: split ids, numeric statistics, code ranges.

The first start over a Criteo/Avazu file stores them in the entry's ``derived/``
folder; later starts read them (the ids as read-only memory maps). A view built
from stored facts equals one computed from scratch bit for bit; a damaged, stale
or foreign file is ignored, never trusted.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tpsl_flwr.data import views
from tpsl_flwr.data.ctr import derived
from tpsl_flwr.data.spec import DataSpec
from tpsl_flwr.data.views import load_label_view, load_party_view
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.testing import write_avazu, write_criteo

COLUMNS = ["I1", "I2", "C3", "C5"]


def _fresh() -> None:
    views._party_view.cache_clear()
    views._label_view.cache_clear()


def _party(spec: DataSpec, cache: Path) -> views.PartyView:
    _fresh()
    return load_party_view(spec, COLUMNS, cache_dir=cache)


def _same(a: views.PartyView, b: views.PartyView) -> None:
    assert np.array_equal(a.train_ids, b.train_ids)
    assert np.array_equal(a.test_ids, b.test_ids)
    for side in ("train", "test"):
        x, y = getattr(a, side), getattr(b, side)
        for part in ("numeric", "categorical"):
            got, want = getattr(x, part), getattr(y, part)
            assert np.asarray(got).tobytes() == np.asarray(want).tobytes()


def _replace(path: Path, arr: np.ndarray | bytes) -> None:
    """Put new content at ``path`` under a new inode (maps of the old stay valid)."""
    tmp = path.with_suffix(".new")
    if isinstance(arr, bytes):
        tmp.write_bytes(arr)
    else:
        with tmp.open("wb") as fh:
            np.save(fh, arr)
    tmp.chmod(0o600)  # this user's own edit: the entry stays private
    os.replace(tmp, path)


def _derived_files(cache: Path) -> list[Path]:
    return sorted(cache.glob("*/derived/*.npy"))


def _stored(cache: Path, kind: str) -> Path:
    """The one stored file of ``kind`` (``range``, ``stats``) under ``cache``."""
    return next(p for p in _derived_files(cache) if p.name.startswith(kind))


@pytest.fixture
def criteo(tmp_path: Path) -> DataSpec:
    path = write_criteo(tmp_path / "train.txt", 3000, seed=3).path
    return DataSpec("criteo", data_path=str(path), hash_buckets=64)


def test_second_start_reads_the_stored_facts_and_equals_the_first(
    criteo: DataSpec, tmp_path: Path
) -> None:
    # Prepare: a start with no cache at all is the reference.
    reference = _party(criteo, tmp_path / "ref-cache")
    cache = tmp_path / "cache"

    # Execute
    first = _party(criteo, cache)
    stored = _derived_files(cache)
    second = _party(criteo, cache)

    # Assert: split ids (train, test), stats and range stored once; the second
    # start maps the ids read-only and builds the same view bit for bit.
    kinds = [p.name.split("-")[0] for p in stored]
    assert kinds == ["range", "split", "split", "stats"]
    _same(first, reference)
    _same(second, reference)
    assert isinstance(second.train_ids, np.memmap)
    assert not second.train_ids.flags.writeable
    assert str(second.train_ids.dtype) == "int32"
    assert second.train.categorical.bounds is not None
    assert _derived_files(cache) == stored


def test_label_and_party_sides_store_their_own_split_and_agree(
    criteo: DataSpec, tmp_path: Path
) -> None:
    # Prepare
    cache = tmp_path / "cache"
    _fresh()
    load_label_view(criteo, cache_dir=cache)

    # Execute: a second start of each side reads its stored split.
    _fresh()
    label = load_label_view(criteo, cache_dir=cache)
    party = _party(criteo, cache)

    # Assert: the label side stores a split but no feature statistics.
    assert np.array_equal(label.train_ids, party.train_ids)
    assert np.array_equal(label.test_ids, party.test_ids)
    label_entry = next(e for e in cache.iterdir() if (e / "labels.npy").exists())
    kinds = sorted(p.name.split("-")[0] for p in (label_entry / "derived").glob("*"))
    assert kinds == ["split", "split"]


@pytest.mark.parametrize(
    "damage",
    [
        "empty",
        "truncate",
        "shuffle",
        "overlap",
        "swapped",
        "foreign-dtype",
        "garbage-stats",
    ],
)
def test_damaged_or_wrong_files_are_ignored_and_recomputed(
    criteo: DataSpec, tmp_path: Path, damage: str
) -> None:
    # Prepare: store the facts, then damage one of them.
    cache = tmp_path / "cache"
    reference = _party(criteo, cache)
    files = _derived_files(cache)
    train = next(p for p in files if p.name.endswith("-train.npy"))
    test = next(p for p in files if p.name.endswith("-test.npy"))
    ids, tst = np.load(train), np.load(test)
    if damage == "empty":  # what a crash before the data reached the disk leaves
        _replace(train, b"")
    elif damage == "truncate":
        _replace(train, train.read_bytes()[:100])
    elif damage == "shuffle":
        _replace(train, ids[::-1].copy())
    elif damage == "overlap":  # counts add up, but train repeats a test id
        _replace(train, np.sort(np.concatenate([ids[1:], tst[:1]])))
    elif damage == "swapped":  # a valid partition of the same sizes, not this split
        k = tst.size // 2
        _replace(train, np.sort(np.concatenate([ids[k:], tst[:k]])))
        _replace(test, np.sort(np.concatenate([tst[k:], ids[:k]])))
    elif damage == "foreign-dtype":
        _replace(train, ids.astype(np.float64))
    else:
        stats = _stored(cache, "stats")
        _replace(stats, np.full((2, 2), np.nan))

    # Execute
    again = _party(criteo, cache)

    # Assert: the same view as before, and the file is right again.
    _same(again, reference)
    assert np.array_equal(np.load(train), reference.train_ids)
    assert np.array_equal(np.load(test), reference.test_ids)


def test_a_second_start_computes_nothing_again(
    criteo: DataSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: count every pass that derives a fact from all rows.
    from tpsl_flwr.data.ctr import views as ctr_views

    calls: list[str] = []

    def counted(name: str, fn):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls.append(name)
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(
        ctr_views, "side_membership", counted("split", ctr_views.side_membership)
    )
    monkeypatch.setattr(views, "column_stats", counted("stats", views.column_stats))
    monkeypatch.setattr(derived, "table_range", counted("range", derived.table_range))
    cache = tmp_path / "cache"

    # Execute
    first = _party(criteo, cache)
    on_first = sorted(calls)
    calls.clear()
    second = _party(criteo, cache)

    # Assert: the first start derives each fact once, the second none.
    assert on_first == ["range", "split", "stats"]
    assert calls == []
    _same(first, second)


def test_a_table_out_of_range_is_refused_and_its_range_never_kept(
    criteo: DataSpec, tmp_path: Path
) -> None:
    # Prepare: a node entry whose table holds a code past its cardinality.
    cache = tmp_path / "cache"
    _party(criteo, cache)
    range_file = _stored(cache, "range")
    entry = range_file.parent.parent
    good = np.load(entry / "categorical.npy")
    range_file.unlink()
    bad = good.copy()
    bad[5, 0] = 1_000_000
    _replace(entry / "categorical.npy", bad)

    # Execute / Assert: refused, and no range stored for the bad table.
    with pytest.raises(ConfigError, match="must hold values in"):
        _party(criteo, cache)
    assert not range_file.exists()

    # Execute / Assert: the repaired table is accepted again.
    _replace(entry / "categorical.npy", good)
    _party(criteo, cache)
    assert range_file.exists()


def test_each_setting_keys_its_own_split(criteo: DataSpec, tmp_path: Path) -> None:
    # Prepare
    cache = tmp_path / "cache"
    _party(criteo, cache)

    # Execute: another seed and another fraction over the same entry.
    other_seed = _party(DataSpec(**{**criteo.__dict__, "seed": 7}), cache)
    other_frac = _party(DataSpec(**{**criteo.__dict__, "test_fraction": 0.3}), cache)
    again = _party(criteo, cache)

    # Assert: three splits stored side by side, none reused for another.
    splits = [p for p in _derived_files(cache) if p.name.startswith("split")]
    assert len(splits) == 6
    assert not np.array_equal(other_seed.test_ids, again.test_ids)
    assert other_frac.test_ids.size > again.test_ids.size


def test_avazu_time_split_is_stored_too(tmp_path: Path) -> None:
    # Prepare
    path = write_avazu(tmp_path / "train.csv", 2000, seed=1).path
    spec = DataSpec("avazu", data_path=str(path), split="time", hash_buckets=32)
    reference = load_party_view(spec, ["C1", "banner_pos"], cache_dir=tmp_path / "a")

    # Execute
    _fresh()
    load_party_view(spec, ["C1", "banner_pos"], cache_dir=tmp_path / "b")
    _fresh()
    again = load_party_view(spec, ["C1", "banner_pos"], cache_dir=tmp_path / "b")

    # Assert
    assert isinstance(again.train_ids, np.memmap)
    assert np.array_equal(again.train_ids, reference.train_ids)
    assert np.array_equal(again.test_ids, reference.test_ids)


def test_an_unwritable_cache_still_starts(
    criteo: DataSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: every attempt to create a derived file fails.
    reference = _party(criteo, tmp_path / "ref")

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError("read-only cache")

    monkeypatch.setattr(derived.tempfile, "mkstemp", refuse)

    # Execute
    got = _party(criteo, tmp_path / "cache")

    # Assert: computed as before, nothing stored.
    _same(got, reference)
    assert _derived_files(tmp_path / "cache") == []


def test_a_stored_range_out_of_bounds_fails_closed(
    criteo: DataSpec, tmp_path: Path
) -> None:
    # Prepare: a stored code range claiming a code past the cardinality.
    cache = tmp_path / "cache"
    _party(criteo, cache)
    stored = _stored(cache, "range")
    lo, hi = np.load(stored)
    _replace(stored, np.stack([lo, hi + 10_000]))

    # Execute / Assert: the view refuses rather than trusting the codes.
    with pytest.raises(ConfigError, match="must hold values in"):
        _party(criteo, cache)


def test_table_range_in_chunks_equals_numpy() -> None:
    # Prepare
    rng = np.random.default_rng(0)
    table = rng.integers(-50, 900, size=(1000, 3)).astype(np.int32)

    # Execute: 7 rows a pass, the last pass short.
    lo, hi = derived.table_range(table, chunk_rows=7)

    # Assert
    assert lo.tolist() == table.min(axis=0).tolist()
    assert hi.tolist() == table.max(axis=0).tolist()
