"""The layer rules of STYLE.md, checked on the source: who may import what."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FEDGE = {"codec", "models", "algorithms", "fldata", "meter", "coordinator", "edge_agent"}

FORBIDDEN: dict[str, set[str]] = {
    "codec": (FEDGE - {"codec"}) | {"torch", "zmq"},
    "fldata": (FEDGE - {"fldata"}) | {"torch", "zmq"},
    "models": {"codec", "algorithms", "coordinator", "edge_agent", "meter", "zmq"},
    "algorithms": {"zmq", "coordinator", "edge_agent"},
    "meter": {"codec", "algorithms", "coordinator", "edge_agent"},
    "coordinator/transport.py": {"torch", "codec", "algorithms", "models", "fldata", "meter"},
    "edge_agent/transport.py": {"torch", "codec", "algorithms", "models", "fldata", "meter"},
    "edge_agent": {"coordinator"},
}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("place", sorted(FORBIDDEN))
def test_layer_does_not_import_what_it_must_not_know(place: str) -> None:
    target = ROOT / place
    files = [target] if target.is_file() else sorted(target.rglob("*.py"))
    assert files, place
    for path in files:
        bad = imported_roots(path) & FORBIDDEN[place]
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


@pytest.mark.parametrize(("package", "absent"), [("codec", ("torch", "zmq")), ("fldata", ("torch", "zmq"))])
def test_importing_a_light_package_loads_no_heavy_one(package: str, absent: tuple[str, ...]) -> None:
    code = f"import sys, {package}; print(','.join(m for m in {absent!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "", out.stdout + out.stderr
