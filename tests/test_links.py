"""Every link in the repository's Markdown resolves inside the repository.

A clone is all a user has: a link to a sibling folder of the checkout (such as a shared
design folder) or to a file that moved is broken for them.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

REPOSITORY = Path(__file__).resolve().parents[1]
# [text](target) and [text]: target; the target up to whitespace or the closing paren.
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?[^)]*\)|^\s*\[[^\]]+\]:\s*(\S+)", re.MULTILINE)
EXTERNAL = ("http://", "https://", "mailto:")


def markdown_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=REPOSITORY,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [REPOSITORY / name for name in listed.split("\0") if name]


def broken_links(document: Path) -> list[str]:
    broken = []
    for match in LINK.finditer(document.read_text(encoding="utf-8")):
        target = match.group(1) or match.group(2)
        if target.startswith(EXTERNAL) or target.startswith("#"):
            continue
        path = unquote(target.split("#", 1)[0])
        resolved = (document.parent / path).resolve()
        if not resolved.is_relative_to(REPOSITORY):
            broken.append(f"{target} (outside the repository)")
        elif not resolved.exists():
            broken.append(f"{target} (no such file)")
    return broken


def test_the_markdown_files_are_found() -> None:
    names = {p.relative_to(REPOSITORY).as_posix() for p in markdown_files()}
    assert {"README.md", "docs/design.md", "docs/architecture.md"} <= names


def test_every_markdown_link_stays_inside_the_repository() -> None:
    problems = {
        str(doc.relative_to(REPOSITORY)): found
        for doc in markdown_files()
        if (found := broken_links(doc))
    }
    assert problems == {}
