"""A local fleet whose agents exit: logged at once with their last lines, restarted with backoff, and the
coordinator exits 4 (with the tail) rather than waiting silently when none can be restarted."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import psutil
import pytest

from tests.e2e import FAST, Processes, finished, local_agent_pids, metrics, wait_for
from tests.inprocess_cli import coordinator_main

ROUNDS = 8


def test_a_killed_local_agent_is_restarted_and_the_session_completes(procs: Processes, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # enough rounds that the session is still running when the agent is killed after round 1 (a round of this
    # small model takes well under a second once agents send their updates as soon as they are ready; the round the
    # killed agent was selected for waits for it for the liveness, by which time it is restarted)
    coordinator = procs.coordinator("--local-fleet", "3", "--rounds", str(ROUNDS), "--run-dir", str(run_dir),
                                    "--algorithm", "fedavg", *FAST, "--set", "fleet.liveness_s=3.0")
    wait_for(lambda: len(metrics(run_dir)) >= 1, 120, "round 1")
    victim = wait_for(lambda: local_agent_pids(run_dir), 30, "the agents")[0]
    os.kill(victim, signal.SIGKILL)
    assert finished(coordinator, 240) == 0, procs.output("coordinator")
    log = (run_dir / "coordinator.log").read_text()
    assert "exited with code -9" in log and "restarting local agent" in log
    assert len(metrics(run_dir)) == ROUNDS
    assert json.loads((run_dir / "report.json").read_text())["status"] == "done"


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_local_agents_stop_when_their_coordinator_is_killed(procs: Processes, tmp_path: Path) -> None:
    """The agents are forked from a server the coordinator started, not from the coordinator: SIGKILL the coordinator
    alone (not its process group) and every agent still stops by itself, as a started command's would."""
    run_dir = tmp_path / "run"
    coordinator = procs.coordinator("--local-fleet", "2", "--rounds", "50", "--run-dir", str(run_dir),
                                    "--algorithm", "fedavg", *FAST)
    wait_for(lambda: len(metrics(run_dir)) >= 1, 120, "round 1")
    agents = local_agent_pids(run_dir)
    assert len(agents) == 2 and all(not gone(pid) for pid in agents)
    os.kill(coordinator.pid, signal.SIGKILL)
    wait_for(lambda: all(gone(pid) for pid in agents), 30, "the agents to stop")


def test_a_broken_agent_install_ends_the_session_with_code_4_and_the_tail(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """``coordinator start`` (its ``main``, in this process: its exit status and what it prints are the subject;
    the agents it starts are real processes, of a broken install)."""
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named fedge' >&2\nexit 1\n")
    broken.chmod(0o755)
    run_dir = tmp_path / "run"
    code = coordinator_main(["start", "--local-fleet", "2", "--rounds", "1", "--run-dir", str(run_dir),
                             "--set", f"fleet.agent_python=\"{broken}\"", "--quiet"])
    out = capfd.readouterr()
    assert code == 4, out.out + out.err
    lines = out.err.strip().splitlines()
    assert lines[-1].startswith("coordinator: error: only 0 of 2 local agents are left"), lines[-1]
    assert "none can be restarted" in lines[-1]
    assert any("local agent agent-01 exited with code 1; its last lines: ModuleNotFoundError" in line
               for line in lines)  # shown at once, not only in the log file
    log = (run_dir / "coordinator.log").read_text()
    assert log.count("ModuleNotFoundError: No module named fedge") >= 2  # every exit is logged with its tail
    assert log.count("restarting local agent agent-00") == 3


def test_a_fleet_without_local_agents_is_never_lost(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A session bound for real devices has no local agents: however long it runs, watching its empty fleet
    restarts nothing, logs nothing and never ends it as lost (FleetLost), though it is below ``min_agents``; a
    fleet of one local agent that needs two is lost at once."""
    from fedge.runtime.localfleet import AgentSpec, FleetLost, LocalFleet

    caplog.set_level(logging.DEBUG, logger="fedge.runtime.localfleet")
    bound = LocalFleet("tcp://127.0.0.1:1", [], min_agents=2)
    for now in (0.0, 1.0, 3600.0):
        bound.watch(now)
    assert (bound.processes, bound.restarts, bound.restart_at) == ({}, {}, {})
    assert caplog.records == []
    local = LocalFleet("tcp://127.0.0.1:1", [AgentSpec("agent-00", tmp_path / "shard.npz", tmp_path / "agent-00")],
                       min_agents=2)
    with pytest.raises(FleetLost, match=r"only 1 of 1 local agents are left \(the session needs 2\)"):
        local.watch(0.0)
    assert local.processes == {}  # nothing was started by watching
