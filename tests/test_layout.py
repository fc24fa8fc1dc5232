"""The layout's promises: one-way layers, no import circles, a Flower-free core.

Every import counts: at module level, inside a function (imported on first
use) and under ``if TYPE_CHECKING:`` (type-only). A package may import its own
modules and any package on an earlier line of :data:`LAYERS`, never a later one.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import tpsl_flwr

PACKAGE = Path(tpsl_flwr.__file__).parent

LAYERS = """
errors        the project's error types (a module at the root)
_util         argument checks, finite checks, compact ints, owner-only files
privacy       mechanisms, keyed noise, GradPerturb, accounting (numpy, torch)
metrics       the one AUC, test metrics at the label party
data          tables, label-free party views, built-in data, data/ctr files
models        bottom and top networks, the DLRM interaction
release       label sets, the privacy ledger, the store, the release binding
attacks       attacks as pure scorers, and the audits that run them
parties       the two roles as plain torch
validation    the held-out split: which ids, their score, the best epoch
wire          both halves of every message: the one place that speaks Flower
strategies    TPSLStrategy: the label party inside Flower
engines       in-process grid, Flower launchers, the local deployment, warm executor
testing       the strategy harness and CTR file generators
experiments   the run config, one run on an engine, sweeps, reports
simulations   the built-in ServerApp and ClientApp, the Ray party actor
cli           tpsl-flwr, one module per command
__init__      the public surface (imports its names lazily)
"""
"""The layer order, lowest first: one line per package. ``testing`` sits where
its imports put it (the harness runs a strategy on the in-process engine), and
no module of the package imports it."""

ORDER = [line.split()[0] for line in LAYERS.strip().splitlines()]
FLOWER_FREE = ORDER[: ORDER.index("validation") + 1]
"""The core: every package below the wire imports no Flower."""

ROOT_MODULES_MAX = 2
SIZE_CAP = 600


def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name (packages by their name)."""
    found = {"tpsl_flwr": PACKAGE / "__init__.py"}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = modules()


def layer(module: str) -> str:
    """The line of :data:`LAYERS` a module belongs to."""
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _resolve(name: str) -> str | None:
    """The module ``name`` names, or the module holding the name it names."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in MODULES:
            return ".".join(parts)
        parts.pop()
    return None


def imports_of(module: str) -> Iterator[str]:
    """The project modules ``module`` imports, however and wherever it does."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            names = [f"{base}.{alias.name}" for alias in node.names] or [base]
            names = [n if n in MODULES else base for n in names]
        else:
            continue
        for name in names:
            if name == "tpsl_flwr" or name.startswith("tpsl_flwr."):
                target = _resolve(name)
                if target is not None and target != module:
                    yield target


GRAPH = {m: set(imports_of(m)) for m in MODULES}


def circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_every_package_has_one_line_in_the_layer_order():
    packages = {layer(m) for m in MODULES}
    assert packages == set(ORDER), packages ^ set(ORDER)
    assert len(ORDER) == len(set(ORDER))


def test_no_import_goes_up_the_layers():
    upward = [
        f"{a} -> {b}"
        for a, targets in sorted(GRAPH.items())
        for b in sorted(targets)
        if ORDER.index(layer(b)) > ORDER.index(layer(a))
    ]
    assert upward == []


def test_no_import_circles_type_only_imports_included():
    assert circles() == []


def test_nothing_imports_the_testing_package():
    users = [
        a
        for a, targets in GRAPH.items()
        if layer(a) != "testing" and any(layer(b) == "testing" for b in targets)
    ]
    assert users == []


def test_the_layer_check_sees_type_only_and_deferred_imports(tmp_path):
    # Prepare: a module whose only imports are type-only and deferred.
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from tpsl_flwr.cli.main import main\n"
        "def later():\n"
        "    from tpsl_flwr.strategies import TPSLStrategy\n"
    )
    MODULES["tpsl_flwr.privacy._probe"] = path = tmp_path / "_probe.py"
    path.write_text(source)
    try:
        # Execute
        found = set(imports_of("tpsl_flwr.privacy._probe"))
    finally:
        del MODULES["tpsl_flwr.privacy._probe"]
    # Assert
    assert found == {"tpsl_flwr.cli.main", "tpsl_flwr.strategies"}


def test_the_root_holds_at_most_two_modules_besides_init():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= ROOT_MODULES_MAX, loose


def test_no_module_is_over_600_lines_and_few_are_near_the_largest():
    sizes = {
        str(path.relative_to(PACKAGE)): len(path.read_text("utf-8").splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    too_long = {name: n for name, n in sizes.items() if n > SIZE_CAP}
    assert not too_long, too_long
    largest = max(sizes.values())
    near = sorted(name for name, n in sizes.items() if n >= 0.95 * largest)
    assert len(near) <= 3, near


def core_modules() -> list[str]:
    return sorted(m for m in MODULES if layer(m) in FLOWER_FREE)


def test_the_core_imports_with_flower_made_unimportable():
    # Prepare: a child interpreter in which `import flwr` fails.
    modules = core_modules()
    assert {
        "tpsl_flwr.parties",
        "tpsl_flwr.data",
        "tpsl_flwr.attacks",
        "tpsl_flwr.release.store",
        "tpsl_flwr.validation.best_epoch",
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


THIRD_PARTY_PRIVATE = {
    "argparse._SubParsersAction",
    "argparse._HelpAction",
    "parser._actions",
    "action._choices_actions",
    "ctypes._CFuncPtr",
    "server_main._lifespan",
    "TaskIdentity._run_id",
    "TaskIdentity._node_id",
    "TaskIdentity._task_id",
    "ordered._metadata",
    "os._exit",
}
"""Internals of argparse, ctypes, Flower and torch read on purpose (each
commented where it is read), and ``os._exit`` (documented, underscore and all:
the warm executor's watchdog ends the process from a thread); no project
object's private attribute is here."""


def test_no_module_reads_another_objects_private_attributes():
    offenders = []
    for module, path in sorted(MODULES.items()):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
                continue
            if node.attr.startswith("__") or (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            ):
                continue
            text = ast.unparse(node)
            if text not in THIRD_PARTY_PRIVATE:
                offenders.append(f"{module}:{node.lineno} {text}")
    assert offenders == []


def test_owner_only_files_go_through_private_files():
    # A file mode written as a number, or os.open/chmod by hand, outside the
    # one module that makes private files (a socket's umask excepted).
    allowed = {"tpsl_flwr._util.private_files"}
    offenders = []
    for module, path in sorted(MODULES.items()):
        if module in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in (0o600, 0o700):
                text = ast.get_source_segment(path.read_text("utf-8"), node) or ""
                if text.startswith("0o"):
                    offenders.append(f"{module}:{node.lineno} {text}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if (
                    isinstance(owner, ast.Name)
                    and owner.id == "os"
                    and node.func.attr in ("open", "chmod", "fchmod")
                ):
                    offenders.append(f"{module}:{node.lineno} os.{node.func.attr}")
    assert offenders == []


def test_walk_packages_finds_every_module_the_graph_knows():
    walked = {"tpsl_flwr"} | {
        info.name for info in pkgutil.walk_packages([str(PACKAGE)], prefix="tpsl_flwr.")
    }
    assert walked == set(MODULES)
