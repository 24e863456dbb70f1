"""docs/api.md's examples, executed in order as one script (a fresh directory, the worked example importable)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "api.md"


def test_the_api_examples_run(tmp_path: Path) -> None:
    pytest.importorskip("sklearn", reason="the examples extra (scikit-learn) is part of the dev install")
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 4
    script = tmp_path / "api_examples.py"
    script.write_text("\n".join(blocks))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "examples" / "tabular"), str(ROOT)]),
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "(30,) 2 acme_tabular.model:tabular_net"
    assert lines[1].startswith("done ")
    assert "which another process cannot import" in lines[2]
    assert lines[-1] == "done 2", lines
