"""The Flower app bundle holds the app's code only (``engines/app_bundle.py``).

``flwr run <folder>`` packs every ``*.json``/``*.md``/``*.toml``/``*.py`` of the
folder into the bundle every SuperNode installs; a sweep run from the source
tree's root left ``runs/*/label-party/noise-key.json`` there. These tests stage
copies of app folders with such files planted and check what would be sent.
The same leak on a real deployment is
``tests/engines/deployment/test_app_bundle_deployment.py``.
"""

from __future__ import annotations

import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from tpsl_flwr.engines import flwr_cli
from tpsl_flwr.engines.app_bundle import (
    PRIVATE_NAMES,
    bundle_files,
    check_bundle,
    staged_app,
)
from tpsl_flwr.errors import ConfigError, PrivacyError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "binary-tabular"
PLANTED = (
    "sweep-paper/runs/r1/label-party/noise-key.json",
    "sweep-paper/runs/r1/label-party/checkpoint.pt",
    "sweep-paper/runs/r1/results.json",
    "sweep-paper/runs/r1/summary-public.json",
    "sweep-paper/report.md",
    "sweep-paper/tables.md",
    "ledger/secret.key",
    "ledger/0123abcd.jsonl",
    "outputs/run/results.json",
    "tests/test_task.py",
    "docs/notes.md",
    "notes.json",
)


def _plant(app: Path, paths: tuple[str, ...] = PLANTED) -> None:
    for rel in paths:
        (app / rel).parent.mkdir(parents=True, exist_ok=True)
        (app / rel).write_text('{"planted": true}\n')


def _copy_example(tmp_path: Path) -> Path:
    app = tmp_path / "binary-tabular"
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("__pycache__"))
    cache = app / "binary_tabular" / "__pycache__"
    cache.mkdir()
    (cache / "task.cpython-311.pyc").write_bytes(b"\0")
    (cache / "stale.py").write_text("x = 1\n")
    return app


