"""What the repository's own text names exists: the licence pyproject.toml declares ships as a file, the contract
section of docs/algorithms.md names every hook of the algorithm contract, and every "docs/algorithms.md section 4.3"
the code and docs cite is a heading of that page."""

from __future__ import annotations

import re
from pathlib import Path

from tests.importscan import repository_files

ROOT = Path(__file__).resolve().parents[1]


def test_the_declared_licence_ships_as_a_file() -> None:
    declared = (ROOT / "pyproject.toml").read_text()
    assert 'license = { text = "Apache-2.0" }' in declared
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_the_contract_section_names_every_hook_of_the_algorithm_contract() -> None:
    from fedge.algorithms.contract import BATCH_HOOKS, ClientHalf, ServerHalf

    page = (ROOT / "docs" / "algorithms.md").read_text()
    section = page[page.index("### The algorithm contract"):]
    section = section[:section.index("\n### ", 10)]
    for protocol in (ServerHalf, ClientHalf):
        hooks = [name for name in vars(protocol) if not name.startswith("_")]
        assert len(hooks) >= 10
        missing = [name for name in hooks if f"`{name}" not in section]
        assert not missing, f"docs/algorithms.md's contract does not name {missing} of {protocol.__name__}"
    assert all(f"`{hook}(" in section for hook in BATCH_HOOKS)


def test_every_section_the_code_cites_exists_in_the_repository() -> None:
    """References such as "docs/algorithms.md section 4.3" or "docs/meter.md sections 2.2 and 2.4" name headings
    of pages in this repository (a clone has no spec elsewhere)."""
    pages = {name: (ROOT / "docs" / name).read_text() for name in ("algorithms.md", "meter.md")}
    headings = {name: set(re.findall(r"^#{2,4} (\d+(?:\.\d+)*)[. ]", text, re.M)) for name, text in pages.items()}
    cited: list[tuple[str, str, str]] = []
    for path in [*repository_files(ROOT), *sorted(ROOT.glob("docs/*.md")), ROOT / "README.md"]:
        text = path.read_text(encoding="utf-8")
        for page, rest in re.findall(r"docs/(algorithms\.md|meter\.md),? (?:sections? |§)?(\d[\d.]*(?:(?:, | and |-)\d[\d.]*)*)",
                                     text):
            for number in re.findall(r"\d+(?:\.\d+)*", rest):
                cited.append((str(path.relative_to(ROOT)), page, number))
    assert len(cited) >= 30
    missing = [c for c in cited if c[2] not in headings[c[1]]]
    assert not missing, f"cited sections that do not exist: {missing[:10]}"
    assert "ALGORITHMS.md" not in (ROOT / "README.md").read_text() and "../shared" not in (ROOT / "README.md").read_text()
