"""The nginx config that exposes only a SuperLink's Fleet API (no processes run).

The rendered config is parsed into its directives: exactly one location is
forwarded, ``/v1/fleet/`` (POST only, to the SuperLink on 127.0.0.1, with its
certificate verified), everything else answers 403, and the TLS files are
the ones given. ``nginx -t`` checks the syntax where nginx is installed. A
secure runtime without nginx refuses to start, naming ``apt-get install
nginx``. The proxy in front of a real SuperLink is tested in
``tests/engines/deployment/test_deployment_security.py`` (``slow``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tpsl_flwr.engines.deployment import fleet_proxy
from tpsl_flwr.engines.deployment.certificates import create_local_certificates
from tpsl_flwr.engines.deployment.fleet_proxy import (
    FLEET_PREFIX,
    find_nginx,
    render_config,
)
from tpsl_flwr.engines.deployment.runtime import DeploymentRuntime
from tpsl_flwr.engines.processes import FlowerLaunchError

_FORWARDERS = {"proxy_pass", "grpc_pass", "fastcgi_pass", "uwsgi_pass", "scgi_pass"}


@dataclass
class Directive:
    """One nginx directive: its name, arguments and block (if any)."""

    name: str
    args: list[str]
    block: list[Directive] = field(default_factory=list)

    def children(self, name: str) -> list[Directive]:
        """The directives called ``name`` directly in this block."""
        return [d for d in self.block if d.name == name]

    def find(self, name: str) -> list[Directive]:
        """Every directive called ``name`` at any depth below this one."""
        found = self.children(name)
        for child in self.block:
            found += child.find(name)
        return found


def _parse(text: str) -> Directive:
    """Parse an nginx config (no quoting needed here) into its directives."""
    text = re.sub(r"#[^\n]*", "", text)
    tokens = re.findall(r"[{};]|[^\s{};]+", text)
    root = Directive("main", [])
    stack, words = [root], list[str]()
    for token in tokens:
        if token in "{;":
            directive = Directive(words[0], words[1:])
            stack[-1].block.append(directive)
            if token == "{":
                stack.append(directive)
            words = []
        elif token == "}":
            stack.pop()
        else:
            words.append(token)
    assert len(stack) == 1 and not words, "unbalanced config"
    return root


@pytest.fixture
def rendered(tmp_path: Path) -> tuple[str, Path]:
    certs = create_local_certificates(tmp_path / "certs", 0)
    text = render_config(
        prefix=tmp_path / "proxy",
        listen="127.0.0.1:9092",
        superlink_port=39093,
        certfile=certs.server_certfile,
        keyfile=certs.server_keyfile,
        upstream_ca=certs.ca_certfile,
    )
    return text, tmp_path


def test_only_the_fleet_api_is_forwarded(rendered: tuple[str, Path]) -> None:
    # Prepare
    text, _ = rendered

    # Execute
    config = _parse(text)

    # Assert: one server; its only forwarding location is the Fleet API
    assert not re.findall(r"@[A-Z_]+@", re.sub(r"#[^\n]*", "", text))
    (server,) = config.find("http")[0].children("server")
    locations = {tuple(d.args): d for d in server.find("location")}
    assert set(locations) == {(FLEET_PREFIX,), ("/",)}
    forwards = [d for name in _FORWARDERS for d in config.find(name)]
    assert [d.args for d in forwards] == [["https://flwr_superlink/v1/fleet/"]]
    fleet = locations[(FLEET_PREFIX,)]
    assert fleet.find("proxy_pass") == forwards
    (limit,) = fleet.find("limit_except")
    assert limit.args == ["POST"] and limit.find("deny")[0].args == ["all"]
    assert [d.args for d in fleet.find("proxy_ssl_verify")] == [["on"]]
    # ... to the SuperLink on loopback only; every other path is refused
    (upstream,) = config.find("upstream")
    assert [d.args for d in upstream.find("server")] == [["127.0.0.1:39093"]]
    assert [d.args for d in locations[("/",)].block] == [["403"]]
    assert locations[("/",)].block[0].name == "return"


def test_tls_files_and_prefix_are_named(rendered: tuple[str, Path]) -> None:
    text, tmp_path = rendered
    certs = tmp_path / "certs"

    config = _parse(text)

    (server,) = config.find("http")[0].children("server")
    assert [d.args for d in server.find("listen")] == [["127.0.0.1:9092", "ssl"]]
    assert server.find("ssl_certificate")[0].args == [str(certs / "server.pem")]
    assert server.find("ssl_certificate_key")[0].args == [str(certs / "server.key")]
    trusted = server.find("proxy_ssl_trusted_certificate")
    assert trusted[0].args == [str(certs / "ca.crt")]
    assert server.find("proxy_ssl_name")[0].args == ["localhost"]
    prefix = str(tmp_path / "proxy")
    assert config.find("pid")[0].args == [f"{prefix}/nginx.pid"]
    paths = [
        d.args[0] for name in ("error_log", "access_log") for d in config.find(name)
    ]
    assert paths and all(path.startswith(prefix + "/") for path in paths)
    assert config.find("user") == []


@pytest.mark.skipif(
    shutil.which("nginx", path="/usr/local/sbin:/usr/sbin:/sbin") is None
    and shutil.which("nginx") is None,
    reason="nginx is not installed",
)
def test_nginx_accepts_the_rendered_config(rendered: tuple[str, Path]) -> None:
    text, tmp_path = rendered
    prefix = tmp_path / "proxy"
    prefix.mkdir()
    conf = prefix / "nginx.conf"
    conf.write_text(text, encoding="utf-8")

    cmd = [find_nginx(), "-t", "-p", str(prefix), "-c", str(conf)]
    res = subprocess.run(
        [*cmd, "-e", str(prefix / "error.log")],
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert res.returncode == 0, res.stderr
    assert "syntax is ok" in res.stderr


@pytest.mark.parametrize(
    ("key", "value"),
    [("listen", "0.0.0.0:9092; include /etc/x"), ("prefix", Path("/a b"))],
)
def test_values_that_would_change_the_config_are_refused(
    key: str, value: object, tmp_path: Path
) -> None:
    options: dict[str, object] = {
        "prefix": tmp_path,
        "listen": "127.0.0.1:9092",
        "superlink_port": 39093,
        "certfile": tmp_path / "s.pem",
        "keyfile": tmp_path / "s.key",
        "upstream_ca": tmp_path / "ca.crt",
        key: value,
    }

    with pytest.raises(ValueError, match=re.escape(repr(str(value)))):
        render_config(**options)  # type: ignore[arg-type]


def test_secure_runtime_without_nginx_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(fleet_proxy, "_SBIN_DIRS", ())
    runtime = DeploymentRuntime(1, tmp_path / "logs", secure=True)

    with pytest.raises(FlowerLaunchError, match="apt-get install nginx"):
        runtime.start()

    # Nothing was started, and the Control API was never exposed
    assert runtime.pids == [] and runtime.proxy is None
    assert runtime.fleet_address == ""
