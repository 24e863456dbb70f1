"""The local fleet: real edge-agent processes on this machine, connected to the coordinator over loopback TCP.

This is the deployment code run locally, not a simulator: each agent runs ``fedge.edge_agent``'s ``run`` command with
its own shard, state directory and log, one torch thread each (OMP_NUM_THREADS=1), and stops if the process that
started it is gone. With the coordinator's own interpreter (``fleet.agent_python`` empty) each agent is forked from a
server that imported the agent and torch once (``plumbing.forking``: an agent starts in milliseconds, not seconds of
import); with another interpreter (another venv) it is ``PYTHON -m fedge.edge_agent run ...``. Either way the
coordinator's log says each agent's pid. An agent that exits while the session runs is logged at once (its id,
exit code and last lines) and restarted up to three times with backoff; when fewer agents are left than the
session needs and none can be restarted, ``FleetLost`` ends the session (exit status 4). The agents allow the
session's own plugins (``--allow-plugin``) and get the coordinator's working directory and ``sys.path`` entries, so
that a user's plugin module imports there as here. Also writes the shards. Knows nothing of algorithms or the wire
format.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import runpy
import subprocess
import sys
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Protocol

from fedge.plumbing.forking import ParentState, preloaded_context

log = logging.getLogger("fedge.runtime.localfleet")


def agent_id(index: int) -> str:
    return f"agent-{index:02d}"


@dataclass(frozen=True)
class AgentSpec:
    client_id: str
    shard: Path
    state_dir: Path
    keys_dir: Path | None = None


class FleetLost(RuntimeError):
    """Fewer local agents are left than the session needs, and none can be restarted (exit status 4)."""


RESTARTS = 3          # per agent
RESTART_BACKOFF_S = 1.0  # doubled per restart of the same agent
LOG_TAIL_LINES = 5
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # every numeric library of an agent, started or forked


class AgentProcess(Protocol):
    """What the fleet needs of a started agent: ``subprocess.Popen``'s, or a forked one's (``ForkedAgent``)."""

    pid: int

    def poll(self) -> int | None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...
    def wait(self, timeout: float | None = None) -> int: ...


class ForkedAgent:
    """An agent forked from the preloaded server, behind ``Popen``'s calls (its exit code: negative for a signal)."""

    def __init__(self, process: BaseProcess) -> None:
        self.process = process
        self.pid = int(process.pid or 0)

    def poll(self) -> int | None:
        return self.process.exitcode

    def terminate(self) -> None:
        self.process.terminate()

    def kill(self) -> None:
        self.process.kill()

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(f"local agent {self.pid}", timeout or 0.0)
        return self.process.exitcode


