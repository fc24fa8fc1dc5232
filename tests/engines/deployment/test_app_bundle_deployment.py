"""A sweep folder in the app's tree never reaches a SuperNode (``slow``).

``docs/sweeps.md`` runs ``tpsl-flwr sweep ... --out-dir sweep-paper`` from the
source tree's root, which leaves ``sweep-paper/runs/*/label-party/noise-key.json``
(the label party's secret noise key) in the folder ``flwr run`` bundles. This
test plants such a folder, marked by a unique string, in a copy of the source
tree's app (``pyproject.toml`` and ``tpsl_flwr``; the real tree is never
written), runs the TPSL app on a real loopback deployment, and looks for the
marker everywhere the SuperLink and the SuperNodes keep what they received: the
shared ``FLWR_HOME`` with the installed app (``apps/*``: every file of the
bundle, as Flower unpacks it) and the deployment's logs.
It uses only the deployment engine, so it runs unchanged on code from before
the bundle was staged (it failed there: the key was installed on the nodes).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from tpsl_flwr.engines.deployment.runtime import DeploymentRuntime
from tpsl_flwr.engines.processes import find_launched_processes
from tpsl_flwr.privacy.keyed_noise import NoiseKey
from tpsl_flwr.release.store import LabelStore

REPO = Path(__file__).resolve().parents[3]


def _app_with_sweep(app: Path, marker: str) -> list[str]:
    """Copy the source tree's app to ``app``; plant a sweep folder; its files."""
    app.mkdir()
    shutil.copy(REPO / "pyproject.toml", app)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "tpsl_flwr", app / "tpsl_flwr", ignore=ignore)
    run = Path(f"sweep-{marker}") / "runs" / "r1"
    planted = {
        run / "label-party" / "noise-key.json": f'{{"key": "{marker}"}}',
        run / "results.json": f'{{"test_auc": 0.7, "marker": "{marker}"}}',
        run / "report.md": f"# report {marker}\n",
        Path(f"sweep-{marker}") / "tables.md": f"| {marker} |\n",
    }
    for rel, text in planted.items():
        (app / rel).parent.mkdir(parents=True, exist_ok=True)
        (app / rel).write_text(text)
    return [str(rel) for rel in planted]


def _holding(folder: Path, marker: str) -> list[str]:
    """Paths under ``folder`` whose name or content holds ``marker``."""
    found = []
    needle = marker.encode()
    for path in folder.rglob("*"):
        if marker in str(path):
            found.append(str(path))
        elif path.is_file() and not path.is_symlink():
            try:
                if needle in path.read_bytes():
                    found.append(str(path))
            except OSError:
                continue
    return found


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_a_planted_sweep_folder_never_reaches_the_supernodes(tmp_path: Path) -> None:
    # Prepare: the app copy with a sweep's key, results and report beside it;
    # a tiny seeded run (3 round trips: hello, one train message, the query)
    marker = f"leak-{uuid.uuid4().hex}"
    app = tmp_path / "app"
    planted = _app_with_sweep(app, marker)
    out_dir = tmp_path / "out"
    LabelStore(out_dir / "label-party").provide_key(NoiseKey.from_seed(0), "seed")
    config: dict[str, Any] = {
        "dataset": "breast-cancer",
        "rows": 0,
        "mechanism": "laplace",
        "epsilon": 1.0,
        "epochs": 1,
        "batch-size": 128,
        "steps-per-message": 4,
        "num-parties": 2,
        "out-dir": str(out_dir),
    }
    logs = tmp_path / "logs"
    runtime = DeploymentRuntime(2, logs, startup_timeout=120)  # warm executors

    # Execute: the context ends every process it started (by PID)
    with runtime:
        run = runtime.run(app, config, timeout=300, check=False)

    # Assert: the run reached the nodes (their installed app is there)...
    assert find_launched_processes(runtime.launch_id) == []
    assert runtime.flwr_home is not None
    apps = runtime.flwr_home / "apps"
    installed = sorted(apps.iterdir()) if apps.is_dir() else []
    assert installed, f"no installed app: {run.status} {run.output[-2000:]}"
    for folder in installed:
        assert (folder / "tpsl_flwr" / "__init__.py").is_file()
    # ... and nothing of the planted folder is anywhere on their side: not in
    # the installed bundle, FLWR_HOME or the logs
    leaked = _holding(logs, marker)
    assert not leaked, f"planted {planted}; found on the node side: {leaked}"
    assert run.ok, f"{run.status} ({run.status_details})\n{run.output[-3000:]}"
