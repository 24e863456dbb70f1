"""Every repository path the docs name exists: a `code span` that is a path of this repository (a folder with a
slash, or a file of a known kind), and every relative markdown link, in the README and docs/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").rglob("*.md")),
        *sorted((ROOT / "deploy").rglob("*.md"))]
TOP = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")} | {"README.md"}
KINDS = (".py", ".md", ".toml", ".sh", ".txt", ".csv", ".png", ".yml", ".yaml", ".j2", ".service", ".timer",
         ".json", ".npz", ".cfg")
SPAN = re.compile(r"`([^`\s]+)`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def named_paths(text: str) -> list[str]:
    """The repository paths a document names in code spans: relative, under a top-level folder of the repository,
    without placeholders (capitals, globs, braces) or a part after a colon."""
    found = []
    for span in SPAN.findall(text):
        path = span.split(":")[0].rstrip(".,;")
        first = path.split("/")[0]
        if "/" not in path or first not in TOP or re.search(r"[A-Z*{}<>$]", path.split("/", 1)[1]):
            continue
        if path.endswith("/") or path.endswith(KINDS):
            found.append(path)
    return found


def missing(doc: Path) -> list[str]:
    text = doc.read_text(encoding="utf-8")
    gone = [p for p in named_paths(text) if not (ROOT / p).exists()]
    for link in LINK.findall(text):
        if "://" in link or link.startswith("mailto:"):
            continue
        if not (doc.parent / link).exists():
            gone.append(link)
    return gone


def test_every_path_the_docs_name_exists() -> None:
    problems = {str(doc.relative_to(ROOT)): missing(doc) for doc in DOCS}
    assert {doc: paths for doc, paths in problems.items() if paths} == {}


def test_the_check_sees_a_path_that_does_not_exist(tmp_path: Path) -> None:
    assert named_paths("see `protocol/agent.py`, `runs/RUN/`, `coordinator/nope.py:12` and `x.py`") == \
        ["protocol/agent.py", "coordinator/nope.py"]
    doc = tmp_path / "a.md"
    doc.write_text("[b](b.md) and `codec/messages.py` and `codec/gone.py`\n")
    assert missing(doc) == ["codec/gone.py", "b.md"]
