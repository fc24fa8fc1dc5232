"""The float dtype on the wire: exact float32, bounded float16, fail closed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import RecordDict
from flwr.common import serde

from tpsl_flwr.errors import ConfigError, ProtocolError
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.arrays import FLOAT16_STYPE, from_array, to_array
from tpsl_flwr.wire.batch_pack import gradient_batches, id_batches
from tpsl_flwr.wire.label_side import Node, step_message
from tpsl_flwr.wire.wire_dtype import decode_float16, encode_float16

RNG_SEED = 0


def _bound(x: np.ndarray) -> np.ndarray:
    """The module's stated error bound: 2^-11 |x| + peak 2^-38."""
    peak = float(np.max(np.abs(x)))
    return 2.0**-11 * np.abs(x) + peak * 2.0**-38


def test_float32_round_trip_is_exact():
    rng = np.random.default_rng(RNG_SEED)
    x = rng.standard_normal((64, 40)) * 10.0 ** rng.integers(-30, 30, (64, 40))
    x = x.astype(np.float32)
    y = from_array(to_array(x, "float32"))
    assert y.dtype == np.float32 and np.array_equal(x, y)


@pytest.mark.parametrize("scale", [1e-8, 1e-6, 1e-3, 1.0, 1e4, 1e30])
def test_float16_error_is_within_the_stated_bound(scale):
    # Gradients of a mean-reduced loss are ~1/batch: plain float16 would put
    # most of them in its subnormals; the power-of-two scale must not.
    rng = np.random.default_rng(RNG_SEED)
    x = (rng.standard_normal((1024, 40)) * scale).astype(np.float32)
    x[0, :3] = [0.0, scale * 1e-12, -scale * 1e-7]  # zero, deep and shallow tails
    array = to_array(x, "float16")
    assert array.stype == FLOAT16_STYPE
    assert len(array.data) == 2 + x.size * 2  # half float32's 4 bytes a value
    y = from_array(array)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert np.all(np.abs(y - x) <= _bound(x))
    # and the bound is tight enough to mean something: median relative error
    rel = np.abs(y - x)[x != 0] / np.abs(x[x != 0])
    assert float(np.median(rel)) < 2.0**-11


def test_float16_survives_flowers_protobuf():
    x = np.linspace(-3e-4, 5e-4, 120, dtype=np.float32).reshape(12, 10)
    arrays = {P.EMBEDDINGS_KEY: to_array(x, "float16")}
    record = RecordDict({P.EMBEDDINGS: _record(arrays)})
    back = serde.recorddict_from_proto(serde.recorddict_to_proto(record))
    y = from_array(back[P.EMBEDDINGS][P.EMBEDDINGS_KEY])
    assert np.all(np.abs(y - x) <= _bound(x))


def _record(arrays):
    from flwr.app import ArrayRecord

    return ArrayRecord(arrays)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_refused_before_encoding(bad):
    x = np.ones((4, 3), dtype=np.float32)
    x[2, 1] = bad
    with pytest.raises(ProtocolError, match="NaN or inf"):
        to_array(x, "float16")


def test_values_beyond_float16_range_are_scaled_not_overflowed():
    x = np.array([[3.0e38, -1.0e5, 65504.0, 70000.0]], dtype=np.float32)
    y = from_array(to_array(x, "float16"))
    assert np.all(np.isfinite(y)) and np.all(np.abs(y - x) <= _bound(x))


def test_truncated_or_padded_bytes_are_refused():
    data = encode_float16(np.ones((2, 3), dtype=np.float32))
    for wrong in (data[:-1], data + b"\x00\x00"):
        with pytest.raises(ProtocolError, match="needs 14 bytes"):
            decode_float16(wrong, (2, 3))


def test_a_forged_array_that_decodes_to_inf_is_refused():
    forged = (
        np.array(-120, dtype="<i2").tobytes()
        + np.array([60000.0], dtype="<f2").tobytes()
    )  # 60000 * 2^120 overflows float32
    with pytest.raises(ProtocolError, match="NaN or inf"):
        decode_float16(forged, (1,))


def test_ids_and_integers_stay_exact_under_float16():
    ids = np.arange(5, dtype=np.int64) * (2**40)
    assert np.array_equal(from_array(to_array(ids, "float16")), ids)


def test_unknown_wire_dtype_is_a_config_error():
    with pytest.raises(ConfigError, match="wire-dtype must be one of"):
        ExperimentConfig(wire_dtype="bfloat16")
    with pytest.raises(ConfigError, match="'int8'"):
        to_array(np.zeros(3, dtype=np.float32), "int8")


def test_step_message_sends_float16_gradients_that_pass_the_allow_list(
    server_identity,
):
    node = Node(node_id=7, partition=0, width=4, offset=2)
    grad = torch.randn(16, 8) * 1e-4
    ids = np.arange(16)
    msg = step_message(node, P.MSG_TRAIN, {P.EPOCH: 0}, [ids], [(ids, grad)], "float16")
    P.check_outgoing(msg.content)
    sent = msg.content.array_records[P.GRADS]
    assert sent[P.GRAD_KEY].stype == FLOAT16_STYPE
    [(sent_ids, got)] = gradient_batches(msg.content)
    want = grad[:, 2:6].numpy()
    assert np.array_equal(sent_ids, ids)
    assert got.shape == want.shape and np.all(np.abs(got - want) <= _bound(want))
    [asked] = id_batches(msg.content)
    assert np.array_equal(asked, ids)


def test_a_float16_run_sends_float16_both_ways_and_learns_as_float32(tmp_path):
    from tpsl_flwr.experiments.run import run_inprocess_experiment

    def run(wire_dtype):
        cfg = ExperimentConfig(
            dataset="breast-cancer",
            mechanism="laplace",
            epsilon=1.0,
            epochs=2,
            batch_size=64,
            steps_per_message=2,
            noise_seed=3,
            validation_fraction=0.0,
            checkpoint=False,
            wire_dtype=wire_dtype,
            out_dir=str(tmp_path / wire_dtype),
        )
        return run_inprocess_experiment(cfg, record_messages=True)

    half, grid = run("float16")
    full, _ = run("float32")
    train = [m for m in grid.sent_messages if m.metadata.message_type == P.MSG_TRAIN]
    grads = [a for m in train for a in m.content.array_records[P.GRADS].values()]
    assert {a.stype for a in grads if a.dtype != "int64"} == {FLOAT16_STYPE}
    embeddings = [
        a
        for r in grid.received_replies
        for a in r.content.array_records.get(P.EMBEDDINGS, {}).values()
    ]
    assert embeddings and {a.stype for a in embeddings} == {FLOAT16_STYPE}
    # Same seeds, same noise: float16's rounding moves the AUC by little
    # (measured 0.0000-0.003 here; stated tolerance 0.02).
    assert abs(half["test_auc"] - full["test_auc"]) < 0.02
