"""fldata stays torch-free: it imports only the standard library, numpy, scipy (lazily) and itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fedge import fldata
from tests.importscan import layers_imported

PACKAGE = Path(fldata.__file__).parent
ALLOWED_ROOTS = {"numpy", "scipy", "fldata"}


def test_only_stdlib_numpy_scipy_and_itself() -> None:
    for path in sorted(PACKAGE.glob("*.py")):
        layers = {imp.layer for imp in layers_imported(path)}
        outside = {layer for layer in layers if layer not in sys.stdlib_module_names} - ALLOWED_ROOTS
        assert not outside, f"{path.name} imports {outside}"


def test_a_fresh_interpreter_loads_no_torch_or_zmq(tmp_path: Path) -> None:
    code = (
        "import sys, fedge.fldata, fedge.fldata.cli, fedge.fldata.build_demo\n"
        "ds = fedge.fldata.load_dataset('fmnist-demo')\n"
        "fedge.fldata.partition(ds, 'feature-shift', 3, seed=0)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in {'torch', 'zmq', 'scipy', 'msgpack', 'zstandard'}"
        " or '.'.join(m.split('.')[:2]) in {'fedge.codec', 'fedge.models', 'fedge.algorithms',"
        " 'fedge.coordinator', 'fedge.edge_agent', 'fedge.meter'}]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=tmp_path)
