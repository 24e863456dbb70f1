"""One coordinator per run directory and one agent per state directory: the second is refused naming the first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedge.plumbing import DirectoryLocked, hold_directory

ROOT = Path(__file__).resolve().parents[1]
HOLD = ("import sys, time; from fedge.plumbing import hold_directory; "
        "h = hold_directory(sys.argv[1], 'agent'); print('held', flush=True); time.sleep(60)")


def holder(directory: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


def test_a_held_directory_is_refused_naming_the_holder_and_free_again_after(tmp_path: Path) -> None:
    process = holder(tmp_path / "state")
    try:
        with pytest.raises(DirectoryLocked, match=rf"in use by another agent \(pid {process.pid}\)"):
            hold_directory(tmp_path / "state", "agent")
    finally:
        process.kill()
        process.wait(10)
    hold_directory(tmp_path / "state", "agent").close()  # the lock died with its process


def test_a_second_coordinator_and_a_second_agent_are_refused_in_one_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    process = holder(run_dir)
    try:
        out = subprocess.run([sys.executable, "-m", "fedge.coordinator.cli", "start", "--run-dir", str(run_dir),
                              "--rounds", "1", "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert f"in use by another coordinator (pid {process.pid})" in out.stderr
        assert not (run_dir / "config.toml").exists()
        agent = subprocess.run([sys.executable, "-m", "fedge.edge_agent", "run", "--coordinator", "tcp://127.0.0.1:9",
                                "--client-id", "pi", "--data", "tests.plugin_models:device_windows",
                                "--state-dir", str(run_dir)], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert agent.returncode == 2 and f"in use by another agent (pid {process.pid})" in agent.stderr, agent.stderr
    finally:
        process.kill()
        process.wait(10)
