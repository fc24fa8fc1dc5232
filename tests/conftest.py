"""Fixtures shared by the test modules."""

import os
from collections.abc import Iterator

import pytest
import torch


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

    The label party's ledger (:mod:`tpsl_flwr.ledger`) lives outside every run
    folder; a test that wrote to the default one would make later runs over
    the same labels refuse. Processes a test starts inherit the variable.
    """
    from tpsl_flwr.ledger import LEDGER_ENV

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
