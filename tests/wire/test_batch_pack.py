"""A message's batches packed in one array per record (``wire/batch_pack``)."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from tpsl_flwr.errors import PrivacyError, ProtocolError
from tpsl_flwr.wire import protocol as P
from tpsl_flwr.wire.arrays import FLOAT16_STYPE, to_array
from tpsl_flwr.wire.batch_pack import (
    gradient_batches,
    id_batches,
    row_counts,
    split_rows,
    stack_rows,
)
from tpsl_flwr.wire.label_side import Node, gather_embeddings, step_message

SIZES = (4, 4, 2)
"""K = 3 batches a message, the last one short."""
NODES = (
    Node(node_id=11, partition=0, width=2, offset=0),
    Node(node_id=22, partition=1, width=3, offset=2),
)
TOTAL_WIDTH = 5


def _batches(seed: int = 0):
    """Three batches of ids and their (n, TOTAL_WIDTH) perturbed gradients."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(20)
    starts = np.cumsum((0, *SIZES))
    ids = [order[a:b] for a, b in itertools.pairwise(starts)]
    grads = [
        torch.as_tensor(rng.normal(size=(n, TOTAL_WIDTH)) * 1e-3, dtype=torch.float32)
        for n in SIZES
    ]
    return ids, grads


def _bound(x: np.ndarray, peak: float) -> np.ndarray:
    """float16's stated error: 2^-11 |x| + (the encoded array's peak) 2^-38."""
    return 2.0**-11 * np.abs(x) + peak * 2.0**-38


# ------------------------------------------------------ stack_rows, split_rows
def test_stack_rows_and_split_rows_round_trip():
    # Prepare
    parts = [np.arange(6.0).reshape(3, 2), np.zeros((0, 2)), np.ones((1, 2))]

    # Execute
    stacked, counts = stack_rows(parts)
    back = split_rows(stacked, row_counts(counts, "rows"), "values")

    # Assert: the rows in order, the counts as text, each part back as it was
    assert stacked.shape == (4, 2) and counts == "3,0,1"
    assert len(back) == 3
    for got, want in zip(back, parts, strict=True):
        np.testing.assert_array_equal(got, want)
        assert got.shape == want.shape


@pytest.mark.parametrize(
    "bad", ["", "1,x", "-1", "4,,2", None, 3, " 3", "+3", "3_0", "\u0663", "1" * 13]
)
def test_row_counts_refuses_anything_but_a_list_of_counts_naming_it(bad):
    with pytest.raises(ProtocolError, match=rf"^batch-rows .*{re.escape(repr(bad))}"):
        row_counts(bad, "batch-rows")


def test_row_counts_reads_a_list_of_counts():
    assert row_counts("1024,1024,512", "batch-rows") == [1024, 1024, 512]
    assert row_counts("0", "grad-rows") == [0]


@pytest.mark.parametrize("counts", [[3, 2], [3, 0], [5], [1, 1, 1]])
def test_split_rows_refuses_counts_that_do_not_add_up(counts):
    values = np.arange(8).reshape(4, 2)
    with pytest.raises(ProtocolError, match=r"ids holds 4 rows, but its row counts"):
        split_rows(values, counts, "ids")


# ------------------------------------------- what step_message sends, read back
@pytest.mark.parametrize("wire_dtype", ["float32", "float16"])
def test_each_node_reads_its_own_columns_of_each_batch_in_order(
    server_identity, wire_dtype
):
    # Prepare: the K = 3 batches asked for and the 3 gradients of earlier steps
    new_ids, _ = _batches(seed=1)
    done_ids, grads = _batches(seed=2)
    pending = list(zip(done_ids, grads, strict=True))

    for node in NODES:
        # Execute
        msg = step_message(
            node, P.MSG_TRAIN, {P.EPOCH: 0}, new_ids, pending, wire_dtype
        )

        # Assert: one array per key, the row counts in the public config
        P.check_outgoing(msg.content)
        assert list(msg.content.array_records[P.NEW_IDS]) == [P.IDS_KEY]
        assert set(msg.content.array_records[P.GRADS]) == {P.IDS_KEY, P.GRAD_KEY}
        config = msg.content.config_records[P.CONFIG]
        assert config[P.BATCH_ROWS] == config[P.GRAD_ROWS] == "4,4,2"
        sent = msg.content.array_records[P.GRADS][P.GRAD_KEY]
        assert (sent.stype == FLOAT16_STYPE) == (wire_dtype == "float16")

        # Assert: each batch of ids in order, int64
        asked = id_batches(msg.content)
        assert len(asked) == 3
        for got, want in zip(asked, new_ids, strict=True):
            assert got.dtype == np.int64
            np.testing.assert_array_equal(got, want)

        # Assert: each gradient with its ids, exactly the node's columns
        got_grads = gradient_batches(msg.content)
        assert len(got_grads) == 3
        cols = slice(node.offset, node.offset + node.width)
        want_all = np.concatenate([g[:, cols].numpy() for g in grads])
        peak = float(np.max(np.abs(want_all)))
        for (ids, grad), want_ids, full in zip(got_grads, done_ids, grads, strict=True):
            want = full[:, cols].numpy()
            assert ids.dtype == np.int64
            np.testing.assert_array_equal(ids, want_ids)
            assert grad.dtype == np.float32 and grad.shape == want.shape
            if wire_dtype == "float32":
                np.testing.assert_array_equal(grad, want)
            else:
                assert np.all(np.abs(grad - want) <= _bound(want, peak))


