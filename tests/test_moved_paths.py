"""Module paths of the previous layout still import, for one release, and warn."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

import tpsl_flwr

OLD_SURFACE = [
    ("tpsl_flwr.label_store", "LabelRecords"),
    ("tpsl_flwr.label_store", "LabelStore"),
    ("tpsl_flwr.label_store", "NoiseBinding"),
    ("tpsl_flwr.ledger", "PrivacyLedger"),
    ("tpsl_flwr.ledger", "LEDGER_ENV"),
    ("tpsl_flwr.private_files", "read_private"),
    ("tpsl_flwr.evaluation", "classification_metrics"),
    ("tpsl_flwr.interaction", "DotInteractionTop"),
    ("tpsl_flwr.outputs", "num_outputs_for"),
    ("tpsl_flwr.wire.client_app", "make_client_app"),
    ("tpsl_flwr.engines.flower_run", "run_on_ray"),
    ("tpsl_flwr.simulations.cli", "main"),
    ("tpsl_flwr.privacy.label_noise", "NoisyLabels"),
]
"""What ``docs/`` and ``examples/`` imported from moved modules, by the old path."""


def _fresh(old: str) -> None:
    """Forget the alias, so the next import of ``old`` goes through the finder."""
    sys.modules.pop(old, None)
    parent, _, leaf = old.rpartition(".")
    if parent in sys.modules and leaf in vars(sys.modules[parent]):
        delattr(sys.modules[parent], leaf)


@pytest.mark.parametrize("old", sorted(tpsl_flwr.MOVED))
def test_an_old_path_is_the_new_module_with_a_deprecation_warning(old):
    # Prepare
    new = tpsl_flwr.MOVED[old]
    _fresh(old)
    # Execute
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    # Assert: one module object, which keeps its own name and spec
    assert module is importlib.import_module(new)
    assert module.__name__ == new
    assert module.__spec__ is not None and module.__spec__.name == new


@pytest.mark.parametrize(("old", "name"), OLD_SURFACE)
def test_the_old_embedding_imports_give_the_same_objects(old, name):
    # Prepare
    new = tpsl_flwr.MOVED[old]
    _fresh(old)
    # Execute
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scope: dict[str, object] = {}
        exec(f"from {old} import {name} as got", scope)
    # Assert
    assert scope["got"] is getattr(importlib.import_module(new), name)


def test_an_old_root_module_is_an_attribute_of_the_package():
    _fresh("tpsl_flwr.label_store")
    with pytest.warns(DeprecationWarning, match="tpsl_flwr.label_store moved"):
        store = tpsl_flwr.label_store  # type: ignore[attr-defined]
    assert store.LabelStore is importlib.import_module("tpsl_flwr.release").LabelStore


def test_the_warning_names_the_importing_line_in_a_fresh_interpreter():
    # Execute: a script that imports an old path, warnings shown
    code = "from tpsl_flwr.label_store import LabelStore\n"
    done = subprocess.run(
        [sys.executable, "-W", "always::DeprecationWarning", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Assert: the warning points at the script, not at importlib
    assert done.returncode == 0, done.stderr[-2000:]
    assert "<string>:1: DeprecationWarning: tpsl_flwr.label_store moved" in done.stderr


def test_python_dash_m_of_an_old_path_runs_the_new_module():
    done = subprocess.run(
        [sys.executable, "-m", "tpsl_flwr.simulations.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: tpsl-flwr")


def test_unknown_names_still_fail():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("tpsl_flwr.no_such_module")
    with pytest.raises(AttributeError):
        tpsl_flwr.no_such_name  # type: ignore[attr-defined] # noqa: B018
