"""Every relative link in the Markdown files, and every `docs/...` path or link to a README section named anywhere in
the repo, resolves: the file exists and, where a `#section` is given, a heading of that file makes that anchor
(GitHub's rules)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from ccscope_testkit.prereqs import ROOT

MD_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
DOCS_PATH = re.compile(r"(?<![\w/.-])(?:docs/[\w./-]*\w|README\.md)(?:#[\w-]+)?")  # README.md: the top one
SKIP_SCHEMES = ("http://", "https://", "mailto:", "data:")


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / name for name in out.split("\0") if name]


def text_of(path: Path) -> str | None:
    try:
        return path.read_text()
    except (UnicodeDecodeError, OSError):
        return None


def github_anchor(heading: str) -> str:
    """GitHub's heading slug: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*|_(?=\w)|(?<=\w)_", "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", path.read_text(), re.M):
        slug = github_anchor(heading)
        count = seen.get(slug, 0)
        result.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return result


def problem(target: Path, anchor: str | None, source: Path) -> str | None:
    if not target.exists():
        return f"{source.relative_to(ROOT)}: {target.relative_to(ROOT) if target.is_relative_to(ROOT) else target} " \
               "does not exist"
    if anchor and target.suffix == ".md" and anchor not in anchors(target):
        return f"{source.relative_to(ROOT)}: {target.relative_to(ROOT)} has no section #{anchor}"
    return None


def test_markdown_links_resolve() -> None:
    problems = []
    for path in tracked_files():
        if path.suffix != ".md" or "node_modules" in path.parts:
            continue
        for link in MD_LINK.findall(path.read_text()):
            if link.startswith(SKIP_SCHEMES):
                continue
            file_part, _, anchor = link.partition("#")
            target = (path.parent / file_part).resolve() if file_part else path
            if found := problem(target, anchor or None, path):
                problems.append(f"{found} (link {link})")
    assert not problems, "\n".join(problems)


def test_docs_paths_named_anywhere_resolve() -> None:
    """Comments in configuration files point at documentation too (deploy/, scenarios/, dashboards/)."""
    problems = []
    for path in tracked_files():
        text = text_of(path)
        if text is None:
            continue
        for mention in DOCS_PATH.findall(text):
            file_part, _, anchor = mention.partition("#")
            if found := problem(ROOT / file_part, anchor or None, path):
                problems.append(found)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("heading, anchor", [
    ("Watch it live", "watch-it-live"), ("`ccscope check`", "ccscope-check"),
    ("Two commands (fresh Debian 12 / Ubuntu 22.04+, as root)", "two-commands-fresh-debian-12--ubuntu-2204-as-root"),
])
def test_anchor_rule(heading: str, anchor: str) -> None:
    assert github_anchor(heading) == anchor
