"""The examples under examples/ run, learn, spend their epsilon, and keep labels home.

Each example is a complete Flower app (own pyproject.toml, package, data prep).
Fast tests run its data preparation, its label party (the ServerApp's
``build_strategy``) and its ClientApp in this process; one slow test per
example runs it with a real ``flwr run`` on Flower's Ray simulation.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from flwr.app import Context, RecordDict

from tpsl_flwr.testing import run_strategy

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@dataclass(frozen=True)
class Example:
    folder: str
    package: str
    metric: str
    threshold: float
    epsilon: float
    num_parties: int = 2

    @property
    def app_dir(self) -> Path:
        return EXAMPLES / self.folder

    def module(self, name: str) -> ModuleType:
        # Flower puts the app folder first on sys.path; so do we. The two
        # packages have distinct names, so both can be imported in one process.
        if str(self.app_dir) not in sys.path:
            sys.path.insert(0, str(self.app_dir))
        return importlib.import_module(f"{self.package}.{name}")


# Thresholds. Binary: chance is AUC 0.5; with ~160 positives and ~640 negatives
# among the 800 test rows the AUC of an uninformed scorer has a standard error
# of ~0.026, so 0.80 is > 10 standard errors above chance. Measured (the label
# party built by TPSLStrategy.for_labels with its defaults): 0.93-0.95 under
# Laplace eps = 1 over 10 fresh keys (0.95 without protection); the margin
# covers the key-to-key spread. Multi-class: 4 balanced classes, chance 0.25
# (standard error ~0.015 on 800 rows), measured 0.81-0.84 over 10 keys under
# randomized response eps = 2 (0.86 without protection); 0.60 is > 20 standard
# errors above chance. Three parties with categorical columns (Laplace eps = 2,
# 4 balanced classes, its own bottom and top models): measured 0.76-0.82 over
# 10 fresh keys after 3 epochs and 0.59-0.71 over 10 after 1 (0.91 without
# protection; Laplace noise on 4 logits spreads more from key to key); 0.50 is
# > 16 standard errors above chance 0.25 and below every run measured.
BINARY = Example("binary-tabular", "binary_tabular", "test_auc", 0.80, 1.0)
MULTICLASS = Example(
    "multiclass-tabular", "multiclass_tabular", "test_accuracy", 0.60, 2.0
)
THREE_PARTY = Example(
    "three-party-categorical", "three_party_categorical", "test_accuracy", 0.50, 2.0, 3
)
EXAMPLES_ALL = [
    pytest.param(BINARY, id="binary"),
    pytest.param(MULTICLASS, id="multiclass"),
    pytest.param(THREE_PARTY, id="three-party"),
]


def prepare(example: Example, out_dir: Path) -> Path:
    """Run the example's own ``prepare_data.py`` into ``out_dir``."""
    done = subprocess.run(
        [sys.executable, "prepare_data.py", "--out-dir", str(out_dir)],
        cwd=example.app_dir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out_dir


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        example.folder: prepare(example, tmp_path_factory.mktemp(example.package))
        for example in (BINARY, MULTICLASS, THREE_PARTY)
    }


def data_copy(prepared: dict[str, Path], example: Example, dest: Path) -> Path:
    shutil.copytree(prepared[example.folder], dest)
    return dest


def run_config(data: Path, tmp_path: Path, **extra: object) -> dict[str, object]:
    return {
        "data-dir": str(data),
        "out-dir": str(tmp_path / "out"),
        "checkpoint-dir": str(tmp_path / "checkpoints"),
        **extra,
    }


def node_context(
    data: Path, tmp_path: Path, partition: int, partitions: int = 2
) -> Context:
    node_config = {"partition-id": partition, "num-partitions": partitions}
    return Context(1, 7, node_config, RecordDict(), run_config(data, tmp_path))


def party_files(example: Example) -> list[str]:
    return [f"party-{i}.csv" for i in range(example.num_parties)]


@pytest.mark.parametrize("example", EXAMPLES_ALL)
def test_prepare_data_writes_one_label_file_and_one_file_per_party(example, prepared):
    # Prepare
    data = prepared[example.folder]
    # Assert: a record-id column everywhere, labels in one file only
    assert sorted(p.name for p in data.iterdir()) == [
        "labels.csv",
        *party_files(example),
    ]
    headers = {p.name: p.read_text().split("\n", 1)[0] for p in data.iterdir()}
    assert headers["labels.csv"] == "record_id,label"
    for name in party_files(example):
        assert headers[name].startswith(("record_id,x", "record_id,c"))
        assert "label" not in headers[name]


def test_three_party_example_has_a_categorical_only_party(prepared):
    # Prepare
    data = prepared[THREE_PARTY.folder]
    # Execute
    headers = [
        (data / name).read_text().split("\n", 1)[0].split(",")[1:]
        for name in party_files(THREE_PARTY)
    ]
    # Assert: numeric only, categorical only, mixed
    kinds = [sorted({column[0] for column in header}) for header in headers]
    assert kinds == [["x"], ["c"], ["c", "x"]]


