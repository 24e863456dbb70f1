"""docs/architecture.md states what the code is: its state tables are the protocol's transition tables, and its
package table is the layer order tests/test_imports.py checks (``LAYERS``, tests/importscan.py)."""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path

from fedge.protocol.agent import AGENT_TRANSITIONS
from fedge.protocol.asynchronous import TASK_TRANSITIONS
from fedge.protocol.round import OUTCOME_TRANSITIONS, ROUND_TRANSITIONS
from tests.importscan import LAYERS

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def tables(text: str) -> list[list[list[str]]]:
    """Every markdown table of ``text``: its rows (header and rule excluded), as stripped cells."""
    found: list[list[list[str]]] = []
    rows: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            found.append([row for row in rows[2:]])
            rows = []
    return found


def as_rows(table: dict[tuple[Enum, str], Enum]) -> list[list[str]]:
    return [[state.value, event, target.value] for (state, event), target in table.items()]


def test_the_state_tables_are_the_protocols_transition_tables() -> None:
    found = [t for t in tables(DOC.read_text()) if t and len(t[0]) == 3 and not t[0][0].startswith("`")]
    assert found == [as_rows(AGENT_TRANSITIONS), as_rows(ROUND_TRANSITIONS), as_rows(OUTCOME_TRANSITIONS),
                     as_rows(TASK_TRANSITIONS)]


def test_the_package_table_is_the_layer_order() -> None:
    (packages,) = [t for t in tables(DOC.read_text()) if t and t[0][0] == "`fedge`"]
    assert [re.sub(r"^`fedge\.?|`$", "", row[0]) or "fedge" for row in packages] == list(LAYERS)


def test_the_table_reader_sees_a_changed_row() -> None:
    assert tables("| a | b |\n|---|---|\n| x | y |\n\ntext\n| c |\n|--|\n| z |\n") == [[["x", "y"]], [["z"]]]
