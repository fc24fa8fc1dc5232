"""The import paths the docs give are the ones the examples use, and they work.

Issue row: where to import ``NoiseKey`` from (and ``num_classes``) was said
nowhere; an embedder had to read the source.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMPORT = re.compile(r"^\s*from (tpsl_flwr[\w.]*) import ([\w, ]+)", re.MULTILINE)


def imports_in(text: str) -> set[tuple[str, str]]:
    """``(module, name)`` of every ``from tpsl_flwr... import a, b`` line."""
    found = set()
    for module, names in IMPORT.findall(text):
        for name in names.split("#")[0].split(","):
            if name.strip():
                found.add((module, name.strip()))
    return found


def example_imports() -> set[tuple[str, str]]:
    files = sorted((ROOT / "examples").glob("*/*/*.py"))
    assert len(files) >= 12  # three examples, four modules or more each
    return set().union(*(imports_in(p.read_text()) for p in files))


@pytest.mark.parametrize("doc", ["docs/embedding.md", "docs/troubleshooting.md"])
def test_every_import_the_docs_give_works(doc):
    found = imports_in((ROOT / doc).read_text())
    assert found
    for module, name in sorted(found):
        assert hasattr(importlib.import_module(module), name), (module, name)


def test_the_embedding_guide_lists_every_import_the_examples_use():
    listed = imports_in((ROOT / "docs/embedding.md").read_text())
    assert example_imports() - listed == set()


def test_the_docs_say_num_classes_and_where_noise_key_lives():
    for doc in ("docs/embedding.md", "docs/troubleshooting.md"):
        text = (ROOT / doc).read_text()
        assert "num_classes=" in text
        assert "from tpsl_flwr import NoiseKey" in text
