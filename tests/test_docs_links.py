"""Every file README.md and docs/*.md point at is in the repository (issue #36: the README named
``../shared/...`` files a reader of the repository does not have).

Checked: markdown links (inline ``[text](target)`` and reference ``[id]: target``), resolved from
the page's folder, and repository paths written in the text or in inline code (``rl_engine/...``,
``docs/...``, ``evidence/...``), resolved from the repository root as the pages write them. A path
must exist and must not leave the repository: ``../`` out of it, or an absolute path such as
``/work/...``. Code blocks are skipped (their paths are commands' outputs such as ``gate-out/``),
so are external links, anchors, and placeholders (``rl_engine/ops/<op>/``, ``chain-*``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
REPO_ROOTS = ("rl_engine", "docs", "tests", "tools", "evidence", "README.md", "pyproject.toml", "constraints.txt")
"""Top-level names of the repository: a path in the text that starts with one is a repository path."""
SYSTEM_DIRS = ("/dev/", "/proc/", "/sys/", "/usr/", "/tmp/", "/etc/", "/opt/")
"""Absolute paths that name the machine, not a file the repository should hold."""

_FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.S | re.M)
_INLINE_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.M)
_CODE = re.compile(r"`([^`\n]+)`")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_REPO_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(re.escape(r) for r in REPO_ROOTS) + r")(?:/[\w.@+-]*)*)")
_UP_PATH = re.compile(r"(?<![\w./-])(\.\./[^\s`'\")\],;]*)")
_ABS_PATH = re.compile(r"^/[A-Za-z][\w.-]*/")
_PLACEHOLDER = re.compile(r"[<>*{}$]")


def _inside(path: Path, repo: Path) -> bool:
    try:
        path.resolve().relative_to(repo.resolve())
    except ValueError:
        return False
    return True


def broken_references(text: str, page_dir: Path, repo: Path) -> list[str]:
    """What in ``text`` (a markdown page in ``page_dir``) points outside ``repo`` or at a file it
    does not hold: one line per problem, naming the reference."""
    problems: list[str] = []
    text = _FENCE.sub("", text)
    targets = [m for rx in (_INLINE_LINK, _REF_LINK) for m in rx.finditer(text)]
    prose = text
    for m in sorted(targets, key=lambda m: m.start(1), reverse=True):  # link targets resolve from the page
        prose = prose[:m.start(1)] + prose[m.end(1):]
    for m in targets:
        target = m.group(1)
        if _SCHEME.match(target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0].split("?", 1)[0]
        if not path or _PLACEHOLDER.search(path):
            continue
        where = page_dir / path
        if path.startswith("/") or not _inside(where, repo):
            problems.append(f"link {target}: points outside the repository")
        elif not where.exists():
            problems.append(f"link {target}: no such file in the repository")
    for m in _CODE.finditer(prose):
        for token in m.group(1).split():
            token = token.strip("\"'(),;")
            if _ABS_PATH.match(token) and not token.startswith(SYSTEM_DIRS):
                problems.append(f"path {token}: an absolute path outside the repository")
    for m in _UP_PATH.finditer(prose):
        problems.append(f"path {m.group(1)}: points outside the repository (..)")
    for m in _REPO_PATH.finditer(prose):
        path = m.group(1).rstrip(".")
        if _PLACEHOLDER.search(prose[m.end():m.end() + 1]):
            continue  # rl_engine/ops/<op>/, evidence/.../chain-*: a pattern, not one file
        if not (repo / path).exists():
            problems.append(f"path {path}: no such file in the repository")
    return list(dict.fromkeys(problems))


def test_the_checker_flags_what_leaves_the_repository_or_is_missing(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("x")
    (tmp_path / "rl_engine").mkdir()
    (tmp_path / "rl_engine" / "real.py").write_text("x")
    bad = ("The standard lives in [the design](../shared/x.md) and `../shared/standard/`; see also "
           "`/work/shared/DESIGN.md`, [a page](docs/missing.md), `rl_engine/gone.py` and [ref].\n\n"
           "[ref]: ../outside.md\n")
    found = broken_references(bad, tmp_path, tmp_path)
    assert found == ["link ../shared/x.md: points outside the repository",
                     "link docs/missing.md: no such file in the repository",
                     "link ../outside.md: points outside the repository",
                     "path /work/shared/DESIGN.md: an absolute path outside the repository",
                     "path ../shared/standard/: points outside the repository (..)",
                     "path rl_engine/gone.py: no such file in the repository"], found
    good = ("[a page](docs/here.md#top), `rl_engine/real.py`, rl_engine/real.py. `rl_engine/ops/<op>/`, "
            "[site](https://example.org/a/../b), [anchor](#status), `/dev/shm`,\n"
            "```bash\nrl-engine gate --out ../elsewhere/gate-out\n```\n")
    assert broken_references(good, tmp_path, tmp_path) == []
    # a link from docs/ back up to a file of the repository stays inside it
    assert broken_references("[back](../rl_engine/real.py)", tmp_path / "docs", tmp_path) == []


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(REPO).as_posix() for p in PAGES])
def test_every_reference_in_the_docs_is_inside_the_repository(page):
    problems = broken_references(page.read_text(encoding="utf-8"), page.parent, REPO)
    assert not problems, f"{page.relative_to(REPO)}:\n" + "\n".join(problems)
