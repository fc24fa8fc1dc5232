import numpy as np
import pytest
from scipy import stats

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.privacy.keyed_noise import NoiseKey, open_uniforms


def test_same_key_and_id_give_same_words_in_any_batch_order():
    key = NoiseKey.from_seed(3)
    ids = np.arange(1000)
    full = key.words(ids, stream=1, count=5)
    shuffled = np.random.default_rng(0).permutation(ids)
    again = key.words(shuffled, stream=1, count=5)
    np.testing.assert_array_equal(again, full[shuffled])
    # A sub-batch gets the same words as in the full batch.
    np.testing.assert_array_equal(key.words(ids[10:20], 1, 5), full[10:20])


def test_key_survives_a_restart_via_hex():
    key = NoiseKey.from_os()
    restored = NoiseKey.from_hex(key.to_hex())
    ids = np.array([5, 17, 2**40])
    np.testing.assert_array_equal(key.words(ids, 2, 3), restored.words(ids, 2, 3))
    assert restored.fingerprint == key.fingerprint


def test_streams_counters_and_keys_differ():
    ids = np.arange(2000)
    a = NoiseKey.from_seed(1)
    words = a.words(ids, 1, 4)
    assert not np.any(words == a.words(ids, 2, 4))
    assert not np.any(words == NoiseKey.from_seed(2).words(ids, 1, 4))
    # Counter 0 and counter 2 come from different AES blocks.
    assert not np.any(words[:, 0] == words[:, 2])
    # Asking for fewer words gives a prefix of the same words.
    np.testing.assert_array_equal(a.words(ids, 1, 3), words[:, :3])


def test_uniforms_are_uniform():
    u = NoiseKey.from_seed(11).uniforms(np.arange(100_000), 1, 2).ravel()
    assert u.min() >= 0.0 and u.max() < 1.0
    result = stats.kstest(u, "uniform")
    assert result.pvalue > 1e-3
    # Neighbouring coordinates are uncorrelated.
    pairs = NoiseKey.from_seed(11).uniforms(np.arange(100_000), 1, 2)
    assert abs(np.corrcoef(pairs[:, 0], pairs[:, 1])[0, 1]) < 0.02


def test_open_uniforms_exclude_zero_and_one():
    words = np.array([0, 2**64 - 1], dtype=np.uint64)
    u = open_uniforms(words)
    assert 0.0 < u[0] < 1e-15 and 1 - 1e-15 < u[1] < 1.0


def test_seeded_keys_are_marked_not_secure_and_repr_hides_key():
    key = NoiseKey.from_seed(0)
    assert key.secure is False
    assert NoiseKey.from_os().secure is True
    assert key.key.hex() not in repr(key)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sample_ids": np.array([], dtype=np.int64)}, "empty"),
        ({"sample_ids": np.array([-1, 2])}, "got -1"),
        ({"sample_ids": np.array([0.5])}, "integers"),
        ({"stream": -1}, "stream"),
        ({"count": 0}, "count"),
    ],
)
def test_bad_inputs(kwargs, match):
    args = {"sample_ids": np.arange(3), "stream": 1, "count": 2} | kwargs
    with pytest.raises(ConfigError, match=match):
        NoiseKey.from_seed(0).words(**args)


def test_bad_keys():
    with pytest.raises(ConfigError, match="32 bytes, got 5"):
        NoiseKey(b"short")
    with pytest.raises(ConfigError, match="hex"):
        NoiseKey.from_hex("zz")
    with pytest.raises(ConfigError, match="seed must be an integer"):
        NoiseKey.from_seed("7")  # type: ignore[arg-type]


def test_words_at_reads_the_same_sequence_as_words():
    key = NoiseKey.from_seed(4)
    ids = np.array([0, 7, 2**40, 7])
    full = key.words(ids, 3, 40)
    starts = np.array([0, 5, 11, 2])
    got = key.words_at(ids, 3, starts, count=6, stride=3)
    for row, start in enumerate(starts):
        np.testing.assert_array_equal(got[row], full[row, start : start + 18 : 3])
    with pytest.raises(ConfigError, match="starts must be 4 indices"):
        key.words_at(ids, 3, [0, 1])
    with pytest.raises(ConfigError, match="past"):
        key.words_at(ids[:1], 3, [2**33])
