"""Deployment over TLS with authenticated SuperNodes, on loopback.

One secure :class:`DeploymentRuntime` (TLS SuperLink with
``--enable-supernode-auth`` on 127.0.0.1, an nginx proxy that forwards only
its Fleet API, 2 registered SuperNodes connected through the proxy, each with
``--isolation process`` and a warm executor) is shared by the module. A tiny
ServerApp/ClientApp pair (written to a temporary app folder) runs on it once
(its ClientApp is not allow-listed: the executors run it in stock
``flwr-clientapp`` processes), and so does the repo's TPSL app, which trains
through the executors; a SuperNode with a key pair that was never
registered and plaintext clients (a ``--insecure`` SuperNode, the ``flwr``
CLI with ``insecure = true``) must be refused, and so must the Control API
(``flwr ls``, ``run``, ``log``, ``supernode register``) at the proxy's
address, while it works on the loopback address; on that loopback address,
Control and Runtime calls from another OS user (``nobody``) get the peer-uid
guard's 403. Every process is ended by PID at the end and checked with
:func:`find_launched_processes`.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key
from flwr.cli.supernode.register import try_load_public_key

from tpsl_flwr.engines.deployment.certificates import (
    create_local_certificates,
    create_supernode_key_pair,
)
from tpsl_flwr.engines.deployment.fleet_proxy import BYPASS_ENV
from tpsl_flwr.engines.deployment.runtime import EXECUTOR_SECRET, DeploymentRuntime
from tpsl_flwr.engines.flower_env import flwr_executable, free_ports, read_toml
from tpsl_flwr.engines.processes import find_launched_processes
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.release.store import LabelStore

pytestmark = pytest.mark.slow

NUM_SUPERNODES = 2
REPO = Path(__file__).parents[3]
"""The repository: the project's own Flower app."""

_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "tlsprobe"
version = "1.0.0"
description = "Tiny app for the TLS deployment tests"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "tpsl-flwr-tests"

[tool.flwr.app.components]
serverapp = "tlsprobe.server:app"
clientapp = "tlsprobe.client:app"

[tool.flwr.app.config]
num-nodes = 2
out-file = ""
"""

_SERVER = """\
import json
import time
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    expected = int(context.run_config["num-nodes"])
    deadline = time.monotonic() + 30
    node_ids = sorted(grid.get_node_ids())
    while len(node_ids) < expected and time.monotonic() < deadline:
        time.sleep(0.5)
        node_ids = sorted(grid.get_node_ids())
    messages = [
        Message(
            RecordDict({"ping": ConfigRecord({"x": 1})}),
            dst_node_id=node_id,
            message_type="query.echo",
        )
        for node_id in node_ids
    ]
    replies = []
    for reply in grid.send_and_receive(messages, timeout=90):
        entry = {"src-node-id": reply.metadata.src_node_id}
        if reply.has_error():
            entry["error"] = reply.error.reason or ""
        else:
            entry.update(dict(reply.content.config_records["pong"]))
        replies.append(entry)
    out = {"node-ids": node_ids, "replies": replies}
    Path(str(context.run_config["out-file"])).write_text(json.dumps(out))
"""

_CLIENT = """\
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.query("echo")
def echo(msg: Message, context: Context) -> Message:
    pong = ConfigRecord(
        {
            "partition-id": int(context.node_config["partition-id"]),
            "node-id": str(context.node_id),
        }
    )
    return Message(RecordDict({"pong": pong}), reply_to=msg)
