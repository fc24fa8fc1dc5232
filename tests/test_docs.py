"""The documentation: a strict MkDocs build, and links that resolve.

MkDocs' strict build checks the links and anchors between the pages of docs/
with its own heading ids; the checker below reads README.md and every page the
way GitHub renders them (relative paths from the file, GitHub's heading slugs),
so a link works both on the site and on the repository.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?:.|\n)*?\1")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading (lower case, punctuation dropped)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # link -> its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, duplicates numbered as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text())):
        slug = github_slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(path: Path) -> list[str]:
    """The relative links of ``path`` whose file or heading anchor does not exist."""
    text = _CODE_SPAN.sub("", _FENCE.sub("", path.read_text()))
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{path.name}: {target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{path.name}: {target} (no such heading)")
    return broken


def documents() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def nav_pages() -> list[str]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    return [page for entry in config["nav"] for page in entry.values()]


def test_github_slugs_match_githubs():
    # Golden values: anchors GitHub generated for headings of this project.
    assert github_slug("Across runs: the privacy ledger") == (
        "across-runs-the-privacy-ledger"
    )
    assert github_slug("`tpsl-flwr audit`") == "tpsl-flwr-audit"
    assert github_slug("Noise-aware training (denoise = posterior)") == (
        "noise-aware-training-denoise--posterior"
    )
    assert github_slug("Sweeps: the paper's tables and Figure 5 on your data") == (
        "sweeps-the-papers-tables-and-figure-5-on-your-data"
    )


def test_the_link_checker_finds_a_missing_file_and_a_missing_heading(tmp_path):
    # Prepare: one page with a good link, a bad file and a bad anchor.
    (tmp_path / "other.md").write_text("# Other\n\n## A section: here\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#a-section-here) [self](#page)\n"
        "[gone](missing.md) [bad\nanchor](other.md#nope)\n"
        "```\n[in code](nowhere.md)\n```\n`[span](nowhere.md)`\n"
    )

    # Execute
    broken = broken_links(page)

    # Assert
    assert broken == [
        "page.md: missing.md (no such file)",
        "page.md: other.md#nope (no such heading)",
    ]


@pytest.mark.parametrize("path", documents(), ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(path):
    assert broken_links(path) == []


def test_mkdocs_builds_strict(tmp_path):
    # strict (mkdocs.yml) turns every broken link, anchor or page left out of
    # the nav into a failed build.
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert (site / "reference" / "index.html").exists()


def test_every_page_is_in_the_nav_and_linked_from_the_readme():
    pages = {p.name for p in DOCS.glob("*.md")}
    assert pages == set(nav_pages())
    readme = README.read_text()
    missing = [p for p in pages - {"index.md"} if f"](docs/{p}" not in readme]
    assert missing == []


def test_the_readme_is_a_front_page_that_starts_with_the_two_commands():
    readme = README.read_text()
    first_block = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    assert first_block.splitlines() == [
        'pip install torch==2.13.0 -e ".[dev]" && tpsl-flwr flower-run .',
        'pip install torch==2.13.0 -e ".[dev]" && python -m pytest -q',
    ]
    # CI's test command is the README's second command.
    assert "\npython -m pytest -q\n" in (ROOT / ".ci" / "run").read_text()
    assert len(readme.splitlines()) <= 300


def _mechanisms_table(path: Path) -> list[str]:
    """The first table after the "## Mechanisms" heading, line by line."""
    lines = path.read_text().split("\n## Mechanisms\n", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return lines[start:end]


def test_the_readme_mechanisms_table_is_the_docs_one():
    table = _mechanisms_table(README)
    assert table[0].startswith("| `--mechanism` |") and len(table) == 9
    assert table == _mechanisms_table(DOCS / "mechanisms.md")


def test_the_committed_layout_page_is_generated_from_the_tree():
    from tools.layout_page import COMMAND, LAYOUT, PROJECT_ROOT, render

    committed = (PROJECT_ROOT / LAYOUT).read_text(encoding="utf-8")
    assert committed == render(), f"{LAYOUT} is out of date: run `{COMMAND}`"
