"""The README's Results block is what the result files under docs/results/ render (``fedge.sweep.results``), and
it changes when a result file does."""

from __future__ import annotations

import shutil
from pathlib import Path

from fedge.sweep.results import BEGIN, END, render, replaced

ROOT = Path(__file__).resolve().parents[1]


def block(readme: str) -> str:
    return readme[readme.index(BEGIN):readme.index(END) + len(END)]


def test_the_readme_results_block_is_what_the_result_files_render() -> None:
    assert block((ROOT / "README.md").read_text()) == render(), \
        "README's Results block is stale: run `python -m fedge.sweep.results`"


def test_a_changed_result_file_changes_the_block(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(ROOT / "docs" / "results", results)
    before = render(results)
    csv = results / "small-budget.csv"
    csv.write_text(csv.read_text().replace("0.8745,", "0.8845,", 1))
    after = render(results)
    assert after != before and "88.45 ± 1.05" in after
    assert replaced(f"a\n{before}\nb\n", after) == f"a\n{after}\nb\n"
