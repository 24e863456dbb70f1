"""The local fleet: real edge-agent processes on this machine, connected to the coordinator over loopback TCP.

This is the deployment code run locally, not a simulator: each agent is ``python -m fedge.edge_agent run`` with its own
shard, state directory and log, one torch thread each (OMP_NUM_THREADS=1), and the coordinator's pid as its parent
so that it stops if the coordinator dies. An agent that exits while the session runs is logged at once (its id,
exit code and last lines) and restarted up to three times with backoff; when fewer agents are left than the
session needs and none can be restarted, ``FleetLost`` ends the session (exit status 4). The agents allow the session's own plugins (``--allow-plugin``) and get the
coordinator's working directory and ``sys.path`` entries, so that a user's plugin module imports there as here. Also writes the shards. Knows nothing of algorithms or the wire format.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

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
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts: dict[str, int] = {}
        self.restart_at: dict[str, float] = {}
        self.stopping = False

    def command(self, agent: AgentSpec) -> list[str]:
        cmd = [self.python, "-m", "fedge.edge_agent", "run", "--coordinator", self.endpoint,
               "--client-id", agent.client_id, "--data", str(agent.shard), "--state-dir", str(agent.state_dir),
               "--device", "cpu", "--parent-pid", str(os.getpid()), "--after-session", "exit",
               "--log-file", str(agent.state_dir / "agent.log")]
        for name in self.allow_plugins:
            cmd += ["--allow-plugin", name]
        if agent.keys_dir is not None and self.coordinator_key is not None:
            cmd += ["--curve", "on", "--keys-dir", str(agent.keys_dir), "--coordinator-key", str(self.coordinator_key)]
        return cmd

    def environment(self) -> dict[str, str]:
        paths = [p for p in sys.path if p and Path(p).is_dir()]
        return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join([os.getcwd(), *paths])}

    def launch(self, agent: AgentSpec) -> None:
        agent.state_dir.mkdir(parents=True, exist_ok=True)
        stderr = open(agent.state_dir / "agent.stderr", "ab")  # noqa: SIM115 - owned by the child
        try:
            self.processes[agent.client_id] = subprocess.Popen(
                self.command(agent), env=self.environment(), stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr,
                cwd=os.getcwd())
        except OSError as exc:
            raise FleetLost(f"cannot start local agent {agent.client_id} with {self.python}: {exc}") from None
        finally:
            stderr.close()

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
                log.error("local agent %s exited with code %s; its last lines: %s", cid, process.returncode,
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
