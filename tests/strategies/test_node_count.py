"""The node count checked at connect time, both ways, naming the fix.

Issue rows: 2 SuperNodes for 3 parties (the 60 s wait was pure loss on Ray,
and nothing named ``num-supernodes``); 4 SuperNodes for 3 parties (the extra
node got work and failed inside Ray's wrapper). The waits run on a fake clock
(no wall-clock assertion): the test reads how much *simulated* time passed.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from flwr.superlink.grid import InMemoryGrid

from tests.conftest import ToyBottom
from tpsl_flwr import NoiseKey, ProtocolError, make_mechanism
from tpsl_flwr.engines.inprocess import InProcessGrid
from tpsl_flwr.models import TopModel
from tpsl_flwr.parties import LabelParty, NonLabelParty, adam
from tpsl_flwr.strategies import TPSLStrategy, node_count
from tpsl_flwr.strategies.node_count import SETTLE_S, wait_for_nodes
from tpsl_flwr.wire.node_side import make_client_app

ROWS, COLS, WIDTH = 16, 2, 2
X = np.random.default_rng(0).normal(size=(ROWS, 4 * COLS)).astype(np.float32)
Y = np.arange(ROWS) % 2


class FakeClock:
    """``time.monotonic`` and ``time.sleep`` of node_count, without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(node_count.time, "monotonic", fake.monotonic)
    monkeypatch.setattr(node_count.time, "sleep", fake.sleep)
    return fake


class ListedGrid:
    """A grid that lists ``counts[k]`` nodes at its k-th look, then the last."""

    def __init__(self, *counts: int) -> None:
        self.counts = list(counts)
        self.pushed: list[object] = []

    def get_node_ids(self) -> list[int]:
        count = self.counts.pop(0) if len(self.counts) > 1 else self.counts[0]
        return [100 + i for i in range(count)]

    def push_messages(self, messages):  # pragma: no cover - must not be called
        self.pushed += list(messages)
        raise AssertionError("no message may be sent")


class SimulatedGrid(ListedGrid, InMemoryGrid):
    """Flower's Ray-simulation grid type, listing nodes as :class:`ListedGrid`."""

    def __init__(self, *counts: int) -> None:  # no LinkState needed
        ListedGrid.__init__(self, *counts)


def test_too_few_nodes_fail_as_soon_as_the_count_settles_naming_the_fix(clock):
    # Prepare: nodes register at once (0 at first, then 2 of the 3 needed)
    grid = SimulatedGrid(0, 0, 2)
    # Execute
    with pytest.raises(ProtocolError) as err:
        wait_for_nodes(grid, 3, wait=60.0)  # type: ignore[arg-type]
    # Assert: one line naming num-parties and num-supernodes, long before 60 s
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("expected 3 non-label nodes, only 2 registered")
    assert "num-parties = 3" in message
    assert '--federation-config "num-supernodes=3"' in message
    assert clock.now - 1000.0 < SETTLE_S + 1.0  # simulated seconds


def test_on_the_deployment_runtime_too_few_nodes_wait_the_whole_node_wait(
    clock, monkeypatch
):
    # Prepare: SuperNodes join over the network whenever they are started
    monkeypatch.setattr(node_count, "registers_at_once", lambda grid: False)
    grid = ListedGrid(2)
    # Execute
    with pytest.raises(ProtocolError, match="only 2 registered within 60 s") as err:
        wait_for_nodes(grid, 3, wait=60.0)  # type: ignore[arg-type]
    # Assert
    assert clock.now - 1000.0 >= 60.0
    assert "num-supernodes=3" in str(err.value)


def test_a_node_registering_late_resets_the_settle_time(clock):
    # Prepare: 1 node for 2.8 s, then 2 for 2.8 s, then 3: each count is
    # stable for less than SETTLE_S, but 1 and 2 together for longer, so
    # without the reset the wait would give up with 2 nodes
    looks = round((SETTLE_S - 0.2) / node_count.POLL_S)
    grid = ListedGrid(*[1] * looks, *[2] * looks, 3)
    # Execute
    ids = wait_for_nodes(grid, 3, wait=60.0)  # type: ignore[arg-type]
    # Assert
    assert ids == [100, 101, 102]


