"""The docs hold together: every relative link in README.md, docs/*.md and the repository's other
pages names a file of the repository, and a link's #anchor a heading of the page it names
(GitHub's anchors: the heading in lower case, punctuation dropped, spaces as hyphens, "-1", "-2"
for repeats)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def other_pages():
    """The repository's other pages (client/python, tests/ze_driver, ...): those git tracks or
    would add (untracked, not ignored), so that a page in an ignored folder (a build, a
    scratch copy) is not read; without git, every page outside build* and dot folders."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard", "--", "*.md"],
                             capture_output=True, text=True, timeout=30)
        names = out.stdout.split("\0") if out.returncode == 0 else None
    except OSError:
        names = None
    if names is None:
        found = [p for p in REPO.glob("*/**/*.md")
                 if not p.relative_to(REPO).parts[0].startswith(("build", "."))]
    else:
        found = [REPO / n for n in names if n and "/" in n and (REPO / n).exists()]
    return sorted(p for p in found if p.parent != REPO / "docs")


PAGES = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md")) + other_pages()

FENCE = re.compile(r"^(```|~~~)")
CODE_SPAN = re.compile(r"(`+).*?\1")
# [text](target) and [text](target "title"); images too. Not reference-style links: none used.
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def prose_lines(text):
    """(line number, line) of text outside fenced code blocks, with code spans blanked out."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            yield n, CODE_SPAN.sub("", line)


def slug(heading):
    """GitHub's anchor for a heading's text."""
    s = heading.strip().lower()
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)  # a link in a heading anchors by its text
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def raw_headings(path):
    """Headings with their code spans kept (backticks dropped, as GitHub anchors them)."""
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            yield m.group(1)


def page_anchors(path):
    seen = {}
    out = set()
    for h in raw_headings(path):
        s = slug(h)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else "%s-%d" % (s, n))
    return out


def links(path):
    for n, line in prose_lines(path.read_text()):
        for m in LINK.finditer(line):
            yield n, m.group(1)


def broken_links(path):
    """'page:line: target (why)' for each relative link of path that goes nowhere."""
    bad = []
    for n, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.I):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = "%s:%d: %s" % (path.relative_to(REPO), n, target)
        if not dest.exists():
            bad.append(where + " (no such file)")
        elif REPO not in dest.parents and dest != REPO:
            bad.append(where + " (outside the repository)")
        elif anchor and dest.suffix == ".md" and anchor not in page_anchors(dest):
            bad.append(where + " (no heading with that anchor in %s)" % dest.relative_to(REPO))
    return bad


def test_slug_follows_github():
    assert slug("Benchmark 1: training step") == "benchmark-1-training-step"
    assert slug("Host-staged training step in-process from C (`bench/train_cuda.py`)") == \
        "host-staged-training-step-in-process-from-c-benchtrain_cudapy"
    assert slug("Upgrading and restarting") == "upgrading-and-restarting"


def test_checker_finds_what_is_broken(tmp_path, monkeypatch):
    """The checker itself: a missing file, a missing anchor, and links in code are skipped."""
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "A.md").write_text("# A\n\n## Two words\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/A.md) [ok](docs/A.md#two-words) [ok](#top) [web](https://x.org)\n"
                    "# Top\n"
                    "[gone](docs/B.md) [bad anchor](docs/A.md#three-words)\n"
                    "`[in code](docs/C.md)`\n```\n[fenced](docs/D.md)\n```\n")
    bad = broken_links(page)
    assert bad == ["README.md:3: docs/B.md (no such file)",
                   "README.md:3: docs/A.md#three-words (no heading with that anchor in "
                   "docs/A.md)"], bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    bad = broken_links(page)
    assert not bad, "links that go nowhere (fix the target or the heading):\n" + "\n".join(bad)


def test_pages_in_ignored_folders_are_not_read():
    """A page under a folder git ignores (here __pycache__) is no page of the repository: a
    scratch copy or a fetched package there must not fail this file's checks."""
    scratch = Path(__file__).resolve().parent / "__pycache__"
    scratch.mkdir(exist_ok=True)
    page = scratch / "graphd-test-ignored-page.md"
    page.write_text("# not a page\n[gone](nowhere.md)\n")
    try:
        assert page not in other_pages()
    finally:
        page.unlink()
