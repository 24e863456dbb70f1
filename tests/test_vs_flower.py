"""benchmarks/vs_flower.py without Flower installed: one line saying what to install, exit 2, nothing started.
(The comparison itself needs flwr, an optional extra that CI does not install; its figures are in docs/scale.md.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "vs_flower.py"


def test_without_flower_it_says_what_to_install_in_one_line() -> None:
    probe = subprocess.run([sys.executable, "-c", "import flwr"], capture_output=True)
    pythons = ["/nonexistent/python"] + ([sys.executable] if probe.returncode else [])  # environments without flwr
    for python in pythons:
        result = subprocess.run([sys.executable, str(SCRIPT), "--nodes", "2", "--rounds", "2", "--flower-python",
                                 python], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.count("\n") == 1 and "pip install 'fedge[flower]'" in result.stderr, result.stderr


def test_bad_arguments_are_refused_by_the_parser() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "1"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "--rounds >= 2" in result.stderr
