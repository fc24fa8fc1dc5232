"""The warm executor's decisions, without a SuperNode (its runs are ``slow``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from flwr.app import Context, RecordDict

from tpsl_flwr.cli.executor import check_loopback
from tpsl_flwr.engines.executor import warm
from tpsl_flwr.engines.executor.fab_match import DEFAULT_WARM_APP, WarmVerdict
from tpsl_flwr.engines.executor.warm import (
    DEFAULT_TASK_BOUND,
    EXIT_STUCK,
    ExecutorSettings,
    WarmExecutor,
    error_reason,
    node_name,
    restart,
    task_bound,
)
from tpsl_flwr.errors import ConfigError, ProtocolError
from tpsl_flwr.wire.node_edge import read_node_error

THEIR_PYPROJECT = """
[project]
name = "app"
version = "1.0.0"

[tool.flwr.app]
publisher = "someone"

[tool.flwr.app.components]
serverapp = "theirapp.server:app"
clientapp = "theirapp.client:app"
"""


def _context(node_config: dict[str, int | str]) -> Context:
    return Context(7, 42, dict(node_config), RecordDict(), {})


@pytest.fixture
def executor(tmp_path: Path) -> Iterator[WarmExecutor]:
    made = WarmExecutor(ExecutorSettings("127.0.0.1:9"))  # never contacted
    yield made
    made.close()


def test_an_error_reply_names_the_node_and_its_partition() -> None:
    # Prepare
    context = _context({"partition-id": 1, "num-partitions": 2})

    # Execute
    reason = error_reason(ValueError("bad batch\nsecond line"), context)

    # Assert: the label party reads the partition and the root cause back
    assert reason.startswith("<class 'tpsl_flwr.wire.node_edge.NodeFailure'>:<'")
    found = read_node_error(reason)
    assert (found.partition, found.cause) == (1, "ValueError: bad batch")
    assert node_name(context) == "node 42 (partition 1)"


def test_an_error_that_names_its_partition_is_kept_as_it_is() -> None:
    context = _context({"partition-id": 0, "num-partitions": 2})
    marked = RuntimeError("[tpsl partition 0 of 2] KeyError: 'x'")

    assert error_reason(marked, context) == (
        "<class 'RuntimeError'>:<'[tpsl partition 0 of 2] KeyError: 'x''>"
    )
    assert error_reason(marked, None).startswith("<class 'RuntimeError'>")


def test_the_task_bound_is_the_flag_else_the_reply_timeout_else_600() -> None:
    plain = ExecutorSettings("127.0.0.1:1")
    flagged = ExecutorSettings("127.0.0.1:1", task_timeout=5.0)

    assert task_bound(flagged, {"reply-timeout": 40.0}) == 5.0
    assert task_bound(plain, {"reply-timeout": 40}) == 40.0
    assert task_bound(plain, {"reply-timeout": True}) == DEFAULT_TASK_BOUND
    assert task_bound(plain, {}) == DEFAULT_TASK_BOUND


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"poll_interval": 0.0}, "poll_interval must be in (0, 60] seconds, got 0.0"),
        ({"task_timeout": -1.0}, "task_timeout must be > 0, got -1.0"),
        ({"warm_apps": ()}, "warm_apps must name at least one ClientApp"),
    ],
)
def test_settings_refuse_bad_values_naming_them(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError) as err:
        ExecutorSettings("127.0.0.1:1", **options)  # type: ignore[arg-type]
    assert str(err.value) == message


def test_the_runtime_api_address_must_be_loopback() -> None:
    assert check_loopback("[::1]:9094") == "[::1]:9094"
    assert check_loopback("localhost:9094") == "localhost:9094"
    for address in ("0.0.0.0:9094", "192.168.1.4:9094", "127.0.0.1", "node:9094"):
        with pytest.raises(ConfigError, match="must be on loopback"):
            check_loopback(address)


def test_one_fab_at_most_runs_warm(executor: WarmExecutor) -> None:
    # Prepare: two bundles judged warm (same code, e.g. another pyproject)
    ok = WarmVerdict("tpsl_flwr.simulations.client_app:app", None)
    executor.verdicts = {"a" * 64: ok, "b" * 64: ok, "c" * 64: WarmVerdict(None, "x")}

    # Execute / Assert: the first one served warm keeps the process
    assert executor.warm_for("b" * 64)
    assert not executor.warm_for("a" * 64)
    assert not executor.warm_for("c" * 64)
    assert not executor.warm_for("d" * 64)  # never judged: stock first
    assert executor.warm_hash == "b" * 64


def test_an_unjudged_bundle_is_judged_once_installed(
    executor: WarmExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: FLWR_HOME without the bundle, then with one of foreign code
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    fab_hash = "0123abcd" + "0" * 56

    # Execute / Assert: not installed yet -> not remembered, judged later
    assert executor.judge(fab_hash).reason == "not installed yet"
    assert fab_hash not in executor.verdicts
    app = tmp_path / "apps" / "someone.app.1.0.0.0123abcd"
    (app / "theirapp").mkdir(parents=True)
    (app / "pyproject.toml").write_text(THEIR_PYPROJECT)
    verdict = executor.judge(fab_hash)
    assert verdict.reason is not None and "not in --warm-app" in verdict.reason
    assert executor.verdicts[fab_hash] is verdict
    assert not executor.warm_for(fab_hash)


def test_a_stuck_task_without_a_restart_command_exits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    codes: list[int] = []
    monkeypatch.setattr(warm.os, "execv", lambda *a: codes.append(-1))

    restart(None, exit_=codes.append)

    assert codes == [EXIT_STUCK]


def test_a_bundle_judged_warm_by_its_folder_but_not_by_its_bytes_is_refused(
    executor: WarmExecutor,
) -> None:
    # Prepare: a verdict from an installed folder (found by 8 hex digits of the
    # hash), then the task's own bytes: not a bundle of the imported code
    fab_hash = "ab" * 32
    executor.verdicts = {fab_hash: WarmVerdict(DEFAULT_WARM_APP, None)}
    assert executor.warm_for(fab_hash)

    # Execute / Assert: refused naming why; nothing warm is kept for it
    with pytest.raises(ProtocolError, match="its own bytes do not run warm"):
        executor._confirm_bytes(SimpleNamespace(hash_str=fab_hash, content=b"no"))
    assert not executor.verdicts[fab_hash].warm
    assert executor.warm_hash is None
    assert not executor.warm_for(fab_hash)
