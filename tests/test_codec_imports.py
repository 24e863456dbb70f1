"""Layer rule: codec imports only the standard library, numpy, msgpack and zstandard; never torch, zmq or Fedge."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED_THIRD_PARTY = {"numpy", "msgpack", "zstandard"}
FEDGE_PACKAGES = {"edge_agent", "coordinator", "models", "fldata", "algorithms", "meter"}


def test_importing_codec_loads_neither_torch_nor_zmq() -> None:
    code = ("import json, sys, codec, codec.cli; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert not loaded & ({"torch", "zmq"} | FEDGE_PACKAGES), sorted(loaded & ({"torch", "zmq"} | FEDGE_PACKAGES))


def test_codec_sources_import_only_allowed_modules() -> None:
    stdlib = set(sys.stdlib_module_names)
    for path in sorted((ROOT / "codec").glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots = [node.module.split(".")[0]]
            else:
                continue
            for root in roots:
                assert root in stdlib | ALLOWED_THIRD_PARTY | {"codec", "__future__"}, f"{path.name} imports {root}"