@pytest.mark.parametrize("example", EXAMPLES_ALL)
def test_example_learns_with_its_epsilon_and_nodes_never_read_labels(
    example, prepared, tmp_path, one_torch_thread
):
    # Prepare: the label party reads its labels, then the label file is gone
    # for the rest of the run, so the nodes' code path cannot have used it.
    data = data_copy(prepared, example, tmp_path / "data")
    config = run_config(data, tmp_path)
    strategy = example.module("task").build_strategy(config)
    (data / "labels.csv").unlink()
    client_app = example.module("client_app").app
    # Execute
    report = run_strategy(
        strategy, client_app, num_nodes=example.num_parties, run_config=config
    )
    # Assert
    assert report.epsilon_spent == example.epsilon
    assert report.result.epsilon_spent == example.epsilon
    assert len(report.history) == 3
    assert report.history[-1][example.metric] > example.threshold
    parties = list(range(example.num_parties))
    assert sorted(report.dispatched) == parties  # every node got gradients
    nodes = tmp_path / "checkpoints" / "nodes"
    assert sorted(p.name for p in nodes.iterdir()) == [
        name
        for i in parties
        # the epoch before: what a resume may need
        for name in (f"party-{i}.previous.pt", f"party-{i}.pt")
    ]


@pytest.mark.parametrize("example", EXAMPLES_ALL)
def test_server_app_main_writes_results(example, prepared, tmp_path, one_torch_thread):
    # Prepare
    from tpsl_flwr.engines.inprocess_run import run_inprocess

    data = data_copy(prepared, example, tmp_path / "data")
    config = run_config(data, tmp_path, epochs=1)
    # Execute: the ServerApp's own main and the ClientApp, in this process
    run_inprocess(
        example.module("server_app").app,
        example.module("client_app").app,
        example.num_parties,
        run_config=config,
    )
    # Assert
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["epsilon_spent"] == example.epsilon
    # the first release of these labels in the (test's private) ledger
    assert results["epsilon_total"] == example.epsilon
    assert results[example.metric] > example.threshold
    assert len(results["history"]) == 1


@pytest.mark.parametrize("example", EXAMPLES_ALL)
def test_node_needs_only_its_own_feature_file(example, prepared, tmp_path):
    # Prepare: a folder holding party 1's file and nothing else
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(prepared[example.folder] / "party-1.csv", data)
    n = example.num_parties
    node_party = example.module("client_app").node_party
    # Execute
    party = node_party(node_context(data, tmp_path, 1, n))
    # Assert: 4000 rows, record_id % 5 == 0 is test
    assert party.num_samples("train") == 3200
    assert party.num_samples("test") == 800
    with pytest.raises(FileNotFoundError, match=r"party-0\.csv"):
        node_party(node_context(data, tmp_path, 0, n))


@pytest.mark.parametrize("example", EXAMPLES_ALL)
def test_label_party_needs_only_the_label_file(example, prepared, tmp_path):
    # Prepare
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(prepared[example.folder] / "labels.csv", data)
    # Execute
    strategy = example.module("task").build_strategy(run_config(data, tmp_path))
    # Assert
    assert strategy.num_train == 3200
    assert strategy.test_labels.size == 800
    assert strategy.privacy.epsilon == example.epsilon


def test_membership_and_wire_ids_depend_on_record_ids_only(prepared):
    # Prepare: the label file and a party file list rows in different orders
    task = BINARY.module("task")
    data = prepared[BINARY.folder]
    label_ids, labels, _ = task.read_table(data / "labels.csv")
    party_ids, _, _ = task.read_table(data / "party-0.csv")
    raw = [line.split(",", 1)[0] for line in (data / "labels.csv").open()][1:5]
    # Assert: the files are not row-aligned, the loaders are record-id-aligned
    assert raw != sorted(raw, key=int)
    assert (label_ids == party_ids).all()
    rows = task.split_rows(label_ids)
    assert (label_ids[rows["test"]] % 5 == 0).all()
    assert (label_ids[rows["train"]] % 5 != 0).all()
    assert (labels[rows["test"], 0] == task.load_labels(data)[1]).all()


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES_ALL)
def test_example_runs_with_flwr_run_on_ray(example, prepared, tmp_path):
    # Prepare
    from tpsl_flwr.engines.simulation import run_flwr_simulation

    config = run_config(prepared[example.folder], tmp_path, epochs=1)
    # Execute
    run = run_flwr_simulation(
        example.app_dir,
        example.num_parties,
        config,
        flwr_home=tmp_path / "flwr-home",
        timeout=300,
        check=False,
    )
    # Assert
    assert run.status == "finished:completed", run.output[-3000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["epsilon_spent"] == example.epsilon
    assert results[example.metric] > example.threshold