def _tree(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_a_staged_example_holds_its_pyproject_and_package_only(tmp_path):
    # Prepare: a copy of an example with run outputs, a ledger, tests, docs
    # and a __pycache__ planted beside (and in) its package
    app = _copy_example(tmp_path)
    _plant(app)
    package = {f"binary_tabular/{p.name}" for p in app.glob("binary_tabular/*.py")}

    # Execute
    with staged_app(app) as staged:
        held = _tree(staged)
        mode = stat.S_IMODE(staged.stat().st_mode)

    # Assert: pyproject.toml and the package the components name, nothing else
    # (no README, no prepare_data.py, no planted file, no __pycache__)
    assert package and held == {"pyproject.toml", *package}
    assert not staged.exists()  # removed on exit
    assert mode == 0o700


def test_the_projects_own_app_stages_its_package_and_package_data(tmp_path):
    # Prepare: a copy of the source tree's app (pyproject.toml and tpsl_flwr,
    # __pycache__ folders included) with a sweep's run folder at its root
    app = tmp_path / "tpsl-app"
    app.mkdir()
    shutil.copy(REPO / "pyproject.toml", app)
    shutil.copytree(REPO / "tpsl_flwr", app / "tpsl_flwr")
    (app / "tpsl_flwr" / "__pycache__").mkdir(exist_ok=True)
    (app / "tpsl_flwr" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    _plant(app)

    # Execute
    files = bundle_files(app)
    with staged_app(app) as staged:
        held = _tree(staged)

    # Assert: every module and the package data, and nothing planted
    expected = {"pyproject.toml"}
    expected |= {
        p.relative_to(app).as_posix()
        for p in (app / "tpsl_flwr").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    expected |= {
        "tpsl_flwr/engines/deployment/fleet-proxy.nginx.conf",
        *(
            f"tpsl_flwr/simulations/configs/{p.name}"
            for p in (app / "tpsl_flwr/simulations/configs").glob("*.toml")
        ),
    }
    assert set(files) == held == expected
    assert not any("sweep-paper" in rel or "__pycache__" in rel for rel in held)
    assert files["tpsl_flwr/__init__.py"] == app / "tpsl_flwr" / "__init__.py"


@pytest.mark.parametrize(
    "planted",
    [
        "binary_tabular/results.json",
        "binary_tabular/runs/r1/label-party/noise-key.json",
        "binary_tabular/label-party/helper.py",
        "binary_tabular/ledger/0123abcd.jsonl",
        "binary_tabular/results.previous.json",
    ],
)
def test_a_private_named_file_in_a_component_package_is_refused(tmp_path, planted):
    # Prepare
    app = _copy_example(tmp_path)
    _plant(app, (planted,))

    # Execute / Assert: refused with the file named, nothing staged
    before = set(Path(tempfile.gettempdir()).glob("tpsl-flwr-app-*"))
    with pytest.raises(PrivacyError, match="would be sent to every SuperNode") as err:
        with staged_app(app):
            pytest.fail("staged a private file")
    assert str(app / planted) in str(err.value)
    assert set(Path(tempfile.gettempdir()).glob("tpsl-flwr-app-*")) == before


def test_private_names_cover_the_projects_private_outputs():
    # Prepare: the names the project's own modules write
    from tpsl_flwr.experiments.audience import LABEL_PARTY_ONLY_FILES, PUBLIC_SUMMARY
    from tpsl_flwr.experiments.config import LABEL_DIR
    from tpsl_flwr.experiments.experiment import EVALUATION_LABELS
    from tpsl_flwr.experiments.run_folder import RUN_ENTRIES
    from tpsl_flwr.release.ledger import SECRET_FILE
    from tpsl_flwr.release.store import ACK_FILE, CHECKPOINT_FILE, KEY_FILE

    names = {LABEL_DIR, KEY_FILE, CHECKPOINT_FILE, ACK_FILE, EVALUATION_LABELS}
    names |= {SECRET_FILE, "0123abcd.jsonl", PUBLIC_SUMMARY}
    names |= set(RUN_ENTRIES) | set(LABEL_PARTY_ONLY_FILES)

    # Execute / Assert: each one, as a file or a folder, is refused
    for name in sorted(names):
        for rel in (f"app/{name}", f"app/{name}/x.py"):
            with pytest.raises(PrivacyError, match=repr(name)):
                check_bundle({rel: Path(rel)})
    assert len(PRIVATE_NAMES) == len(set(PRIVATE_NAMES))


def test_a_module_component_and_a_missing_one(tmp_path):
    # Prepare: an app whose components are two top-level modules
    app = tmp_path / "flat-app"
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("__pycache__"))
    text = (app / "pyproject.toml").read_text()
    text = text.replace('"binary_tabular.server_app:app"', '"server:app"')
    (app / "pyproject.toml").write_text(text)
    (app / "server.py").write_text("app = None\n")

    # Execute / Assert: the module file and the package of the other component
    held = set(bundle_files(app))
    assert "server.py" in held and "binary_tabular/client_app.py" in held
    assert "binary_tabular/server_app.py" in held  # the whole package ships
    (app / "server.py").unlink()
    with pytest.raises(ConfigError, match=r"serverapp = 'server:app'.*server\.py"):
        bundle_files(app)


def test_an_installed_component_is_loaded_from_the_environment(tmp_path):
    # Prepare: the project's own ServerApp, installed, beside a probe ClientApp
    app = tmp_path / "probe-app"
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("__pycache__"))
    text = (app / "pyproject.toml").read_text()
    text = text.replace(
        '"binary_tabular.server_app:app"', '"tpsl_flwr.simulations.server_app:app"'
    )
    (app / "pyproject.toml").write_text(text)

    # Execute / Assert: nothing of tpsl_flwr ships; an unknown module is refused
    held = set(bundle_files(app))
    assert not any(name.startswith("tpsl_flwr") for name in held)
    assert "binary_tabular/client_app.py" in held
    (app / "pyproject.toml").write_text(text.replace("tpsl_flwr.", "no_such_pkg."))
    with pytest.raises(ConfigError, match="no installed module 'no_such_pkg'"):
        bundle_files(app)


def test_flwr_run_gives_flower_the_staged_folder(tmp_path, monkeypatch):
    # Prepare: a stand-in `flwr run` that records the folder it was given
    app = _copy_example(tmp_path)
    _plant(app)
    seen: dict[str, object] = {}

    class _Cli:
        def __init__(self, cmd, stdout, **_kwargs):
            folder = Path(cmd[2])
            seen.update(folder=folder, held=_tree(folder), cmd=cmd)
            stdout.write("Successfully started run 7\n")
            stdout.flush()
            self.returncode = 0

        def wait(self, timeout=None):
            return 0

        def poll(self):
            return 0

    monkeypatch.setattr(flwr_cli.subprocess, "Popen", _Cli)
    log = tmp_path / "flwr-run.log"

    # Execute
    run_id, code, _output, _wall = flwr_cli.flwr_run(app, "local", [], {}, log, 5.0)

    # Assert: Flower built from a staged copy of the code, gone afterwards
    assert (run_id, code) == (7, 0)
    folder = seen["folder"]
    assert isinstance(folder, Path) and folder != app and not folder.exists()
    held = seen["held"]
    assert held == set(bundle_files(app))
    assert isinstance(held, set) and not any("sweep-paper" in rel for rel in held)


def test_flwr_run_refuses_before_starting_flower(tmp_path, monkeypatch):
    # Prepare
    app = _copy_example(tmp_path)
    _plant(app, ("binary_tabular/noise-key.json",))

    def _no_cli(*_args, **_kwargs):
        raise AssertionError("flwr run started")

    monkeypatch.setattr(flwr_cli.subprocess, "Popen", _no_cli)

    # Execute / Assert
    with pytest.raises(PrivacyError, match=r"binary_tabular/noise-key\.json"):
        flwr_cli.flwr_run(app, "local", [], {}, tmp_path / "flwr-run.log", 5.0)
