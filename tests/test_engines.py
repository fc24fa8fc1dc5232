"""Engines: in-process grid, Ray simulation via `flwr run`, loopback deployment."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from tpsl_flwr.errors import ConfigError
from tpsl_flwr.simulations.inprocess import InProcessGrid, run_inprocess
from tpsl_flwr.simulations.launch import (
    CompletedRun,
    DeploymentRuntime,
    FlowerLaunchError,
    find_launched_processes,
    offline_flower_env,
    run_flwr_simulation,
)

TOY_APP_DIR = Path(__file__).parent / "flower_toy_app"
if str(TOY_APP_DIR) not in sys.path:
    sys.path.insert(0, str(TOY_APP_DIR))

from flwr_toy_app.client_app import app as toy_client  # noqa: E402
from flwr_toy_app.server_app import app as toy_server  # noqa: E402
from flwr_toy_app.server_app import main as toy_main  # noqa: E402

TOY_CONFIG: dict[str, Any] = {
    "num-rounds": 2,
    "expected-nodes": 3,
    "result-path": "",
    "fail-partition": -1,
    "wait-for-nodes-s": 1.0,
}


def _assert_toy_result(result: dict[str, Any], num_nodes: int, rounds: int) -> None:
    node_ids = result["node-ids"]
    assert len(node_ids) == num_nodes
    assert not set(node_ids) & set(range(num_nodes))  # ids are not partitions
    assert len(result["rounds"]) == rounds
    for r, replies in enumerate(result["rounds"], start=1):
        assert sorted(e["partition-id"] for e in replies) == list(range(num_nodes))
        for entry in replies:
            assert entry["counter"] == r  # context.state persisted across rounds
            assert entry["num-partitions"] == num_nodes
            assert entry["node-id"] == str(entry["src-node-id"])
    # The same node keeps the same partition in every round
    first = {e["src-node-id"]: e["partition-id"] for e in result["rounds"][0]}
    for replies in result["rounds"]:
        assert {e["src-node-id"]: e["partition-id"] for e in replies} == first


# ------------------------------------------------------------------ in-process
def test_inprocess_runs_toy_app_unchanged() -> None:
    # Execute
    result = run_inprocess(toy_server, toy_client, 3, TOY_CONFIG)

    # Assert
    _assert_toy_result(result, num_nodes=3, rounds=2)


def test_inprocess_accepts_plain_main_function() -> None:
    config = {**TOY_CONFIG, "num-rounds": 1, "expected-nodes": 2}
    result = run_inprocess(toy_main, toy_client, 2, config)
    _assert_toy_result(result, num_nodes=2, rounds=1)


def test_inprocess_state_is_per_node_and_persistent() -> None:
    # Prepare
    grid = InProcessGrid(toy_client, 3, run_config={**TOY_CONFIG, "num-rounds": 4})

    # Execute
    grid.run_server(toy_server)

    # Assert
    for node in grid.nodes:
        assert node.context.state.config_records["toy-state"]["counter"] == 4
        assert node.context.node_config == {
            "partition-id": node.partition_id,
            "num-partitions": 3,
        }
        assert grid.partition_of(node.node_id) == node.partition_id


def test_inprocess_node_configs_and_run_config_reach_nodes() -> None:
    seen: list[tuple[Any, Any, Any]] = []

    def client(msg: Message, context: Context) -> Message:
        seen.append(
            (
                context.node_config["partition-id"],
                context.node_config["data-dir"],
                context.run_config["lr"],
            )
        )
        return Message(RecordDict(), reply_to=msg)

    def main(grid: Grid, context: Context) -> int:
        assert context.run_config == {"lr": 0.5}
        msgs = [Message(RecordDict(), n, "query") for n in grid.get_node_ids()]
        return len(list(grid.send_and_receive(msgs)))

    n = run_inprocess(
        main,
        client,
        2,
        {"lr": 0.5},
        node_configs=[{"data-dir": "a"}, {"data-dir": "b"}],
    )
    assert n == 2
    assert sorted(seen) == [(0, "a", 0.5), (1, "b", 0.5)]


def test_inprocess_handler_error_becomes_error_reply() -> None:
    # Prepare
    grid = InProcessGrid(toy_client, 3, run_config={**TOY_CONFIG, "fail-partition": 1})

    # Execute
    result = grid.run_server(toy_server)

    # Assert
    for replies in result["rounds"]:
        errors = [e for e in replies if "error" in e]
        assert len(errors) == 1
        assert grid.partition_of(errors[0]["src-node-id"]) == 1
        assert (
            errors[0]["error"]
            == "<class 'RuntimeError'>:<'toy failure on partition 1'>"
        )
        assert sorted(e["partition-id"] for e in replies if "error" not in e) == [0, 2]


def test_inprocess_failed_handler_does_not_update_state() -> None:
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        context.state["seen"] = ConfigRecord({"n": 1})
        if msg.content["c"]["fail"]:
            raise ValueError("after mutating state")
        return Message(RecordDict(), reply_to=msg)

    grid = InProcessGrid(app, 1)
    (node_id,) = grid.get_node_ids()
    with grid.server_identity():
        bad = Message(RecordDict({"c": ConfigRecord({"fail": True})}), node_id, "train")
        (reply,) = grid.send_and_receive([bad])
    assert reply.has_error()
    assert reply.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    assert reply.metadata.src_node_id == node_id
    assert reply.metadata.reply_to_message_id == bad.metadata.message_id
    assert "seen" not in grid.node_context(node_id).state

    with grid.server_identity():
        good = Message(
            RecordDict({"c": ConfigRecord({"fail": False})}), node_id, "train"
        )
        (reply,) = grid.send_and_receive([good])
    assert not reply.has_error()
    assert "seen" in grid.node_context(node_id).state


def test_inprocess_routes_actions_like_flower() -> None:
    grid = InProcessGrid(toy_client, 1)
    (node_id,) = grid.get_node_ids()
    content = RecordDict({"x": ConfigRecord({"v": 7})})
    with grid.server_identity():
        echo = Message(content, node_id, "query.echo")
        missing = Message(RecordDict(), node_id, "evaluate.nothing")
        replies = {
            r.metadata.reply_to_message_id: r
            for r in grid.send_and_receive([echo, missing])
        }
    assert replies[echo.metadata.message_id].content["x"]["v"] == 7
    err = replies[missing.metadata.message_id]
    assert err.has_error()
    assert "No evaluate function registered with name 'nothing'" in (
        err.error.reason or ""
    )


def test_inprocess_node_ids_are_random_and_seedable() -> None:
    ids_a = sorted(InProcessGrid(toy_client, 4).get_node_ids())
    ids_b = sorted(InProcessGrid(toy_client, 4).get_node_ids())
    assert ids_a != ids_b
    assert not set(ids_a) & set(range(10))
    seeded = [sorted(InProcessGrid(toy_client, 4, seed=7).get_node_ids()) for _ in "ab"]
    assert seeded[0] == seeded[1]


def test_inprocess_records_every_message_sent_to_nodes() -> None:
    # Prepare
    observed: list[Message] = []
    grid = InProcessGrid(
        toy_client,
        3,
        run_config=TOY_CONFIG,
        record_messages=True,
        on_message=observed.append,
    )

    # Execute
    grid.run_server(toy_server)

    # Assert
    assert len(grid.sent_messages) == 3 * 2 == len(observed)
    assert len(grid.received_replies) == 6
    assert {m.metadata.dst_node_id for m in grid.sent_messages} == set(
        grid.get_node_ids()
    )
    assert {m.metadata.message_type for m in grid.sent_messages} == {"train"}
    for msg in grid.sent_messages:
        assert dict(msg.content["config"]) == {"fail-partition": -1}
        assert msg.metadata.message_id


def test_inprocess_rejects_messages_flower_would_drop() -> None:
    grid = InProcessGrid(toy_client, 2)
    with grid.server_identity():
        with pytest.raises(ValueError, match="unknown dst_node_id"):
            grid.push_messages([Message(RecordDict(), 12345, "train")])
    lenient = InProcessGrid(toy_client, 2, strict=False)
    with lenient.server_identity():
        assert (
            list(lenient.push_messages([Message(RecordDict(), 12345, "train")])) == []
        )


def test_inprocess_restores_task_identity() -> None:
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = (
        None,
        None,
        None,
    )
    run_inprocess(toy_server, toy_client, 1, {**TOY_CONFIG, "expected-nodes": 1})
    assert TaskIdentity._run_id is None
    assert TaskIdentity._node_id is None


def test_offline_env_has_flower_switches(tmp_path: Path) -> None:
    env = offline_flower_env(tmp_path, base={"PATH": "/usr/bin"})
    assert env["FLWR_HOME"] == str(tmp_path)
    assert env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
    assert env["FLWR_TELEMETRY_ENABLED"] == "0"
    assert env["FLWR_DISABLE_UPDATE_CHECK"] == "1"
    assert env["RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"] == "0"
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)


def test_completed_run_check_raises_on_failure(tmp_path: Path) -> None:
    run = CompletedRun(7, "finished:failed", "boom", 0, "out", 1.0, tmp_path, "x")
    assert not run.ok
    with pytest.raises(FlowerLaunchError, match="boom"):
        run.check()


def test_launchers_reject_unknown_run_config_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not-a-key"):
        run_flwr_simulation(TOY_APP_DIR, 1, {"not-a-key": 1}, tmp_path, timeout=5)
    assert not (tmp_path / "flwr-run.log").exists()  # nothing was launched
    runtime = DeploymentRuntime(1, tmp_path / "logs")
    with pytest.raises(FlowerLaunchError, match="not started"):
        runtime.run(TOY_APP_DIR, {"num-rounds": 1})
    assert runtime.stop() == []


# ----------------------------------------------------------- real Flower runs
def _read_result(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def test_flwr_run_simulation_toy_app(tmp_path: Path) -> None:
    # Prepare
    result_path = tmp_path / "result.json"
    config = {**TOY_CONFIG, "expected-nodes": 2, "result-path": str(result_path)}
    config["wait-for-nodes-s"] = 30.0  # main() may start before nodes register

    # Execute
    start = time.perf_counter()
    run = run_flwr_simulation(
        TOY_APP_DIR, 2, config, flwr_home=tmp_path / "flwr-home", timeout=120
    )
    elapsed = time.perf_counter() - start

    # Assert
    print(f"flwr run simulation: run {run.wall_s:.1f} s, with cleanup {elapsed:.1f} s")
    assert run.ok, run.output[-3000:]
    _assert_toy_result(_read_result(result_path), num_nodes=2, rounds=2)
    assert find_launched_processes(run.launch_id) == []
    assert (tmp_path / "flwr-home" / "local-superlink" / "superlink.log").exists()


def test_deployment_runtime_toy_app(tmp_path: Path) -> None:
    # Prepare
    result_path = tmp_path / "result.json"
    config = {**TOY_CONFIG, "expected-nodes": 2, "result-path": str(result_path)}
    config["wait-for-nodes-s"] = 30.0  # main() may start before nodes register
    failing = {**config, "num-rounds": 0, "result-path": str(tmp_path / "no/x.json")}
    runtime = DeploymentRuntime(2, tmp_path / "logs", startup_timeout=60)
    start = time.perf_counter()

    # Execute: a good run, a failing run, then an exception inside the context
    with pytest.raises(RuntimeError, match="leaving the context"):
        with runtime:
            started = list(runtime.pids)
            assert len(started) == 3
            run = runtime.run(TOY_APP_DIR, config, timeout=120)
            bad = runtime.run(TOY_APP_DIR, failing, timeout=120, check=False)
            raise RuntimeError("leaving the context")
    elapsed = time.perf_counter() - start

    # Assert
    print(
        f"deployment: good run {run.wall_s:.1f} s, failing run {bad.wall_s:.1f} s, "
        f"start+runs+stop {elapsed:.1f} s"
    )
    assert run.ok, run.output[-3000:]
    _assert_toy_result(_read_result(result_path), num_nodes=2, rounds=2)
    assert bad.status == "finished:failed"
    assert "No such file or directory" in bad.status_details
    assert bad.returncode == 0  # `flwr run` itself does not report the failure
    assert find_launched_processes(runtime.launch_id, started) == []
    assert (tmp_path / "logs" / "superlink.log").exists()
    assert (tmp_path / "logs" / "supernode-1.log").exists()


def test_inprocess_bad_reply_becomes_error_reply() -> None:
    def client(msg: Message, context: Context) -> Message:
        return Message(RecordDict(), dst_node_id=1, message_type="train")

    grid = InProcessGrid(client, 1)
    with grid.server_identity():
        (node_id,) = grid.get_node_ids()
        (reply,) = grid.send_and_receive([Message(RecordDict(), node_id, "train")])
    assert reply.has_error()
    assert "not a reply" in (reply.error.reason or "")


def test_inprocess_reply_order_is_not_push_order() -> None:
    def order(shuffle: bool) -> list[int]:
        grid = InProcessGrid(toy_client, 8, seed=3, shuffle_replies=shuffle)
        ids = list(grid.get_node_ids())
        with grid.server_identity():
            msgs = [Message(RecordDict(), n, "query.echo") for n in ids]
            replies = grid.send_and_receive(msgs)
        got = [r.metadata.src_node_id for r in replies]
        assert sorted(got) == sorted(ids)
        return [ids.index(n) for n in got]

    assert order(shuffle=False) == list(range(8))
    assert order(shuffle=True) != list(range(8))
