"""Fixtures shared by the test modules."""

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn


# ------------------------------------------------------- the toy split model
class ToyBottom(nn.Module):
    """The toy split model's bottom: one linear layer over a node's columns.

    ``flat``: return the embedding flattened, a bottom model that breaks the
    ``(n, d)`` contract.
    """

    def __init__(self, cols: int, width: int, *, flat: bool = False) -> None:
        super().__init__()
        self.layer = nn.Linear(cols, width)
        self.flat = flat

    def forward(self, numeric: torch.Tensor, categorical: Any) -> torch.Tensor:
        out = self.layer(numeric)
        return out.reshape(-1) if self.flat else out


def toy_table(rows: int, cols: int, parties: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``: ``rows`` normal rows of ``parties * cols`` float32 columns, and
    the binary label ``x[:, 0] + x[:, cols] > 0`` (one column of each of the
    first two parties)."""
    x = np.random.default_rng(0).normal(size=(rows, parties * cols)).astype(np.float32)
    return x, (x[:, 0] + x[:, cols] > 0).astype(np.int64)


def toy_node(x: np.ndarray, train_rows: int, cols: int, width: int) -> Callable:
    """A node factory over ``x``: partition ``i`` holds columns ``i * cols ..``,
    rows ``0..train_rows-1`` for training and the rest for test, and a
    :class:`ToyBottom` seeded by its partition."""
    from tpsl_flwr.parties import NonLabelParty, adam

    def node(context: Any) -> NonLabelParty:
        part = int(context.node_config["partition-id"])
        own = slice(cols * part, cols * part + cols)
        torch.manual_seed(part)
        return NonLabelParty(
            {"train": (x[:train_rows, own], None), "test": (x[train_rows:, own], None)},
            ToyBottom(cols, width),
            adam(0.05),
        )

    return node


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tiny models: threads only add contention on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def server_identity() -> Iterator[None]:
    """Let a test build Flower messages outside a runtime (as the ServerApp).

    Flower's ``Message`` needs a task identity; the in-process engine's
    ``server_identity`` provides the one a ServerApp would run under.
    """
    from tpsl_flwr.engines.inprocess import InProcessGrid

    grid = InProcessGrid(lambda m, c: m, 1)
    with grid.server_identity():
        yield


@pytest.fixture(autouse=True)
def private_ledger(tmp_path_factory, monkeypatch) -> Iterator[None]:
    """Each test gets its own privacy ledger, never the user's.

    The label party's ledger (:mod:`tpsl_flwr.release.ledger`) lives outside every run
    folder; a test that wrote to the default one would make later runs over
    the same labels refuse. Processes a test starts inherit the variable.
    """
    from tpsl_flwr.release.ledger import LEDGER_ENV

    monkeypatch.setenv(LEDGER_ENV, str(tmp_path_factory.mktemp("ledger")))
    yield


@pytest.fixture(params=["compiled", "numpy"])
def kernel_backend(request: pytest.FixtureRequest, monkeypatch) -> str:
    """Run a CTR ingest test on the compiled kernels and on the numpy path."""
    from tpsl_flwr.data.ctr import kernels

    if request.param == "compiled" and not kernels.available():
        if os.environ.get("TPSL_FLWR_JIT") == "0":
            pytest.skip("compiled kernels disabled by TPSL_FLWR_JIT=0")
        pytest.fail("numba is a dependency: the compiled kernels must be enabled")
    monkeypatch.setattr(kernels, "ENABLED", request.param == "compiled")
    return str(request.param)


_POST_AS = """\
import json, ssl, sys, urllib.error, urllib.request
context = ssl._create_unverified_context()  # another user cannot read the CA
out = {}
for path in sys.argv[2:]:
    request = urllib.request.Request(
        sys.argv[1] + path, data=b"", method="POST",
        headers={"Content-Type": "application/protobuf"},
    )
    try:
        with urllib.request.urlopen(request, timeout=20, context=context) as r:
            out[path] = [r.status, r.read(200).decode(errors="replace")]
    except urllib.error.HTTPError as err:
        out[path] = [err.code, err.read(200).decode(errors="replace")]
print(json.dumps(out))
"""
NOBODY = ["--reuid=65534", "--regid=65534", "--clear-groups"]


LIST_RUNS = "/v1/control/list-runs"
GUARDED = [LIST_RUNS, "/v1/control/start-run", "/v1/runtime/acquire-task"]


@pytest.fixture
def only_this_user() -> Callable[[str, Path], None]:
    """Check that a SuperLink answers this OS user alone (the peer-uid guard).

    ``only_this_user(base, superlink_log)`` POSTs (empty protobuf bodies, from
    fresh processes) Control ``list-runs`` and ``start-run`` and Runtime
    ``acquire-task`` to ``base`` as ``nobody`` (``setpriv`` to uid/gid 65534,
    no groups), asserts each gets the guard's 403 and the SuperLink's log
    names the refusal, and that ``list-runs`` as this user gets 200.
    Skipped unless the test runs as root (another uid needs root).
    """
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to make calls as another uid (nobody)")

    def post(base: str, paths: list[str], prefix: list[str]) -> dict[str, Any]:
        cmd = [*prefix, sys.executable, "-I", "-c", _POST_AS, base, *paths]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        answers: dict[str, Any] = json.loads(done.stdout)
        return answers

    def check(base: str, superlink_log: Path) -> None:
        other = post(base, GUARDED, [str(setpriv), *NOBODY])
        mine = post(base, [LIST_RUNS], [])
        for path in GUARDED:
            status, body = other[path]
            assert status == 403, (path, other)
            assert "not the SuperLink's OS user" in body, (path, other)
        assert mine[LIST_RUNS][0] == 200, mine
        text = superlink_log.read_text(errors="replace")
        assert f"peer-uid guard: refused http {LIST_RUNS}" in text
        assert "(uid 65534)" in text

    return check
