"""meter/ stays a leaf: no Fedge codec, transport, algorithm or coordinator imports, no pyzmq; torch only where FLOPs
are counted; matplotlib only inside the report's functions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

METER = Path(__file__).resolve().parents[1] / "meter"
FORBIDDEN = ("codec", "algorithms", "coordinator", "edge_agent", "fldata", "models", "benchmarks", "zmq")
TORCH_ALLOWED = ("flops.py", "agent.py")
MODULES = sorted(METER.glob("*.py"))


def imports(tree: ast.AST) -> list[tuple[str, int]]:
    """(module, column offset) of every import; offset 0 means a module-level import."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.col_offset) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.col_offset))
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_module_respects_the_layer_rules(path: Path) -> None:
    tree = ast.parse(path.read_text())
    docstring = ast.get_docstring(tree)
    assert docstring and "must not" in docstring.lower(), f"{path.name} lacks a docstring saying what it must not do"
    assert len(path.read_text().splitlines()) <= 300
    for module, column in imports(tree):
        top = module.split(".")[0]
        assert top not in FORBIDDEN, f"{path.name} imports {module}"
        if top == "torch":
            assert path.name in TORCH_ALLOWED, f"{path.name} imports torch"
        if top == "matplotlib":
            assert path.name == "report.py" and column > 0, f"{path.name} imports matplotlib at module level"
