"""The layout's promises: a Flower-free core, one-way dependencies, small modules."""

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import tpsl_flwr

PACKAGE = Path(tpsl_flwr.__file__).parent
FLOWER_PACKAGES = (
    "wire",
    "strategies",
    "engines",
    "experiments",
    "simulations",
    "cli",
    "testing",
)
"""Subpackages that speak Flower (``testing`` holds the in-process harness);
everything else is the core."""


def core_modules():
    names = []
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="tpsl_flwr."):
        top = info.name.split(".")[1]
        if top not in FLOWER_PACKAGES:
            names.append(info.name)
    return sorted(names)


def test_the_core_imports_with_flower_made_unimportable():
    # Prepare: a child interpreter in which `import flwr` fails.
    modules = core_modules()
    assert {
        "tpsl_flwr.parties",
        "tpsl_flwr.data",
        "tpsl_flwr.attacks",
        "tpsl_flwr.privacy.noisy_labels",
    } <= set(modules)
    script = f"""
import importlib, importlib.abc, sys

class NoFlower(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "flwr" or name.startswith("flwr."):
            raise ImportError(f"flwr is unimportable in this test ({{name}})")
        return None

sys.meta_path.insert(0, NoFlower())
for name in {modules!r}:
    importlib.import_module(name)
assert not any(m == "flwr" or m.startswith("flwr.") for m in sys.modules)
print("ok", len({modules!r}))
"""
    # Execute
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    # Assert
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok")


def test_the_core_never_imports_a_flower_facing_package():
    # The dependency direction is one way: core <- wire <- strategies <- ...
    offenders = []
    for name in core_modules():
        module_path = PACKAGE.joinpath(*name.split(".")[1:])
        path = module_path / "__init__.py" if module_path.is_dir() else None
        path = path or module_path.with_suffix(".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                if parts[0] == "tpsl_flwr" and len(parts) > 1:
                    if parts[1] in FLOWER_PACKAGES:
                        offenders.append(f"{name} imports {node.module}")
    assert not offenders, offenders


def test_no_module_is_over_600_lines():
    too_long = {
        str(path.relative_to(PACKAGE)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > 600
    }
    assert not too_long, too_long
