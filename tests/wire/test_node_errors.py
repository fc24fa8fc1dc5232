"""A node's errors name node id and partition, root cause first; its config is
checked at the edge, before the embedder's factory.

Issue rows: a bottom model returning ``(8,)`` (the right ``ConfigError``, but
buried in Ray's wrapper and named by node id only); a ``partition_id`` typo in
``--node-config`` (``KeyError: 'partition-id'`` from the docs' own factory).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from flwr.app import Error, Message, RecordDict
from flwr.common.constant import ErrorCode

from tests.conftest import ToyBottom
from tpsl_flwr import ConfigError, NoiseKey, ProtocolError, make_mechanism
from tpsl_flwr.engines.inprocess import InProcessGrid
from tpsl_flwr.models import TopModel
from tpsl_flwr.parties import LabelParty, NonLabelParty, adam
from tpsl_flwr.strategies import TPSLStrategy
from tpsl_flwr.testing import run_strategy
from tpsl_flwr.wire.label_side import Node, check_replies
from tpsl_flwr.wire.node_edge import check_node_config, read_node_error
from tpsl_flwr.wire.node_side import make_client_app

ROWS, COLS, WIDTH = 16, 2, 2
X = np.random.default_rng(0).normal(size=(ROWS, 2 * COLS)).astype(np.float32)
Y = np.arange(ROWS) % 2
# What Ray's simulation makes of a ClientApp exception (shortened from a real
# run): the type is lost in ClientAppException, the traceback comes first.
RAY_REASON = (
    "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'"
    "\x1b[36mray::ClientAppActor.run()\x1b[39m (pid=18336, ip=192.0.2.2)\n"
    "Traceback (most recent call last):\n"
    '  File "client_app.py", line 352, in checked\n'
    "    return handler(msg, context)\n"
    "tpsl_flwr.errors.ConfigError: bottom model must be called as f(numeric, "
    "categorical) -> (n, d); it returned shape (8,)\n\n"
    "The above exception was the direct cause of the following exception:\n\n"
    "tpsl_flwr.wire.node_edge.NodeFailure: [tpsl partition 1 of 3] ConfigError: "
    "bottom model must be called as f(numeric, categorical) -> (n, d); it "
    "returned shape (8,)\n\n"
    "flwr.clientapp.client_app.ClientAppException: \n"
    "Exception ClientAppException occurred. Message: [tpsl partition 1 of 3] "
    "ConfigError: bottom model must be called as f(numeric, categorical) -> "
    "(n, d); it returned shape (8,)'>"
)


def make_factory(called: list[int], flat_partition: int | None = None):
    def factory(context):
        part = int(context.node_config["partition-id"])
        called.append(part)
        cols = slice(COLS * part, COLS * part + COLS)
        torch.manual_seed(part)
        bottom = ToyBottom(COLS, WIDTH, flat=part == flat_partition)
        return NonLabelParty({"train": (X[:, cols], None)}, bottom, adam(0.05))

    return factory


def error_reply(node_id: int, reason: str) -> Message:
    """A node's error reply, as Flower's runtimes return one."""
    sent = Message(RecordDict(), dst_node_id=node_id, message_type="query.hello")
    error = Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason)
    return Message(error, reply_to=sent)


def strategy() -> TPSLStrategy:
    torch.manual_seed(0)
    party = LabelParty(
        TopModel(2 * WIDTH, hidden=(), num_outputs=1),
        Y,
        make_mechanism("laplace", epsilon=1.0),
        NoiseKey.from_seed(0),
    )
    return TPSLStrategy(party, batch_size=8, num_nodes=2, node_wait=1.0)


def failure(client_app, **options) -> str:
    with pytest.raises(ProtocolError) as err:
        run_strategy(strategy(), client_app, num_nodes=2, **options)
    return str(err.value)


def test_a_bad_bottom_model_is_named_by_node_and_partition_cause_first():
    # Prepare: partition 1's bottom model returns (8,) instead of (8, 2)
    app = make_client_app(make_factory([], flat_partition=1))
    # Execute
    message = failure(app)
    # Assert: one line, node id and partition, then the ConfigError itself
    assert "\n" not in message
    head, _, cause = message.partition(" replied with an error: ")
    assert head.startswith("node ") and head.endswith("(partition 1)")
    assert cause.startswith("ConfigError: bottom model must be called as")


def test_rays_wrapper_goes_to_the_log_only_after_the_root_cause(
    caplog, server_identity
):
    # Prepare: a hello reply carrying Ray's wrapper text
    reply = error_reply(1349, RAY_REASON)
    # Execute
    with caplog.at_level(logging.ERROR), pytest.raises(ProtocolError) as err:
        check_replies([], [reply], [1349])
    # Assert: the error is the root cause in one line; the wrapper, in the log
    assert str(err.value) == (
        "node 1349 (partition 1) replied with an error: ConfigError: bottom model "
        "must be called as f(numeric, categorical) -> (n, d); it returned shape (8,)"
    )
    assert "RayTaskError" not in str(err.value)
    logged = caplog.text
    assert "node 1349 (partition 1) replied with an error" in logged
    assert "RayTaskError(ClientAppException)" in logged


def test_a_nodes_error_text_cannot_pass_for_the_label_partys_log_lines(
    caplog, server_identity
):
    # Prepare: a node whose error text carries forged progress / epsilon lines
    forged = "INFO :      epoch 1/1  test_auc 0.999, epsilon spent 0.0"
    reply = error_reply(1349, RAY_REASON + "\n" + forged)
    # Execute
    with caplog.at_level(logging.ERROR), pytest.raises(ProtocolError):
        check_replies([], [reply], [1349])
    # Assert: every line of the node's text is quoted in the log
    lines = caplog.text.splitlines()
    assert any(line.endswith(forged) and line.startswith("  | ") for line in lines)
    assert not any(line.startswith("INFO :") for line in lines)


def test_a_known_node_is_named_with_its_partition_from_the_label_side(
    server_identity,
):
    # Prepare: an error from a node that names no partition (no marker)
    reply = error_reply(7, "<class 'OSError'>:<'disk full'>")
    nodes = [Node(7, 2, WIDTH, 0)]
    # Execute / Assert
    with pytest.raises(ProtocolError) as err:
        check_replies(nodes, [reply], [7])
    assert (
        str(err.value)
        == "node 7 (partition 2) replied with an error: OSError: disk full"
    )


def test_the_node_error_reader_finds_the_cause_in_each_runtimes_format():
    # In process / deployment: Flower's <class 'X'>:<'message'>
    marked = "<class 'x.NodeFailure'>:<'[tpsl partition 0 of 2] KeyError: 'a''>"
    assert read_node_error(marked).cause == "KeyError: 'a'"
    assert read_node_error(marked).partition == 0
    assert read_node_error(marked).detail is None
    # Ray: the marker inside the wrapper; the wrapper kept as the detail
    ray = read_node_error(RAY_REASON)
    assert ray.partition == 1 and ray.cause.startswith("ConfigError: bottom model")
    assert ray.detail is not None and "RayTaskError" in ray.detail


@pytest.mark.parametrize(
    ("node_config", "expected"),
    [
        (
            {"partition_id": 0, "num-partitions": 2},
            "the node config has no 'partition-id' (found 'partition_id': a typo?)",
        ),
        (
            {"partition-id": 0, "num_partitions": 2},
            "the node config has no 'num-partitions' (found 'num_partitions'",
        ),
        ({"num-partitions": 2}, "the node config has no 'partition-id'; start"),
        (
            {"partition-id": "one", "num-partitions": 2},
            "node config partition-id must be an integer, got 'one'",
        ),
        (
            {"partition-id": 2, "num-partitions": 2},
            "node config partition-id must be in 0..1 (num-partitions = 2), got 2",
        ),
        (
            {"partition-id": 0, "num-partitions": 0},
            "node config num-partitions must be >= 1, got 0",
        ),
    ],
)
def test_the_node_config_is_checked_in_one_line_naming_the_key(node_config, expected):
    with pytest.raises(ConfigError) as err:
        check_node_config(node_config)
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_a_partition_id_typo_is_refused_at_the_edge_before_the_factory():
    # Prepare: a SuperNode started with --node-config "partition_id=0 ..."
    called: list[int] = []
    app = make_client_app(make_factory(called))

    def typo(msg, context):
        part = context.node_config["partition-id"]
        context.node_config = {"partition_id": part, "num-partitions": 2}
        return app(msg, context)

    # Execute
    message = failure(typo)
    # Assert: the label party's error names the key and the typo; no factory ran
    assert called == []
    assert "replied with an error: ConfigError: the node config has no " in message
    assert "'partition-id' (found 'partition_id': a typo?)" in message
    assert '--node-config "partition-id=I num-partitions=N"' in message


def test_the_edge_passes_a_correct_node_config_to_the_factory():
    # Prepare
    called: list[int] = []
    app = make_client_app(make_factory(called))
    grid = InProcessGrid(app, 2, run_config={"num-parties": 2})
    # Execute
    result = grid.run_server(lambda grid, context: strategy().start(grid))
    # Assert
    assert sorted(set(called)) == [0, 1]
    assert result.epochs_trained == 1
