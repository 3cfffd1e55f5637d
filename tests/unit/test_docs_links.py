"""Every relative link in README.md, CHANGELOG.md and docs/*.md names a file that exists, and an anchor a heading there.

The README was split into pages under docs/; a link to a section that moved
(or a heading renamed) would otherwise fail only in a reader's browser.
Anchors are GitHub's: the heading lowercased, punctuation but ``-`` and ``_``
dropped, spaces made ``-``.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``path`` (outside code blocks)."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    found = set()
    for heading in re.findall(r"^#+ (.*)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert page.is_file()
    for target in links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        assert dest.exists(), f"{page.name}: {target}: no such file"
        if anchor:
            assert anchor in anchors(dest), f"{page.name}: {target}: no such heading in {dest.name}"


def test_anchors_follow_githubs_rule(tmp_path):
    page = tmp_path / "x.md"
    page.write_text("# Quiet cores (benchmark jobs)\n```\n# not a heading\n```\n## `dispatch wait`\n")
    assert anchors(page) == {"quiet-cores-benchmark-jobs", "dispatch-wait"}
