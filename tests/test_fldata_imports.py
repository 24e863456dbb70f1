"""fldata stays torch-free: it imports only the standard library, numpy, scipy (lazily) and itself."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import fldata

PACKAGE = Path(fldata.__file__).parent
ALLOWED_ROOTS = {"numpy", "scipy", "fldata"}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_only_stdlib_numpy_scipy_and_itself() -> None:
    for path in sorted(PACKAGE.glob("*.py")):
        outside = {r for r in imported_roots(path) if r not in sys.stdlib_module_names} - ALLOWED_ROOTS
        assert not outside, f"{path.name} imports {outside}"


def test_a_fresh_interpreter_loads_no_torch_or_zmq() -> None:
    code = (
        "import sys, fldata, fldata.cli, fldata.build_demo\n"
        "ds = fldata.load_dataset('fmnist-demo')\n"
        "fldata.partition(ds, 'feature-shift', 3, seed=0)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in {'torch', 'zmq', 'scipy', 'codec', 'models',"
        " 'algorithms', 'coordinator', 'edge_agent', 'meter', 'msgpack', 'zstandard'}]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
