"""Engines: in-process grid, Ray simulation via `flwr run`, loopback deployment.

The in-process tests use a tiny ServerApp/ClientApp defined here. The two real
Flower tests run the repo's own TPSL app (``[tool.flwr.app]`` of the repo's
``pyproject.toml``) as subprocesses and check that every process they started
is gone afterwards.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.task_identity import TaskIdentity

from tpsl_flwr.engines.deployment.runtime import DeploymentRuntime
from tpsl_flwr.engines.flower_env import app_config, offline_flower_env
from tpsl_flwr.engines.flwr_cli import CompletedRun
from tpsl_flwr.engines.inprocess import InProcessGrid
from tpsl_flwr.engines.inprocess_run import run_inprocess
from tpsl_flwr.engines.processes import (
    LAUNCH_ID_ENV,
    FlowerLaunchError,
    find_launched_processes,
)
from tpsl_flwr.engines.simulation import run_flwr_simulation
from tpsl_flwr.errors import ConfigError
from tpsl_flwr.experiments.config import ExperimentConfig
from tpsl_flwr.experiments.experiment import run_label_party
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.release.store import LabelStore
from tpsl_flwr.simulations.client_app import app as tpsl_client_app

APP_DIR = Path(__file__).parents[2]
"""The repo root: its pyproject.toml declares the TPSL Flower app."""

# ------------------------------------------------------------------- toy app
# A minimal ServerApp/ClientApp pair for the in-process grid tests: one
# ``train`` message per node per round; each node replies with its partition
# and a counter kept in ``context.state``.
toy_client = ClientApp()
toy_server = ServerApp()
TOY_STATE_KEY = "toy-state"
TOY_CONFIG: dict[str, Any] = {"num-rounds": 2, "fail-partition": -1}


@toy_client.train()
def _toy_train(msg: Message, context: Context) -> Message:
    partition_id = int(context.node_config["partition-id"])
    if partition_id == int(msg.content["config"]["fail-partition"]):
        raise RuntimeError(f"toy failure on partition {partition_id}")
    if TOY_STATE_KEY not in context.state:
        context.state[TOY_STATE_KEY] = ConfigRecord({"counter": 0})
    record = context.state.config_records[TOY_STATE_KEY]
    record["counter"] = int(record["counter"]) + 1
    reply = ConfigRecord(
        {
            "partition-id": partition_id,
            "num-partitions": int(context.node_config["num-partitions"]),
            "counter": int(record["counter"]),
            "node-id": str(context.node_id),
        }
    )
    return Message(RecordDict({"reply": reply}), reply_to=msg)


@toy_client.query("echo")
def _toy_echo(msg: Message, context: Context) -> Message:
    return Message(msg.content, reply_to=msg)


@toy_server.main()
def toy_main(grid: Grid, context: Context) -> dict[str, Any]:
    cfg = context.run_config
    node_ids = sorted(grid.get_node_ids())
    rounds: list[list[dict[str, Any]]] = []
    for _ in range(int(cfg["num-rounds"])):
        config = ConfigRecord({"fail-partition": int(cfg["fail-partition"])})
        messages = [
            Message(RecordDict({"config": config}), dst_node_id=n, message_type="train")
            for n in node_ids
        ]
        this_round = []
        for reply in grid.send_and_receive(messages):
            entry: dict[str, Any] = {"src-node-id": reply.metadata.src_node_id}
            if reply.has_error():
                entry["error"] = reply.error.reason or ""
            else:
                entry.update(dict(reply.content.config_records["reply"]))
            this_round.append(entry)
        rounds.append(sorted(this_round, key=lambda e: e["src-node-id"]))
    return {"node-ids": node_ids, "rounds": rounds}


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
    config = {**TOY_CONFIG, "num-rounds": 1}
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
    run_inprocess(toy_server, toy_client, 1, TOY_CONFIG)
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
        run_flwr_simulation(APP_DIR, 1, {"not-a-key": 1}, tmp_path, timeout=5)
    assert not (tmp_path / "flwr-run.log").exists()  # nothing was launched
    runtime = DeploymentRuntime(1, tmp_path / "logs")
    with pytest.raises(FlowerLaunchError, match="not started"):
        runtime.run(APP_DIR, {"epochs": 1})
    assert runtime.stop() == []


# ----------------------------------------------------------- real Flower runs
# Both tests run the TPSL app itself on breast-cancer (~455 training rows) for
# one epoch, two non-label parties (SuperNodes), Laplace eps 1 with a seeded
# noise key, and compare its numbers with the in-process engine's on the same
# merged config: the same ServerApp/ClientApp code gives the same model.


def _tpsl_config(out_dir: Path, **overrides: Any) -> dict[str, Any]:
    """A tiny, fast run config (kebab-case overrides of the app's defaults)."""
    config: dict[str, Any] = {
        "dataset": "breast-cancer",
        "rows": 0,  # the app's run config sets synthetic-ctr's rows = 100000
        "mechanism": "laplace",
        "epsilon": 1.0,
        "epochs": 1,
        "batch-size": 128,
        "steps-per-message": 1,
        "num-parties": 2,
        "checkpoint": True,
        # explicit: "auto" holds none out on a 1-epoch run of 456 rows, and the
        # engines' tests check the held-out path end to end
        "validation-fraction": 0.1,
        "out-dir": str(out_dir),
    }
    config.update(overrides)
    _provide_seeded_key(out_dir)
    return config


def _provide_seeded_key(out_dir: Path) -> None:
    """The label party's seeded key (never run config: the nodes get that)."""
    LabelStore(out_dir / "label-party").provide_key(NoiseKey.from_seed(0), "seed")


def _app_defaults() -> dict[str, Any]:
    return app_config(APP_DIR)


def _inprocess_history(config: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """The epoch-1 history entry of the same run on the in-process engine."""
    merged = {**_app_defaults(), **config, "out-dir": str(out_dir)}
    merged["party-actors"] = False  # a Ray-only switch; the same numbers locally
    _provide_seeded_key(out_dir)
    cfg = ExperimentConfig.from_run_config(merged)
    grid = InProcessGrid(tpsl_client_app, cfg.num_parties, run_config=merged)
    results = grid.run_server(lambda g, _c: run_label_party(g, cfg, "local"))
    return dict(results["history"][0])


def _assert_tpsl_results(
    out_dir: Path, config: dict[str, Any], engine: str
) -> dict[str, Any]:
    results = json.loads((out_dir / "results.json").read_text(encoding="utf-8"))
    assert results["engine"] == engine
    assert results["mechanism"] == "laplace"
    assert results["epsilon_spent"] == 1.0
    assert results["num_parties"] == 2
    assert results["dataset"] == "breast-cancer"
    assert 0.5 < results["test_auc"] <= 1.0
    assert results["noise_key"]["secure"] is False  # seeded
    assert [h["epoch"] for h in results["history"]] == [1]
    n_train = ExperimentConfig(dataset="breast-cancer").load_labels().train_labels.size
    trained = results["history"][0]["samples"]
    assert trained + results["validation_rows"] == results["train_rows"] == n_train
    assert 0 < results["validation_rows"] < n_train // 4  # 10% held out, by id
    assert results["config"]["batch-size"] == config["batch-size"]
    assert results["config"]["steps-per-message"] == config.get("steps-per-message", 1)
    # Each SuperNode ran the ClientApp for its own partition and checkpointed it
    for partition in (0, 1):
        assert (out_dir / "checkpoints" / f"party-{partition}.pt").exists()
    # Same numbers as the in-process engine on the same config
    expected = _inprocess_history(config, out_dir.parent / "inprocess")
    got = results["history"][0]
    for key in ("test_auc", "test_accuracy", "test_logloss"):
        assert got[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-9), key
    return results


def _watch_party_actors(seen: dict[int, bytes], done: threading.Event) -> None:
    """Note each ``ray::PartyActor`` process (pid -> environment) until ``done``."""
    while not done.wait(0.2):
        for entry in Path("/proc").iterdir():
            try:
                if (
                    entry.name.isdigit()
                    and int(entry.name) not in seen
                    and (entry / "cmdline").read_bytes().startswith(b"ray::PartyActor")
                ):
                    seen[int(entry.name)] = (entry / "environ").read_bytes()
            except OSError:
                continue


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_flwr_run_simulation_runs_tpsl_app(tmp_path: Path) -> None:
    # Prepare: 4 steps of 128, one message per step (Ray round trips are cheap);
    # each node's party in its party actor (the two-raylet cluster test and the
    # CLI's Ray tests run the default: the state in context.state)
    out_dir = tmp_path / "out"
    config = _tpsl_config(out_dir, **{"party-actors": True})

    # Execute, watching for the party actors' processes
    seen: dict[int, bytes] = {}
    done = threading.Event()
    watcher = threading.Thread(target=_watch_party_actors, args=(seen, done))
    watcher.start()
    start = time.perf_counter()
    try:
        run = run_flwr_simulation(
            APP_DIR,
            2,
            config,
            flwr_home=tmp_path / "flwr-home",
            timeout=300,
            check=False,
        )
    finally:
        done.set()
        watcher.join()
    elapsed = time.perf_counter() - start

    # Assert
    print(f"flwr run simulation: run {run.wall_s:.1f} s, with cleanup {elapsed:.1f} s")
    assert run.ok, f"{run.status} ({run.status_details})\n{run.output[-3000:]}"
    assert run.returncode == 0
    _assert_tpsl_results(out_dir, config, "ray")
    marker = f"{LAUNCH_ID_ENV}={run.launch_id}".encode()
    ours = [pid for pid, env in seen.items() if marker in env.split(b"\0")]
    assert len(ours) == 2, f"this run's party actors: {ours} (all seen: {sorted(seen)})"
    assert find_launched_processes(run.launch_id) == []
    assert (tmp_path / "flwr-home" / "local-superlink" / "superlink.log").exists()
    # the run's log holds the label party's test metrics: its own (0600)
    assert run.log_path.stat().st_mode & 0o777 == 0o600


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_deployment_runtime_runs_tpsl_app(tmp_path: Path) -> None:
    # Prepare: Flower's process-per-message path (no warm executor; the warm
    # one is tests/engines/executor/ and the secure deployment test): every
    # message costs a fresh `flwr-clientapp` process per node, which runs the
    # ClientApp with the node's state carried in its context, plus the
    # SuperNodes' 3 s polls, so keep it to 3 round trips: hello, one train
    # message carrying all 4 steps (batch 128, steps-per-message 4), and the
    # test-embedding query (on the trained bottom models: the same test AUC
    # as in-process only if the state crossed from process to process).
    out_dir = tmp_path / "out"
    config = _tpsl_config(out_dir, **{"steps-per-message": 4})
    failing = _tpsl_config(tmp_path / "failing", epsilon=0.0)  # ConfigError
    runtime = DeploymentRuntime(
        2, tmp_path / "logs", startup_timeout=120, executor=False
    )
    start = time.perf_counter()

    # Execute: a good run, a failing run, then an exception inside the context
    with pytest.raises(RuntimeError, match="leaving the context"):
        with runtime:
            started = list(runtime.pids)
            assert len(started) == 3
            ready = time.perf_counter()
            run = runtime.run(APP_DIR, config, timeout=300, check=False)
            bad = runtime.run(APP_DIR, failing, timeout=120, check=False)
            stopping = time.perf_counter()
            raise RuntimeError("leaving the context")
    elapsed = time.perf_counter() - start

    # Assert
    print(
        f"deployment: start {ready - start:.1f} s, good run {run.wall_s:.1f} s, "
        f"failing run {bad.wall_s:.1f} s, stop {time.perf_counter() - stopping:.1f} "
        f"s, total {elapsed:.1f} s"
    )
    assert run.ok, f"{run.status} ({run.status_details})\n{run.output[-3000:]}"
    _assert_tpsl_results(out_dir, config, "deployment")
    failed = f"{bad.status} ({bad.status_details})\n{bad.output[-3000:]}"
    assert bad.status == "finished:failed", failed
    assert "epsilon" in bad.status_details, failed
    assert "ConfigError" in bad.output, failed
    assert bad.returncode == 0  # `flwr run` itself does not report the failure
    assert not (tmp_path / "failing" / "results.json").exists()
    # Every process carries the launch marker (the ones started directly too,
    # whose PIDs, once reaped, may already belong to someone else's process)
    assert find_launched_processes(runtime.launch_id) == []
    # every log and run config of the deployment: the label party's own (0600)
    for name in ("superlink", "supernode-0", "supernode-1", "flwr-run-1"):
        assert (tmp_path / "logs" / f"{name}.log").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "logs" / "run-1-config.toml").stat().st_mode & 0o777 == 0o600
    # no executor beside the SuperNodes: Flower ran every message itself
    assert not list((tmp_path / "logs").glob("executor-*.log"))
    assert not (tmp_path / "logs" / "executor").exists()  # nor its secret


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
