"""The in-process engine's nodes on threads of their own (``concurrent_nodes``)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from tpsl_flwr.engines.inprocess import InProcessGrid
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.run import run_inprocess_experiment


def _messages(grid: InProcessGrid, per_node: int = 1) -> list[Message]:
    return [
        Message(RecordDict({"c": ConfigRecord({"k": k})}), node, "query")
        for k in range(per_node)
        for node in grid.get_node_ids()
    ]


def _barrier_app(barrier: threading.Barrier) -> Any:
    def app(message: Message, context: Context) -> Message:
        barrier.wait()  # passes only if every node is in here at once
        name = threading.current_thread().name
        return Message(RecordDict({"r": ConfigRecord({"t": name})}), reply_to=message)

    return app


def test_nodes_run_at_the_same_time_only_when_concurrent() -> None:
    for concurrent in (True, False):
        barrier = threading.Barrier(3, timeout=2.0)
        grid = InProcessGrid(_barrier_app(barrier), 3, concurrent_nodes=concurrent)
        with grid.server_identity():
            replies = list(grid.send_and_receive(_messages(grid)))
        grid.close()
        assert len(replies) == 3
        if concurrent:
            assert not any(r.has_error() for r in replies)
            threads = {r.content["r"]["t"] for r in replies}
            assert len(threads) == 3 and threading.current_thread().name not in threads
        else:  # one after another: the first node waits for the others in vain
            assert all(r.has_error() for r in replies)


def test_a_node_handles_its_messages_in_push_order() -> None:
    seen: dict[int, list[int]] = {}

    def app(message: Message, context: Context) -> Message:
        seen.setdefault(context.node_id, []).append(int(message.content["c"]["k"]))
        return Message(RecordDict(), reply_to=message)

    grid = InProcessGrid(app, 2, concurrent_nodes=True, seed=3)
    with grid.server_identity():
        ids = list(grid.push_messages(_messages(grid, per_node=20)))
        replies: list[Message] = []
        while len(replies) < len(ids):  # what a pull finds ready, as Flower's
            replies += grid.pull_messages(ids)
    grid.close()
    assert sorted(r.metadata.reply_to_message_id for r in replies) == sorted(ids)
    assert {n: order for n, order in seen.items()} == {
        n: list(range(20)) for n in grid.get_node_ids()
    }


def test_the_server_identity_stays_while_nodes_run() -> None:
    concurrent = InProcessGrid(
        _barrier_app(threading.Barrier(2, timeout=2.0)), 2, concurrent_nodes=True
    )
    with concurrent.server_identity():
        replies = list(concurrent.send_and_receive(_messages(concurrent)))
        assert TaskIdentity.node_id == SUPERLINK_NODE_ID
        # A message built now is the server's, whatever the nodes set.
        built = _messages(concurrent)[0]
        assert built.metadata.src_node_id == SUPERLINK_NODE_ID
    concurrent.close()
    assert {r.metadata.src_node_id for r in replies} == set(concurrent.get_node_ids())


def test_an_app_error_is_an_error_reply_and_a_hook_error_reaches_the_server() -> None:
    def failing(message: Message, context: Context) -> Message:
        raise RuntimeError("boom in the node")

    grid = InProcessGrid(failing, 2, concurrent_nodes=True)
    with grid.server_identity():
        replies = list(grid.send_and_receive(_messages(grid)))
    grid.close()
    assert all(r.has_error() and "boom in the node" in r.error.reason for r in replies)

    def hook(message: Message) -> None:
        raise ValueError("hook refused the message")

    echo = InProcessGrid(
        lambda m, c: Message(RecordDict(), reply_to=m),
        2,
        concurrent_nodes=True,
        on_message=hook,
    )
    with echo.server_identity(), pytest.raises(ValueError, match="hook refused"):
        echo.send_and_receive(_messages(echo))
    echo.close()


def test_run_server_ends_the_node_threads() -> None:
    before = threading.active_count()
    grid = InProcessGrid(
        _barrier_app(threading.Barrier(4, timeout=2.0)), 4, concurrent_nodes=True
    )

    def main(g: InProcessGrid, context: Context) -> int:
        replies = list(g.send_and_receive(_messages(g)))
        assert threading.active_count() >= before + 4
        return sum(not r.has_error() for r in replies)

    assert grid.run_server(main) == 4
    assert threading.active_count() == before


def _without_timings(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _without_timings(v)
            for k, v in value.items()
            if "second" not in k and "time" not in k
        }
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def test_a_seeded_run_trains_the_same_with_the_nodes_side_by_side(tmp_path) -> None:
    histories = []
    for concurrent in (False, True):
        cfg = ExperimentConfig(
            dataset="synthetic-ctr",
            rows=3000,
            mechanism="laplace",
            epsilon=1.0,
            epochs=2,
            batch_size=256,
            num_parties=3,
            noise_seed=0,
            new_release=True,  # the same labels twice, seeded: a rehearsal
            checkpoint=False,
            out_dir=str(tmp_path / str(concurrent)),
        )
        results, _ = run_inprocess_experiment(cfg, concurrent_nodes=concurrent)
        histories.append(_without_timings(results["history"]))
    assert histories[0] == histories[1]
    assert histories[0][-1]["test_auc"] > 0.5