def test_an_extra_node_on_ray_is_refused_before_any_message_naming_it(clock):
    # Prepare: 4 virtual nodes for 3 parties
    grid = SimulatedGrid(4)
    # Execute
    with pytest.raises(ProtocolError) as err:
        wait_for_nodes(grid, 3, wait=60.0)  # type: ignore[arg-type]
    # Assert
    message = str(err.value)
    assert message.startswith("4 non-label nodes registered but the run has ")
    assert "num-parties = 3" in message and "partition 3 are extra" in message
    assert '"num-supernodes=3"' in message
    assert grid.pushed == []


def test_the_exact_count_on_ray_is_confirmed_then_used(clock):
    grid = SimulatedGrid(3)
    assert wait_for_nodes(grid, 3, wait=60.0) == [100, 101, 102]  # type: ignore[arg-type]


# ---------------------------------------------------------- with real nodes
def make_factory(built: list[int]):
    def factory(context):
        part = int(context.node_config["partition-id"])
        built.append(part)
        cols = slice(COLS * part, COLS * part + COLS)
        torch.manual_seed(part)
        return NonLabelParty(
            {"train": (X[:, cols], None)}, ToyBottom(COLS, WIDTH), adam(0.05)
        )

    return factory


def strategy(num_nodes: int) -> TPSLStrategy:
    torch.manual_seed(0)
    party = LabelParty(
        TopModel(num_nodes * WIDTH, hidden=(), num_outputs=1),
        Y,
        make_mechanism("laplace", epsilon=1.0),
        NoiseKey.from_seed(0),
    )
    return TPSLStrategy(party, batch_size=8, num_nodes=num_nodes, node_wait=1.0)


def run(num_nodes: int, parties: int, run_config: dict | None = None):
    built: list[int] = []
    app = make_client_app(make_factory(built))
    grid = InProcessGrid(app, num_nodes, run_config=run_config)
    with pytest.raises(ProtocolError) as err:
        grid.run_server(lambda grid, context: strategy(parties).start(grid))
    return str(err.value), built


def test_an_extra_node_is_refused_before_its_factory_runs_with_num_parties():
    # Execute: 3 nodes, a run config with num-parties = 2
    message, built = run(3, 2, {"num-parties": 2})
    # Assert: the edge refused every node before the embedder's factory
    assert built == []
    assert "\n" not in message
    assert re.search(
        r"\(partition \d\) replied with an error: ConfigError: this", message
    )
    assert "num-partitions = 3, but the run config has num-parties = 2" in message
    assert '"num-supernodes=2"' in message


def test_an_extra_node_is_refused_before_any_step_naming_node_and_partition():
    # Execute: 3 nodes and no num-parties in the run config (an embedder's app)
    message, built = run(3, 2)
    # Assert: refused after the hello, by node id and partition; no step ran
    assert sorted(built) == [0, 1, 2]
    assert "3 non-label nodes answered but the run has num-parties = 2" in message
    assert "(partition 2) refused before any training step" in message
    assert '"num-supernodes=2"' in message


# ------------------------------------------------------------ one Ray run
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("supernodes", "expected"),
    [
        (1, "expected 2 non-label nodes, only 1 registered and no more came"),
        (3, "3 non-label nodes registered but the run has num-parties = 2"),
    ],
    ids=["fewer", "more"],
)
def test_flwr_run_on_ray_refuses_a_wrong_node_count_naming_num_supernodes(
    tmp_path, supernodes, expected
):
    # Prepare: the project's app on breast-cancer, num-parties = 2
    from pathlib import Path

    from tpsl_flwr.engines.simulation import run_flwr_simulation
    from tpsl_flwr.experiments.run_folder import read_failure

    app_dir = Path(__file__).resolve().parents[2]
    out = tmp_path / "out"
    config = {"dataset": "breast-cancer", "rows": 0, "num-parties": 2}
    config.update({"epochs": 1, "out-dir": str(out)})
    # Execute
    run = run_flwr_simulation(
        app_dir,
        supernodes,
        config,
        flwr_home=tmp_path / "flwr-home",
        timeout=240,
        check=False,
    )
    # Assert: the run failed, with one line naming num-parties and the fix
    print(
        f"{supernodes} SuperNodes for 2 parties: flwr run {run.wall_s:.1f} s, "
        f"exit status {run.returncode}, status {run.status}"
    )
    assert run.status.startswith("finished:failed"), run.output[-3000:]
    failure = read_failure(out)
    assert failure is not None and failure.startswith(expected), failure
    assert "num-parties = 2" in failure
    assert '--federation-config "num-supernodes=2"' in failure
    assert expected in run.output
    assert not (out / "results.json").exists()
