"""Every Fedge process runs numpy's BLAS on one thread (``plumbing.threads``): idle OpenBLAS threads spin. Checked
in fresh interpreters, since the limit is process-wide; ``FEDGE_BLAS_THREADS`` sets another count, 0 leaves the
library's own, and a bad value is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CODE = """
import json
from threadpoolctl import threadpool_info
from fedge.plumbing.threads import one_blas_thread
before = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
set_to = one_blas_thread()
after = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
print(json.dumps({"before": before, "set": set_to, "after": after}))
"""


def run(value: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FEDGE_BLAS_THREADS", "OPENBLAS_NUM_THREADS",
                                                            "OMP_NUM_THREADS")}
    if value is not None:
        env["FEDGE_BLAS_THREADS"] = value
    return subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60, env=env)


def test_one_thread_by_default_another_count_when_asked_and_the_librarys_own_with_0() -> None:
    default = json.loads(run(None).stdout)
    if not default["before"]:
        pytest.fail("numpy reports no BLAS library to limit")
    assert default["set"] == 1 and default["after"] == [1] * len(default["after"])
    assert json.loads(run("2").stdout)["after"] == [2] * len(default["after"])
    untouched = json.loads(run("0").stdout)
    assert untouched["set"] == 0 and untouched["after"] == untouched["before"]


def test_a_bad_count_is_one_line() -> None:
    result = run("lots")
    assert result.returncode != 0 and "FEDGE_BLAS_THREADS='lots': expected a whole number" in result.stderr


def test_coordinator_start_refuses_a_bad_count_in_one_line_before_making_its_run_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from fedge.runtime.cli import main

    monkeypatch.setenv("FEDGE_BLAS_THREADS", "lots")
    assert main(["start", "--rounds", "1", "--run-dir", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "coordinator: error: FEDGE_BLAS_THREADS='lots': expected a whole number (0: the library's own)"]
    assert not (tmp_path / "run").exists()
