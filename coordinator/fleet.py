"""The local fleet: real edge-agent processes on this machine, connected to the coordinator over loopback TCP.

This is the deployment code run locally, not a simulator: each agent is ``python -m fedge.edge_agent run`` with its own
shard, state directory and log, one torch thread each (OMP_NUM_THREADS=1), and the coordinator's pid as its parent
so that it stops if the coordinator dies. The agents allow the session's own plugins (``--allow-plugin``) and get the
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

log = logging.getLogger("fedge.coordinator.fleet")


def agent_id(index: int) -> str:
    return f"agent-{index:02d}"


@dataclass(frozen=True)
class AgentSpec:
    client_id: str
    shard: Path
    state_dir: Path
    keys_dir: Path | None = None


class LocalFleet:
    """Start, watch and stop the local agent processes."""

    def __init__(self, endpoint: str, agents: list[AgentSpec], coordinator_key: Path | None = None,
                 allow_plugins: list[str] | None = None) -> None:
        self.endpoint = endpoint
        self.allow_plugins = list(allow_plugins or [])
        self.agents = agents
        self.coordinator_key = coordinator_key
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def command(self, agent: AgentSpec) -> list[str]:
        cmd = [sys.executable, "-m", "fedge.edge_agent", "run", "--coordinator", self.endpoint,
               "--client-id", agent.client_id, "--data", str(agent.shard), "--state-dir", str(agent.state_dir),
               "--device", "cpu", "--parent-pid", str(os.getpid()),
               "--log-file", str(agent.state_dir / "agent.log")]
        for name in self.allow_plugins:
            cmd += ["--allow-plugin", name]
        if agent.keys_dir is not None and self.coordinator_key is not None:
            cmd += ["--curve", "on", "--keys-dir", str(agent.keys_dir), "--coordinator-key", str(self.coordinator_key)]
        return cmd

    def start(self) -> None:
        paths = [p for p in sys.path if p and Path(p).is_dir()]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join([os.getcwd(), *paths])}
        for agent in self.agents:
            agent.state_dir.mkdir(parents=True, exist_ok=True)
            stderr = open(agent.state_dir / "agent.stderr", "ab")  # noqa: SIM115 - owned by the child
            self.processes[agent.client_id] = subprocess.Popen(
                self.command(agent), env=env, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, cwd=os.getcwd())
            stderr.close()
        log.info("started %d local agents", len(self.agents))

    def exited(self) -> dict[str, int]:
        return {cid: p.returncode for cid, p in self.processes.items() if p.poll() is not None}

    def stop(self, grace_s: float = 10.0) -> None:
        """Wait for agents to leave (they were told bye), then SIGTERM, then SIGKILL what remains."""
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