def test_a_first_message_with_no_gradients_carries_no_gradient_batches(
    server_identity,
):
    # Prepare
    new_ids, _ = _batches()

    # Execute
    msg = step_message(NODES[0], P.MSG_TRAIN, {P.EPOCH: 0}, new_ids, [])

    # Assert: an empty gradient record, no grad-rows, and nothing to apply
    P.check_outgoing(msg.content)
    assert len(msg.content.array_records[P.GRADS]) == 0
    assert P.GRAD_ROWS not in msg.content.config_records[P.CONFIG]
    assert gradient_batches(msg.content) == []
    assert [b.size for b in id_batches(msg.content)] == list(SIZES)


def test_a_message_without_ids_asks_for_no_batches(server_identity):
    _, grads = _batches()
    msg = step_message(NODES[1], P.MSG_TRAIN, {}, [], [(np.arange(4), grads[0])])
    assert len(msg.content.array_records[P.NEW_IDS]) == 0
    assert P.BATCH_ROWS not in msg.content.config_records[P.CONFIG]
    assert id_batches(msg.content) == []
    assert len(gradient_batches(msg.content)) == 1
    assert id_batches(RecordDict()) == [] and gradient_batches(RecordDict()) == []


# ------------------------------------------------------------ malformed records
def _content(record: str, arrays: dict, rows: str | None = "2,1") -> RecordDict:
    config = ConfigRecord(
        {} if rows is None else {P.BATCH_ROWS: rows, P.GRAD_ROWS: rows}
    )
    return RecordDict({P.CONFIG: config, record: ArrayRecord(arrays)})


IDS = to_array(np.arange(3, dtype=np.int64))
GRAD = to_array(np.ones((3, 2), dtype=np.float32))


@pytest.mark.parametrize(
    ("read", "record", "arrays", "match"),
    [
        (
            id_batches,
            P.NEW_IDS,
            {P.IDS_KEY: IDS, "labels": IDS},
            r"tpsl\.ids must hold exactly the arrays \['ids'\]; missing \[\], "
            r"unexpected \['labels'\]",
        ),
        (
            id_batches,
            P.NEW_IDS,
            {"batch-0": IDS},
            r"missing \['ids'\], unexpected \['batch-0'\]",
        ),
        (
            gradient_batches,
            P.GRADS,
            {P.IDS_KEY: IDS},
            r"tpsl\.grads must hold exactly the arrays \['ids', 'grad'\]; "
            r"missing \['grad'\], unexpected \[\]",
        ),
        (
            gradient_batches,
            P.GRADS,
            {P.IDS_KEY: IDS, P.GRAD_KEY: GRAD, "grad-1": GRAD},
            r"missing \[\], unexpected \['grad-1'\]",
        ),
    ],
)
def test_a_record_with_an_extra_or_a_missing_key_is_refused(
    read, record, arrays, match
):
    with pytest.raises(ProtocolError, match=match):
        read(_content(record, arrays))


def test_a_record_without_or_with_wrong_row_counts_is_refused():
    with pytest.raises(ProtocolError, match=r"batch-rows must list .* got None"):
        id_batches(_content(P.NEW_IDS, {P.IDS_KEY: IDS}, rows=None))
    with pytest.raises(ProtocolError, match=r"tpsl\.ids\[ids\] holds 3 rows"):
        id_batches(_content(P.NEW_IDS, {P.IDS_KEY: IDS}, rows="2,2"))
    short = to_array(np.ones((2, 2), dtype=np.float32))
    with pytest.raises(ProtocolError, match=r"tpsl\.grads\[grad\] holds 2 rows"):
        gradient_batches(_content(P.GRADS, {P.IDS_KEY: IDS, P.GRAD_KEY: short}))


# -------------------------------------------------------------- the allow-list
@pytest.mark.parametrize(
    ("record", "key"),
    [(P.NEW_IDS, "labels"), (P.GRADS, "labels"), (P.NEW_IDS, "batch-0")],
)
def test_the_allow_list_takes_the_packed_message_and_refuses_any_other_key(
    server_identity, record, key
):
    # Prepare: a packed message with gradients, which passes
    new_ids, grads = _batches()
    pending = list(zip(new_ids, grads, strict=True))
    msg = step_message(NODES[0], P.MSG_TRAIN, {P.EPOCH: 1}, new_ids, pending)
    P.check_outgoing(msg.content)

    # Execute / Assert: one more array in a record is refused, naming it
    msg.content[record][key] = Array(np.zeros(4))
    with pytest.raises(PrivacyError, match=f"array '{key}' of '{record}'"):
        P.check_outgoing(msg.content)


