"""The command line of a docs page generated from the code (write, or ``--check``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
"""The project's folder (this file's parent's parent)."""


def page_main(
    argv: Sequence[str] | None,
    *,
    command: str,
    description: str | None,
    page: Path,
    render: Callable[[Path], str],
) -> int:
    """Write ``page`` (under ``--root``) from ``render``, or compare it; exit status.

    ``--check`` writes nothing and returns 1 when the committed page differs
    from what ``render`` gives now (tests/test_docs.py runs it).
    """
    parser = argparse.ArgumentParser(prog=command, description=description)
    parser.add_argument(
        "--root", type=Path, default=PROJECT_ROOT, help="the project's folder"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if the committed page is out of date",
    )
    args = parser.parse_args(argv)
    text = render(args.root)
    target = args.root / page
    if args.check:
        current = target.read_text(encoding="utf-8") if target.exists() else ""
        if current != text:
            print(f"{page} is out of date: run `{command}`", file=sys.stderr)
            return 1
        return 0
    target.write_text(text, encoding="utf-8")
    print(f"wrote {target}")
    return 0
