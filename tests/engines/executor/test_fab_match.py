"""Which installed app bundles run warm: allow-listed, and the code imported here."""

from __future__ import annotations

import hashlib
import io
import shutil
import zipfile
from pathlib import Path

import pytest

import tpsl_flwr
from tpsl_flwr.engines.app_bundle import staged_app
from tpsl_flwr.engines.executor.fab_match import (
    DEFAULT_WARM_APP,
    code_difference,
    find_installed,
    install_bundle,
    judge_fab,
    judge_fab_bytes,
    package_digest,
)
from tpsl_flwr.engines.executor.flower_seam import build_fab_from_disk

PACKAGE = Path(tpsl_flwr.__file__).resolve().parent
PYPROJECT = PACKAGE.parent / "pyproject.toml"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An installed FAB of this package, as Flower lays one out."""
    home = tmp_path_factory.mktemp("flwr-home")
    app = home / "apps" / "tpsl-flwr.tpsl-flwr.0.1.0.0123abcd"
    shutil.copytree(
        PACKAGE, app / "tpsl_flwr", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(PYPROJECT, app / "pyproject.toml")
    return app


def _copy(installed: Path, tmp_path: Path) -> Path:
    app = tmp_path / "app"
    shutil.copytree(installed, app)
    return app


def test_the_projects_own_bundle_runs_warm(installed: Path) -> None:
    # Execute
    verdict = judge_fab(installed, [DEFAULT_WARM_APP])

    # Assert
    assert verdict.warm, verdict.reason
    assert verdict.app_ref == DEFAULT_WARM_APP


def test_an_app_off_the_allow_list_does_not(installed: Path) -> None:
    # Execute
    verdict = judge_fab(installed, ["other_app.client:app"])

    # Assert
    assert not verdict.warm
    assert verdict.reason == (
        f"ClientApp {DEFAULT_WARM_APP!r} is not in --warm-app ['other_app.client:app']"
    )


def test_one_changed_byte_keeps_the_bundle_cold_naming_the_file(
    installed: Path, tmp_path: Path
) -> None:
    # Prepare: the bundle's node handlers differ from the imported ones
    app = _copy(installed, tmp_path)
    changed = app / "tpsl_flwr" / "wire" / "node_side.py"
    changed.write_bytes(changed.read_bytes() + b"\n")

    # Execute
    verdict = judge_fab(app, [DEFAULT_WARM_APP])

    # Assert
    assert not verdict.warm
    assert verdict.reason is not None
    assert "tpsl_flwr/wire/node_side.py differs from the imported" in verdict.reason


def test_a_module_the_bundle_lacks_or_adds_keeps_it_cold(
    installed: Path, tmp_path: Path
) -> None:
    # Prepare: one bundle without a module imported here, one with an extra
    lacking = _copy(installed, tmp_path / "a")
    (lacking / "tpsl_flwr" / "errors.py").unlink()
    extra = _copy(installed, tmp_path / "b")
    (extra / "tpsl_flwr" / "planted.py").write_text("x = 1\n")

    # Execute / Assert
    assert code_difference(lacking, "tpsl_flwr.simulations.client_app") == (
        "tpsl_flwr/errors.py is imported here but not in the FAB"
    )
    found = code_difference(extra, "tpsl_flwr.simulations.client_app")
    assert found is not None and found.startswith("tpsl_flwr/planted.py is in the FAB")


def test_a_bundle_without_a_clientapp_reference_stays_cold(tmp_path: Path) -> None:
    # Prepare
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')

    # Execute
    verdict = judge_fab(tmp_path, [DEFAULT_WARM_APP])

    # Assert
    assert not verdict.warm and verdict.app_ref is None
    assert verdict.reason is not None and "no ClientApp reference" in verdict.reason


def test_the_installed_folder_is_found_by_the_hash_prefix(installed: Path) -> None:
    home = installed.parents[1]

    assert find_installed("0123abcd" + "e" * 56, home) == installed
    assert find_installed("ffffffff" + "e" * 56, home) is None


def test_the_bundle_is_held_to_the_code_as_it_was_imported(
    installed: Path, tmp_path: Path
) -> None:
    # Prepare: the digest taken at the executor's start, then a bundle whose
    # node handlers differ (as if the package were upgraded in place later)
    at_start = package_digest("tpsl_flwr.simulations.client_app")
    app = _copy(installed, tmp_path)
    changed = app / "tpsl_flwr" / "wire" / "node_side.py"
    changed.write_bytes(changed.read_bytes() + b"# upgraded\n")
    later = {**at_start, "wire/node_side.py": "0" * 64}

    # Execute / Assert: held to what was loaded, not to the folder now
    verdict = judge_fab(app, [DEFAULT_WARM_APP], {DEFAULT_WARM_APP: at_start})
    assert verdict.reason is not None and "node_side.py differs" in verdict.reason
    assert code_difference(installed, "tpsl_flwr.simulations.client_app", later) == (
        "tpsl_flwr/wire/node_side.py differs from the imported copy"
    )
    assert judge_fab(installed, [DEFAULT_WARM_APP], {DEFAULT_WARM_APP: at_start}).warm


def test_a_bundle_installed_before_the_run_is_the_one_flwr_run_ships(
    tmp_path: Path,
) -> None:
    # Prepare: the project's app staged as flwr_run stages it
    home = tmp_path / "flwr-home"
    with staged_app(PACKAGE.parent) as staged:
        shipped = hashlib.sha256(build_fab_from_disk(staged)).hexdigest()

        # Execute: install it before the run, as DeploymentRuntime.run does
        fab_hash = install_bundle(staged, home)
        again = install_bundle(staged, home)  # an existing install is kept

    # Assert: the same hash as the bytes flwr run builds (Flower's build is
    # deterministic), found by that hash, and judged warm at the first task
    assert fab_hash == shipped == again
    folder = find_installed(fab_hash, home)
    assert folder is not None and folder.parent == home / "apps"
    assert judge_fab(folder, [DEFAULT_WARM_APP]).warm
    assert find_installed(fab_hash.replace(fab_hash[0], "x", 1), home) is None


def _rezip(content: bytes, name: str, data: bytes | None) -> bytes:
    """The bundle ``content`` with file ``name`` replaced (None: removed)."""
    out = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(content)) as source,
        zipfile.ZipFile(out, "w") as target,
    ):
        for info in source.infolist():
            if info.filename != name:
                target.writestr(info, source.read(info))
        if data is not None:
            target.writestr(name, data)
    return out.getvalue()


def test_a_bundles_own_bytes_are_judged_as_its_installed_folder_is() -> None:
    # Prepare: the project's bundle as flwr run builds it
    with staged_app(PACKAGE.parent) as staged:
        fab = build_fab_from_disk(staged)
    node_side = "tpsl_flwr/wire/node_side.py"
    with zipfile.ZipFile(io.BytesIO(fab)) as z:
        original = z.read(node_side)

    # Execute
    warm = judge_fab_bytes(fab, [DEFAULT_WARM_APP])
    changed = judge_fab_bytes(
        _rezip(fab, node_side, original + b"# 1\n"), [DEFAULT_WARM_APP]
    )
    missing = judge_fab_bytes(_rezip(fab, node_side, None), [DEFAULT_WARM_APP])
    foreign = judge_fab_bytes(fab, ["theirapp.client:app"])
    broken = judge_fab_bytes(b"not a zip", [DEFAULT_WARM_APP])

    # Assert
    assert warm.warm and warm.app_ref == DEFAULT_WARM_APP
    assert changed.reason is not None and "node_side.py differs" in changed.reason
    assert missing.reason is not None and "node_side.py is imported here but not" in (
        missing.reason
    )
    assert foreign.reason is not None and "not in --warm-app" in foreign.reason
    assert broken.reason is not None and "no ClientApp reference" in broken.reason
