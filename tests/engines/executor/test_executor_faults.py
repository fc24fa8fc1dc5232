"""Faults of the warm executor on a real local deployment (``slow``).

A SuperLink and two SuperNodes with ``--isolation process`` and a warm
executor each run the repo's TPSL app (breast-cancer, one train message an
epoch). Three faults, each on its own deployment:

- an executor killed mid-run: the label party stops within its reply-timeout,
  with one line naming the node and its partition, and writes no results;
- an executor killed and restarted at once: the run's next message reaches a
  process that never saw the run, which refuses it (the party was in the
  dead one), naming the node: the way on is to resume the run;
- a ClientApp past the executor's task bound: its task gets an error reply in
  the node's name and the executor starts afresh in the same process.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.engines.deployment.test_deployment_faults import (
    _config,
    _run_in_thread,
    _wait_for,
)
from tpsl_flwr.engines.deployment.faults import kill_executor, restart_executor
from tpsl_flwr.engines.deployment.runtime import DeploymentRuntime
from tpsl_flwr.engines.processes import find_launched_processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

_NODE_ID = re.compile(r"SuperNode ID: (\d+)")
FIRST_WARM_TRAIN = "executor 1 train acquired"
"""Executor 1's log line once it has served its first train message warm."""


def _node_id(runtime: DeploymentRuntime, index: int) -> str:
    text = (runtime.log_dir / f"supernode-{index}.log").read_text()
    return _NODE_ID.search(text).group(1)  # type: ignore[union-attr]


def _failure(out_dir: Path) -> str:
    assert not (out_dir / "results.json").exists()
    return (out_dir / "FAILED").read_text().strip()


def test_an_executor_killed_mid_run_stops_the_run_naming_the_node(
    tmp_path: Path,
) -> None:
    # Prepare: kill executor 1 once it has trained warm (the party is in it)
    reply_timeout = 40.0
    config = _config(tmp_path / "out", **{"reply-timeout": reply_timeout})
    runtime = DeploymentRuntime(2, tmp_path / "logs", startup_timeout=120)

    # Execute
    with runtime:
        node_id = _node_id(runtime, 1)
        thread, done = _run_in_thread(runtime, config)
        _wait_for(runtime.executor_log(1), FIRST_WARM_TRAIN, timeout=400)
        kill_executor(runtime, 1)
        killed_at = time.time()
        thread.join(timeout=300)

    # Assert: within the reply-timeout, one line naming the node
    failed = _failure(tmp_path / "out")
    seconds = (tmp_path / "out" / "FAILED").stat().st_mtime - killed_at
    print(f"executor 1 killed: the label party stopped after {seconds:.1f} s")
    assert done["run"].status == "finished:failed"
    assert failed.startswith(f"node {node_id} (partition 1) stopped answering"), failed
    assert "\n" not in failed
    assert 0 < seconds <= reply_timeout + 5.0
    assert find_launched_processes(runtime.launch_id) == []


def test_a_restarted_executor_refuses_the_runs_next_message(tmp_path: Path) -> None:
    # Prepare: a reply-timeout longer than a restart on a loaded machine
    config = _config(tmp_path / "out", **{"reply-timeout": 180.0})
    runtime = DeploymentRuntime(2, tmp_path / "logs", startup_timeout=120)

    # Execute: kill executor 1 after its first warm train, start it again
    with runtime:
        node_id = _node_id(runtime, 1)
        thread, done = _run_in_thread(runtime, config)
        _wait_for(runtime.executor_log(1), FIRST_WARM_TRAIN, timeout=400)
        kill_executor(runtime, 1)
        restart_executor(runtime, 1, timeout=120)
        thread.join(timeout=400)

    # Assert: the run's next message is refused, naming the node; resume
    failed = _failure(tmp_path / "out")
    assert done["run"].status == "finished:failed"
    assert failed.startswith(
        f"node {node_id} (partition 1) replied with an error: ProtocolError: this "
        "node's state (version "
    ), failed
    assert "kept in the process that served the run's earlier messages" in failed
    assert "resume the run (resume = true)" in failed
    restarted = (runtime.log_dir / "executor-1-restarted.log").read_text()
    # the bundle was installed before the run: the restarted executor judged
    # it at once and met the message warm, with no party for the run
    assert "runs warm" in restarted and "stock exit" not in restarted


def test_a_clientapp_past_the_task_bound_gets_an_error_reply_and_a_fresh_executor(
    tmp_path: Path,
) -> None:
    # Prepare: a bound no warm first step (its party's build) can meet
    config = _config(tmp_path / "out", **{"reply-timeout": 120.0})
    runtime = DeploymentRuntime(
        2,
        tmp_path / "logs",
        startup_timeout=120,
        executor_args=["--task-timeout", "0.05"],
    )

    # Execute
    with runtime:
        pids = [proc.pid for proc in runtime.executors]
        thread, done = _run_in_thread(runtime, config)
        thread.join(timeout=400)
        stuck = [
            i
            for i in (0, 1)
            if "did not return within" in runtime.executor_log(i).read_text()
        ]
        for i in stuck:  # the same process, started afresh (exec): ready again
            _wait_for(runtime.executor_log(i), "executor ready for ", 120, after=1)
        alive = [proc.poll() is None for proc in runtime.executors]
        now = [proc.pid for proc in runtime.executors]

    # Assert: an error reply in a node's name, not a silent hang ...
    failed = _failure(tmp_path / "out")
    assert done["run"].status == "finished:failed"
    assert re.match(
        r"node \d+ \(partition [01]\) replied with an error: ProtocolError: the "
        r"ClientApp did not return within 0\.05 s \(the executor's task bound\)",
        failed,
    ), failed
    # ... and each executor that hit the bound started afresh in its process
    assert stuck
    for i in stuck:
        assert alive[i] and now[i] == pids[i]