"""


def _write_app(app_dir: Path) -> Path:
    (app_dir / "tlsprobe").mkdir(parents=True)
    (app_dir / "pyproject.toml").write_text(_PYPROJECT, encoding="utf-8")
    (app_dir / "tlsprobe" / "__init__.py").write_text("", encoding="utf-8")
    (app_dir / "tlsprobe" / "server.py").write_text(_SERVER, encoding="utf-8")
    (app_dir / "tlsprobe" / "client.py").write_text(_CLIENT, encoding="utf-8")
    return app_dir


@pytest.fixture(scope="module")
def secure_runtime(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[DeploymentRuntime]:
    root = tmp_path_factory.mktemp("secure-deployment")
    runtime = DeploymentRuntime(
        NUM_SUPERNODES, root / "logs", secure=True, startup_timeout=90, grace_s=5
    )
    start = time.perf_counter()
    try:
        with runtime:
            print(f"secure deployment ready in {time.perf_counter() - start:.1f} s")
            yield runtime
    finally:
        assert find_launched_processes(runtime.launch_id) == []


def _spawn_supernode(
    runtime: DeploymentRuntime, extra: list[str], log_path: Path
) -> subprocess.Popen[bytes]:
    """An extra SuperNode, through the proxy, with the runtime's environment."""
    (port,) = free_ports(1)
    address = runtime.fleet_address
    cmd = ["flower-supernode", "--superlink", address, "--port", str(port)]
    with log_path.open("w", encoding="utf-8") as log_file:
        return subprocess.Popen(
            [*cmd, *extra, "--node-config", "partition-id=99 num-partitions=100"],
            env=runtime.env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def test_local_certificates_have_flower_formats(tmp_path: Path) -> None:
    certs = create_local_certificates(tmp_path / "certs", 2)

    assert stat.S_IMODE(os.stat(certs.directory).st_mode) == 0o700
    private = [certs.server_keyfile, certs.directory / "ca.key"]
    private += [pair.private_key for pair in certs.supernodes]
    for path in private:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    # What flower-supernode and `flwr supernode register` load
    for pair in certs.supernodes:
        key = load_ssh_private_key(pair.private_key.read_bytes(), None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        assert isinstance(key.curve, ec.SECP384R1)
        assert pair.public_key.read_text().startswith("ecdsa-sha2-nistp384 ")
        assert try_load_public_key(pair.public_key)
    ca = x509.load_pem_x509_certificate(certs.ca_certfile.read_bytes())
    server = x509.load_pem_x509_certificate(certs.server_certfile.read_bytes())
    server.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert "localhost" in san.value.get_values_for_type(x509.DNSName)
    ips = {str(ip) for ip in san.value.get_values_for_type(x509.IPAddress)}
    assert "127.0.0.1" in ips
    # The default (plaintext) runtime is unchanged
    plain = DeploymentRuntime(1, tmp_path / "plain")
    assert plain._superlink_security_args() == ["--insecure"]
    assert plain.supernode_security_args(0) == ["--insecure"]


def test_secure_runtime_registers_and_connects_supernodes(
    secure_runtime: DeploymentRuntime,
) -> None:
    runtime = secure_runtime
    assert runtime.certificates is not None
    assert len(runtime.node_ids) == NUM_SUPERNODES
    # The CLI's connection uses TLS with the local CA
    assert runtime.flwr_home is not None
    connection = read_toml(runtime.flwr_home / "config.toml")["superlink"][
        runtime.connection
    ]
    assert connection == {
        "address": runtime.address,
        "root-certificates": str(runtime.certificates.ca_certfile),
    }
    link_log = (runtime.log_dir / "superlink.log").read_text(errors="replace")
    assert f"Uvicorn running on https://{runtime.address}" in link_log
    # Every registered SuperNode is online (`flwr supernode list`, over TLS)
    nodes = {int(n["node-id"]): n["status"] for n in runtime.list_supernodes()}
    assert nodes == dict.fromkeys(runtime.node_ids, "online")
    # ... and reached the SuperLink through the proxy, which forwarded Fleet calls
    assert runtime.proxy is not None and runtime.proxy.process is not None
    assert runtime.fleet_address == runtime.proxy.address != runtime.address
    assert runtime.address.startswith("127.0.0.1:")
    assert not set(BYPASS_ENV) & set(runtime.env)  # no gRPC Control server
    for pid in runtime.pids[1:]:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert runtime.fleet_address.encode() in cmdline, cmdline
    access = (runtime.proxy.prefix / "access.log").read_text()
    assert '"POST /v1/fleet/pull-messages HTTP/1.1" 200' in access


def test_app_runs_over_tls_with_authenticated_supernodes(
    secure_runtime: DeploymentRuntime, tmp_path: Path
) -> None:
    app_dir = _write_app(tmp_path / "app")
    out_file = tmp_path / "result.json"

    run = secure_runtime.run(
        app_dir,
        {"num-nodes": NUM_SUPERNODES, "out-file": str(out_file)},
        timeout=150,
        check=False,
    )

    print(f"tiny app over TLS: {run.wall_s:.1f} s")
    assert run.ok, f"{run.status} ({run.status_details})\n{run.output[-3000:]}"
    result: dict[str, Any] = json.loads(out_file.read_text())
    assert result["node-ids"] == sorted(secure_runtime.node_ids)
    replies = sorted(result["replies"], key=lambda r: r["partition-id"])
    assert [r["partition-id"] for r in replies] == list(range(NUM_SUPERNODES))
    assert all("error" not in r for r in replies), replies
    assert sorted(r["src-node-id"] for r in replies) == sorted(secure_runtime.node_ids)


def test_the_tpsl_app_trains_through_warm_executors_over_tls(
    secure_runtime: DeploymentRuntime, tmp_path: Path
) -> None:
    # Prepare: the repo's app on breast-cancer, one train message an epoch
    runtime = secure_runtime
    out_dir = tmp_path / "out"
    LabelStore(out_dir / "label-party").provide_key(NoiseKey.from_seed(0), "seed")
    config = {
        "dataset": "breast-cancer",
        "rows": 0,
        "mechanism": "laplace",
        "epochs": 2,
        "batch-size": 128,
        "steps-per-message": 4,
        "num-parties": NUM_SUPERNODES,
        "reply-timeout": 180.0,
        "out-dir": str(out_dir),
    }

    # Execute
    run = runtime.run(REPO, config, timeout=400, check=False)

    # Assert: it trained, each SuperNode's messages after the first served warm
    print(f"TPSL app over TLS through the executors: {run.wall_s:.1f} s")
    assert run.ok, f"{run.status} ({run.status_details})\n{run.output[-3000:]}"
    results = json.loads((out_dir / "results.json").read_text())
    assert results["test_auc"] > 0.9
    for i in range(NUM_SUPERNODES):
        log = runtime.executor_log(i).read_text()
        assert "runs warm" in log, log[-2000:]
        assert f"executor {i} train acquired" in log, log[-2000:]
    # ... beside SuperNodes that launch nothing, on loopback Runtime APIs,
    # each guarded by a secret only the SuperNode and its executor read
    secret = runtime.log_dir / "executor" / EXECUTOR_SECRET
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    for pid, proc in zip(runtime.pids[1:], runtime.executors, strict=True):
        node = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"--isolation" in node and b"process" in node, node
        assert node[node.index(b"--host") + 1] == b"127.0.0.1"
        port = node[node.index(b"--port") + 1].decode()
        executor = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        address = executor[executor.index(b"--appio-api-address") + 1]
        assert address.decode() == f"127.0.0.1:{port}"
        assert str(secret).encode() in node and str(secret).encode() in executor


def test_unregistered_supernode_is_refused(
    secure_runtime: DeploymentRuntime, tmp_path: Path
) -> None:
    runtime = secure_runtime
    rogue = create_supernode_key_pair(tmp_path / "rogue")  # never registered
    log_path = tmp_path / "rogue.log"

    args = [*runtime.supernode_security_args(), "--max-retries", "2"]
    args += ["--auth-supernode-private-key", str(rogue.private_key)]
    proc = _spawn_supernode(runtime, args, log_path)
    returncode = _wait_exit(proc, timeout=60)

    log = log_path.read_text(errors="replace")
    assert returncode not in (0, None), log
    assert "Failed to activate SuperNode" in log, log
    assert "SuperNode ID:" not in log, log
    link_log = (runtime.log_dir / "superlink.log").read_text(errors="replace")
    assert "No SuperNode found with the given public key" in link_log
    # The SuperLink knows only the registered SuperNodes: no run can reach it
    nodes = {int(n["node-id"]) for n in runtime.list_supernodes()}
    assert nodes == set(runtime.node_ids)


def test_plaintext_clients_are_refused(
    secure_runtime: DeploymentRuntime, tmp_path: Path
) -> None:
    runtime = secure_runtime
    assert runtime.flwr_home is not None
    config_path = runtime.flwr_home / "config.toml"
    config = read_toml(config_path)
    config["superlink"]["plaintext"] = {"address": runtime.address, "insecure": True}
    config_path.write_text(tomli_w.dumps(config), encoding="utf-8")
    log_path = tmp_path / "plain-supernode.log"

    # A SuperNode without TLS, and the CLI with `insecure = true`, side by side
    proc = _spawn_supernode(runtime, ["--insecure", "--max-retries", "1"], log_path)
    cli = runtime.flwr_cli("supernode", "list", "plaintext", "--format", "json")
    returncode = _wait_exit(proc, timeout=60)

    log = log_path.read_text(errors="replace")
    assert returncode not in (0, None), log
    assert "Failed to initialize the connection to the SuperLink" in log, log
    assert "SuperNode ID:" not in log, log
    payload = json.loads(cli.stdout[cli.stdout.find("{") :])
    assert payload["success"] is False, cli.stdout
    assert "Connection to the SuperLink is unavailable" in payload["error-message"]
    # ... while the TLS connection keeps working, with the same nodes
    nodes = {int(n["node-id"]) for n in runtime.list_supernodes()}
    assert nodes == set(runtime.node_ids)


def _control_commands(
    connection: str, *, run_id: str, public_key: Path, app_dir: Path
) -> dict[str, list[str]]:
    """``flwr`` Control API commands aimed at ``connection``."""
    key = str(public_key)
    return {
        "ls": ["ls", connection, "--format", "json"],
        "register": ["supernode", "register", key, connection, "--format", "json"],
        "run": ["run", str(app_dir), connection, "--format", "json"],
        "log": ["log", run_id, connection, "--show"],
    }


def _run_at_once(
    env: dict[str, str], commands: dict[str, list[str]], timeout: float = 90
) -> dict[str, tuple[int | None, str]]:
    """Run ``flwr`` commands concurrently; exit code and output of each."""
    env = {**env, "COLUMNS": "400"}  # rich boxes must not split a URL
    procs = {
        name: subprocess.Popen(
            [flwr_executable(), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        for name, args in commands.items()
    }
    results = {}
    for name, proc in procs.items():
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        results[name] = (proc.returncode, out)
    return results


def _json(text: str) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(text[text.find("{") :])
    return payload


def test_control_api_is_refused_through_the_proxy(
    secure_runtime: DeploymentRuntime, tmp_path: Path
) -> None:
    # Prepare: a connection to the proxy that trusts the CA (TLS succeeds)
    runtime = secure_runtime
    assert runtime.flwr_home is not None and runtime.certificates is not None
    config_path = runtime.flwr_home / "config.toml"
    config = read_toml(config_path)
    config["superlink"]["via-proxy"] = {
        "address": runtime.fleet_address,
        "root-certificates": str(runtime.certificates.ca_certfile),
    }
    config_path.write_text(tomli_w.dumps(config), encoding="utf-8")
    runs = runtime.flwr_cli("ls", runtime.connection, "--format", "json")
    run_ids = [str(r["run-id"]) for r in _json(runs.stdout)["runs"]]
    assert run_ids, runs.stdout  # the app ran above, over loopback Control
    rogue = create_supernode_key_pair(tmp_path / "rogue").public_key
    app_dir = _write_app(tmp_path / "app")
    proxy, loopback = (
        _control_commands(c, run_id=run_ids[0], public_key=rogue, app_dir=app_dir)
        for c in ("via-proxy", runtime.connection)
    )

    # Execute: all four at the proxy, and `flwr log` on loopback, at once
    out = _run_at_once(runtime.env, {**proxy, "loopback-log": loopback["log"]})
    after = _run_at_once(
        runtime.env,
        {
            "runs": loopback["ls"],
            "nodes": ["supernode", "list", runtime.connection, "--format", "json"],
        },
    )

    # Assert: each Control call at the proxy got nginx's 403 ...
    for name, path in [
        ("ls", "list-runs"),
        ("register", "register-node"),
        ("run", "start-run"),
        ("log", "stream-logs"),
    ]:
        returncode, text = out[name]
        assert "403 Forbidden" in text, (name, text)
        assert f"{runtime.fleet_address}/v1/control/{path}" in text, (name, text)
        failed = returncode != 0 or '"success": false' in text
        assert failed, (name, returncode, text)
    # ... and changed nothing: no new node, no new run
    nodes, runs_after = (_json(after[name][1]) for name in ("nodes", "runs"))
    assert {int(n["node-id"]) for n in nodes["nodes"]} == set(runtime.node_ids)
    assert [str(r["run-id"]) for r in runs_after["runs"]] == run_ids
    # The label party's loopback Control API serves the same commands
    returncode, text = out["loopback-log"]
    assert returncode == 0 and "Start `flwr-serverapp` process" in text, text


def test_loopback_apis_answer_only_the_label_partys_os_user(
    only_this_user: Callable[[str, Path], None], secure_runtime: DeploymentRuntime
) -> None:
    # Over TLS as over plaintext (tests/engines/test_superlink_guard.py): another local
    # user gets 403 from Control and Runtime on 127.0.0.1, the label party 200
    runtime = secure_runtime

    only_this_user(f"https://{runtime.address}", runtime.log_dir / "superlink.log")
