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


def test_a_second_coordinator_and_a_second_agent_are_refused_in_one_line(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The coordinator's ``main`` runs in this process (it is refused before it sets up logging or writes
    anything); the agent, which sets up logging first, in a process of its own."""
    from fedge.runtime.cli import main as coordinator

    run_dir = tmp_path / "run"
    process = holder(run_dir)
    try:
        code = coordinator(["start", "--run-dir", str(run_dir), "--rounds", "1", "--quiet"])
        said = capsys.readouterr().err
        assert code == 2 and said.count("\n") == 1, said
        assert f"in use by another coordinator (pid {process.pid})" in said
        assert not (run_dir / "config.toml").exists()
        agent = subprocess.run([sys.executable, "-m", "fedge.edge_agent", "run", "--coordinator", "tcp://127.0.0.1:9",
                                "--client-id", "pi", "--data", "tests.plugin_models:device_windows",
                                "--state-dir", str(run_dir)], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert agent.returncode == 2 and f"in use by another agent (pid {process.pid})" in agent.stderr, agent.stderr
    finally:
        process.kill()
        process.wait(10)


def test_a_long_lived_agent_keeps_the_state_of_its_last_sessions(tmp_path: Path) -> None:
    import numpy as np

    from fedge.client.state import DeviceState

    state = DeviceState(tmp_path / "dev", keep_sessions=2)

    def commit(run: str, round_number: int, value: float) -> None:
        state.write_pending(run, round_number, {"c": np.full(3, value, np.float32)})
        assert state.confirm(run, round_number)

    commit("run-a", 1, 1.0)
    commit("run-a", 2, 2.0)
    commit("run-b", 1, 10.0)  # another session: run-a's state is kept aside, renamed
    assert state.sessions() == ["run-b", "run-a"] and (tmp_path / "dev" / "sessions" / "run-a.npz").exists()
    assert state.committed("run-a")["c"][0] == 2.0 and state.committed("run-b")["c"][0] == 10.0
    commit("run-a", 3, 3.0)  # run-a resumes: it is current again, run-b is kept
    assert state.sessions() == ["run-a", "run-b"] and not (tmp_path / "dev" / "sessions" / "run-a.npz").exists()
    commit("run-c", 1, 100.0)  # a third session: only two are kept
    assert state.sessions() == ["run-c", "run-a"] and state.committed("run-b") == {}
    single = DeviceState(tmp_path / "one", keep_sessions=1)
    single.write_pending("x", 1, {"c": np.zeros(1, np.float32)})
    single.confirm("x", 1)
    single.write_pending("y", 1, {"c": np.ones(1, np.float32)})
    single.confirm("y", 1)
    assert single.sessions() == ["y"] and single.committed("x") == {}
    with pytest.raises(ValueError, match="keep_sessions"):
        DeviceState(tmp_path / "bad", keep_sessions=0)
    assert DeviceState(tmp_path / "dev").archived_path("../../etc").name != "../../etc.npz"
