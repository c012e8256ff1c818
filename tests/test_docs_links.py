"""The links of README.md and docs/*.md lead somewhere: every relative link names a file that exists,
and every #anchor a heading of its page (GitHub's rule: lower case, punctuation dropped, spaces to
hyphens, a repeated heading numbered -1, -2, ...)."""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from helpers import REPO

LINK = re.compile(r"\]\(([^()\s]*)\)")


@cache
def heading_anchors(page: Path) -> set[str]:
    """The anchors of ``page``'s headings, read once a page however many links name it."""
    anchors, seen = set(), {}
    for line in outside_code(page.read_text()):
        match = re.match(r"#{1,6} (.*)", line)
        if match:
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def outside_code(text: str):
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield line


def broken_links(page: Path) -> list[str]:
    """'TARGET (why)' for each link of ``page`` that leads nowhere; web links are not followed."""
    broken = []
    for line in outside_code(page.read_text()):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file):
                broken.append(f"{target} (no such heading)")
    return broken


def test_every_link_of_the_pages_leads_somewhere():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = {str(page.relative_to(REPO)): links for page in pages if (links := broken_links(page))}
    assert broken == {}


def test_the_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Stage 3 at 2,040 steps (issue 64)\n\n## Notes\n## Notes\n")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#stage-3-at-2040-steps-issue-64) [b](other.md#notes-1) [c](https://x.org/y)\n"
                    "[d](gone.md) [e](other.md#stage-3) [f](#here)\n```\n[g](inside-code.md)\n```\n## Here\n")
    assert broken_links(page) == ["gone.md (no such file)", "other.md#stage-3 (no such heading)"]
