"""Layer rule: codec imports only the standard library, numpy, msgpack and zstandard; never torch, zmq or Fedge."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.importscan import PACKAGES, layers_imported

ROOT = Path(__file__).resolve().parents[1]
ALLOWED_THIRD_PARTY = {"numpy", "msgpack", "zstandard"}


def test_importing_codec_loads_neither_torch_nor_zmq(tmp_path: Path) -> None:
    code = ("import json, sys, fedge.codec, fedge.codec.cli; "
            "print(json.dumps(sorted({'.'.join(m.split('.')[:2]) for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert "fedge.codec" in loaded
    unwanted = {"torch", "zmq"} | {f"fedge.{name}" for name in PACKAGES - {"codec"}}
    assert not loaded & unwanted, sorted(loaded & unwanted)


def test_codec_sources_import_only_allowed_modules() -> None:
    allowed = set(sys.stdlib_module_names) | ALLOWED_THIRD_PARTY | {"codec", "__future__"}
    for path in sorted((ROOT / "codec").glob("*.py")):
        for imp in layers_imported(path):
            assert imp.layer in allowed, f"{path.name}:{imp.line} imports {imp.module}"