def _packed(server_identity):
    new_ids, grads = _batches()
    pending = list(zip(new_ids, grads, strict=True))
    return step_message(NODES[0], P.MSG_TRAIN, {P.EPOCH: 1}, new_ids, pending)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (  # free text in a row-count key
            lambda c: c[P.CONFIG].__setitem__(P.BATCH_ROWS, "y=0,1,1,0,1"),
            r"'tpsl\.ids' may not leave .* got 'y=0,1,1,0,1'",
        ),
        (  # counts that do not add up to the rows sent
            lambda c: c[P.CONFIG].__setitem__(P.GRAD_ROWS, "4,4,1"),
            r"array 'ids' of 'tpsl\.grads' \(int64, shape \(10,\)\) .* the 9 rows",
        ),
        (  # float ids
            lambda c: c[P.NEW_IDS].__setitem__(P.IDS_KEY, Array(np.zeros(10))),
            r"array 'ids' of 'tpsl\.ids' \(float64, .* 1-D int64",
        ),
        (  # ids without their gradient
            lambda c: c[P.GRADS].__delitem__(P.GRAD_KEY),
            r"'tpsl\.grads' must hold all of \['grad', 'ids'\]",
        ),
        (  # a row-count key with nothing to count
            lambda c: c.__setitem__(P.NEW_IDS, ArrayRecord()),
            r"'batch-rows' is sent without arrays in 'tpsl\.ids'",
        ),
    ],
)
def test_the_allow_list_checks_the_row_counts_and_the_layout(
    server_identity, change, match
):
    # Prepare: a packed message that passes
    msg = _packed(server_identity)
    P.check_outgoing(msg.content)

    # Execute / Assert: the row counts carry nothing but the batches' lengths
    change(msg.content)
    with pytest.raises(PrivacyError, match=match):
        P.check_outgoing(msg.content)


def test_a_node_refuses_float_ids_rather_than_truncating_them():
    floats = to_array(np.array([0.7, 1.9, 2.0]))
    with pytest.raises(
        ProtocolError, match=r"must be a 1-D integer array, got float64"
    ):
        id_batches(_content(P.NEW_IDS, {P.IDS_KEY: floats}))
    with pytest.raises(
        ProtocolError, match=r"tpsl\.grads\[ids\] must be a 1-D integer"
    ):
        gradient_batches(_content(P.GRADS, {P.IDS_KEY: floats, P.GRAD_KEY: GRAD}))


@pytest.mark.parametrize(
    ("values", "match"),
    [
        (np.ones((3, 2), dtype=np.int64), r"sent int64 embeddings; expected floats"),
        (np.ones((3, 2), dtype=np.complex64), r"sent complex64 embeddings"),
        (np.full((3, 2), 1e300), r"sent NaN or inf embeddings"),  # inf as float32
    ],
)
def test_a_reply_of_non_float_or_overflowing_embeddings_is_refused(
    server_identity, values, match
):
    node = Node(node_id=11, partition=0, width=2, offset=0)
    reply = Message(
        RecordDict({P.EMBEDDINGS: ArrayRecord({P.EMBEDDINGS_KEY: Array(values)})}),
        dst_node_id=0,
        message_type=P.MSG_TRAIN,
    )
    with pytest.raises(ProtocolError, match=rf"node 11 \(partition 0\) {match}"):
        gather_embeddings([node], {11: reply}, [np.arange(2), np.arange(1)])


# ------------------------------------------------ the replies, split per batch
@pytest.mark.parametrize("wire_dtype", ["float32", "float16"])
def test_stacked_replies_are_split_back_into_each_batchs_embeddings(
    server_identity, wire_dtype
):
    # Prepare: each node embeds the 3 batches asked for, stacked in one array
    new_ids, _ = _batches()
    rng = np.random.default_rng(3)
    per_node = {
        node.node_id: [
            rng.normal(size=(ids.size, node.width)).astype(np.float32)
            for ids in new_ids
        ]
        for node in NODES
    }
    replies = {}
    for node in NODES:
        msg = step_message(node, P.MSG_TRAIN, {}, new_ids, [])
        stacked, _ = stack_rows(per_node[node.node_id])
        record = ArrayRecord({P.EMBEDDINGS_KEY: to_array(stacked, wire_dtype)})
        replies[node.node_id] = Message(
            RecordDict({P.EMBEDDINGS: record}), reply_to=msg
        )

    # Execute
    got = gather_embeddings(list(NODES), replies, new_ids)

    # Assert: batch j is node 0's then node 1's embeddings of batch j
    assert len(got) == 3
    for j, emb in enumerate(got):
        want = np.concatenate([per_node[n.node_id][j] for n in NODES], axis=1)
        assert emb.shape == (SIZES[j], TOTAL_WIDTH) and emb.dtype == torch.float32
        if wire_dtype == "float32":
            np.testing.assert_array_equal(emb.numpy(), want)
        else:
            np.testing.assert_allclose(emb.numpy(), want, rtol=2.0**-10, atol=1e-6)