def forked_agent_main(arguments: list[str], output: str, parent: ParentState) -> None:
    """A forked agent's start: its starter's directory, path and environment, its output to ``output`` (as a
    started command's is), one torch thread, then ``edge-agent run`` with ``arguments``."""
    parent.adopt()
    descriptor = os.open(output, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    os.close(descriptor)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's own streams
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    os.environ.update(ONE_THREAD)
    sys.argv = ["edge-agent", *arguments]
    runpy.run_module("fedge.edge_agent", run_name="__main__", alter_sys=True)  # as ``python -m fedge.edge_agent``


class LocalFleet:
    """Start, watch, restart and stop the local agent processes."""

    def __init__(self, endpoint: str, agents: list[AgentSpec], coordinator_key: Path | None = None,
                 allow_plugins: list[str] | None = None, python: str = "", min_agents: int = 1) -> None:
        self.endpoint = endpoint
        self.allow_plugins = list(allow_plugins or [])
        self.agents = agents
        self.coordinator_key = coordinator_key
        self.python = python or sys.executable
        self.min_agents = min_agents
        self.start_agent = self.command_agent if python else self.forked_agent  # another interpreter, or this one
        self.processes: dict[str, AgentProcess] = {}
        self.restarts: dict[str, int] = {}
        self.restart_at: dict[str, float] = {}
        self.stopping = False

    def arguments(self, agent: AgentSpec) -> list[str]:
        """``edge-agent``'s arguments for one agent: it stops when this process is gone (``--parent-pid``)."""
        cmd = ["run", "--coordinator", self.endpoint,
               "--client-id", agent.client_id, "--data", str(agent.shard), "--state-dir", str(agent.state_dir),
               "--device", "cpu", "--parent-pid", str(os.getpid()), "--after-session", "exit",
               "--log-file", str(agent.state_dir / "agent.log")]
        for name in self.allow_plugins:
            cmd += ["--allow-plugin", name]
        if agent.keys_dir is not None and self.coordinator_key is not None:
            cmd += ["--curve", "on", "--keys-dir", str(agent.keys_dir), "--coordinator-key", str(self.coordinator_key)]
        return cmd

    def command(self, agent: AgentSpec) -> list[str]:
        return [self.python, "-m", "fedge.edge_agent", *self.arguments(agent)]

    def environment(self) -> dict[str, str]:
        paths = [p for p in sys.path if p and Path(p).is_dir()]
        return {**os.environ, **ONE_THREAD, "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join([os.getcwd(), *paths])}

    def command_agent(self, agent: AgentSpec) -> AgentProcess:
        stderr = open(agent.state_dir / "agent.stderr", "ab")  # noqa: SIM115 - owned by the child
        try:
            return subprocess.Popen(self.command(agent), env=self.environment(), stdin=subprocess.DEVNULL,
                                    stdout=stderr, stderr=stderr, cwd=os.getcwd())
        finally:
            stderr.close()

    def forked_agent(self, agent: AgentSpec) -> AgentProcess:
        context = preloaded_context("torch", "fedge.edge_agent.cli", "fedge.edge_agent.agent")
        parent = ParentState.now()  # the working directory first on the path, as the command's PYTHONPATH has it
        parent = dataclasses.replace(parent, path=(parent.cwd, *parent.path))
        process = context.Process(target=forked_agent_main, name=agent.client_id,
                                  args=(self.arguments(agent), str(agent.state_dir / "agent.stderr"), parent))
        process.start()
        return ForkedAgent(process)

    def launch(self, agent: AgentSpec) -> None:
        agent.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            process = self.start_agent(agent)
        except OSError as exc:
            raise FleetLost(f"cannot start local agent {agent.client_id} with {self.python}: {exc}") from None
        self.processes[agent.client_id] = process
        log.info("local agent %s started (pid %d)", agent.client_id, process.pid)

    def start(self) -> None:
        for agent in self.agents:
            self.launch(agent)
        log.info("started %d local agents", len(self.agents))

    def tail(self, agent: AgentSpec) -> str:
        """The last lines the agent wrote (stderr, then its log), for the coordinator's log."""
        for name in ("agent.stderr", "agent.log"):
            path = agent.state_dir / name
            if path.exists() and path.stat().st_size:
                lines = path.read_text(errors="replace").strip().splitlines()[-LOG_TAIL_LINES:]
                return " | ".join(line.strip() for line in lines)
        return "(no output)"

    def watch(self, now: float) -> None:
        """Restart local agents that exited while the session runs (at most RESTARTS times each, with backoff);
        FleetLost when fewer than ``min_agents`` remain and none can be restarted."""
        if self.stopping or not self.agents:  # a session bound for real devices has no local fleet to watch
            return
        for agent in self.agents:
            process = self.processes.get(agent.client_id)
            if process is None or process.poll() is None:
                continue
            cid = agent.client_id
            if cid not in self.restart_at:
                count = self.restarts.get(cid, 0)
                log.error("local agent %s exited with code %s; its last lines: %s", cid, process.poll(),
                          self.tail(agent))
                if count >= RESTARTS:
                    self.restart_at[cid] = float("inf")
                else:
                    self.restart_at[cid] = now + RESTART_BACKOFF_S * 2 ** count
            if now >= self.restart_at[cid]:
                self.restarts[cid] = self.restarts.get(cid, 0) + 1
                del self.restart_at[cid]
                log.warning("restarting local agent %s (%d of %d)", cid, self.restarts[cid], RESTARTS)
                self.launch(agent)
        lost = sum(1 for at in self.restart_at.values() if at == float("inf"))  # exited with no restart left
        left = len(self.agents) - lost
        if left < self.min_agents:
            raise FleetLost(f"only {left} of {len(self.agents)} local agents are left (the session needs "
                            f"{self.min_agents}) and none can be restarted; see the agents' lines above and "
                            "RUN_DIR/agents/*/agent.stderr")

    def stop(self, grace_s: float = 10.0) -> None:
        """Wait for agents to leave (they were told bye), then SIGTERM, then SIGKILL what remains."""
        self.stopping = True
        until = time.monotonic() + grace_s
        while time.monotonic() < until and any(p.poll() is None for p in self.processes.values()):
            time.sleep(0.1)
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        until = time.monotonic() + 5.0
        for process in self.processes.values():
            try:
                process.wait(max(0.1, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
