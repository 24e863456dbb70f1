"""meter/ stays a leaf: no Fedge codec, transport, algorithm or coordinator imports, no pyzmq; torch only where FLOPs
are counted; matplotlib only inside the report's functions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.importscan import layers_imported

METER = Path(__file__).resolve().parents[1] / "meter"
FORBIDDEN = ("codec", "algorithms", "coordinator", "edge_agent", "fldata", "models", "benchmarks", "zmq")
TORCH_ALLOWED = ("flops.py", "agent.py")
MODULES = sorted(METER.glob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_module_respects_the_layer_rules(path: Path) -> None:
    tree = ast.parse(path.read_text())
    docstring = ast.get_docstring(tree)
    assert docstring and "must not" in docstring.lower(), f"{path.name} lacks a docstring saying what it must not do"
    assert len(path.read_text().splitlines()) <= 300
    for imp in layers_imported(path):
        assert imp.layer not in FORBIDDEN, f"{path.name} imports {imp.module}"
        if imp.layer == "torch":
            assert path.name in TORCH_ALLOWED, f"{path.name} imports torch"
        if imp.layer == "matplotlib":
            assert path.name == "report.py" and imp.column > 0, f"{path.name} imports matplotlib at module level"
