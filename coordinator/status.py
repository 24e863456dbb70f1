"""What an operator sees of a running session: status.json, agents.json, fedge.prom and the service's status line.

``StatusBoard.write`` turns the registry and the session's counts into those files, at most once a second (unless
forced, at a round's end): ``status.json`` holds counts and the 100 agents heard from most recently, ``agents.json``
every agent (every 10 s and when forced; ``coordinator status --agents``, the dashboard's agent table),
``fedge.prom`` the same facts as gauges; they are replaced atomically but not fsynced (they say how things are
now, and a lost one is rewritten within a second). ``AgentTallies`` keeps each agent's running totals (bytes each way,
messages refused, rounds declined, last round aggregated), checkpointed with the session. Knows no algorithm and no
transport.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np

from fedge.coordinator.rundir import RunDir
from fedge.plumbing.files import without_fsync
from fedge.protocol.registry import AgentRegistry

STATUS_AGENTS = 100   # status.json lists the agents heard from most recently, at most this many
AGENTS_EVERY_S = 10.0  # agents.json (every agent) is written this often, and at every round's end
BOUNDED_KINDS = ("capped", "clipped", "rejected")  # per-agent counts of bounded or refused updates
TALLIES = ("bytes_down", "bytes_up", "rejections", "declined", "last_round")  # AgentTallies' fields, per agent


class AgentTallies:
    """Each agent's running totals, by client id: packet bytes of its tasks and of its aggregated updates, messages
    of its refused, rounds it declined by its availability rules, and the last round that aggregated its update."""

    def __init__(self) -> None:
        self.by_client: dict[str, dict[str, int]] = {}

    def of(self, client_id: str) -> dict[str, int]:
        return self.by_client.setdefault(client_id, dict.fromkeys(TALLIES, 0))

    def note_round(self, number: int, client_ids: Mapping[int, str], bytes_down: Mapping[int, int],
                   bytes_up: Mapping[int, int], declined: Collection[int]) -> None:
        """A closed round: ``bytes_down`` per client index sent a task, ``bytes_up`` per index aggregated."""
        for index, sent in bytes_down.items():
            self.of(client_ids[index])["bytes_down"] += int(sent)
        for index, size in bytes_up.items():
            tally = self.of(client_ids[index])
            tally["bytes_up"] += int(size)
            tally["last_round"] = number
        for index in declined:
            self.of(client_ids[index])["declined"] += 1

    def rejected(self, client_id: str) -> None:
        self.of(client_id)["rejections"] += 1

    def state(self) -> dict[str, Any]:
        return {"agent_tallies": {k: dict(v) for k, v in self.by_client.items()}}

    def load_state(self, meta: Mapping[str, Any]) -> None:
        self.by_client = {str(k): {t: int(v.get(t, 0)) for t in TALLIES}
                          for k, v in (meta.get("agent_tallies") or {}).items()}


class StatusBoard:
    """The session's status files, written no more often than they are read."""

    def __init__(self, run_dir: RunDir, rounds: int, algorithm: str) -> None:
        self.run_dir = run_dir
        self.rounds = rounds
        self.algorithm = algorithm
        self.status_written = 0.0
        self.agents_written = -1e18
        self.show: Callable[[str], None] = lambda _status: None  # the service's status line

    def write(self, phase: str, force: bool, *, run_id: str, round_number: int, registry: AgentRegistry,
              rejections: dict[str, int], bytes_total: dict[str, int], round_walls: Sequence[float],
              bounded: Mapping[str, Mapping[str, int]] | None = None,
              quarantined: Collection[str] = (), privacy: Mapping[str, Any] | None = None,
              tallies: AgentTallies | None = None, now: float | None = None) -> None:
        """``bounded``: client id -> its updates capped, clipped and rejected so far; ``quarantined``: the devices
        no longer selected (docs/robustness.md); ``privacy``: epsilon so far and its terms (docs/privacy.md);
        ``tallies``: each agent's running totals (agents.json only); ``now``: the protocol's time, which liveness
        counts in (a simulated clock's; default: the real one, which the writes are paced by)."""
        written = time.monotonic()
        if not force and written - self.status_written < 1.0:
            return
        self.status_written = written
        now = written if now is None else now
        with without_fsync():  # atomic for readers, not forced to disk: the next write replaces them
            mean_round = float(np.mean(round_walls[-5:])) if round_walls else None
            eta_s = mean_round * (self.rounds - round_number) if mean_round is not None else None
            agents: list[dict[str, Any]] = [
                {"client_id": a.client_id, "index": a.index, "connected": registry.alive(a, now),
                 "seconds_since_seen": round(now - a.last_seen, 1) if a.last_seen else None,
                 "round_s": round(a.round_s, 3) if a.round_s is not None else None,
                 **{kind: int((bounded or {}).get(a.client_id, {}).get(kind, 0)) for kind in BOUNDED_KINDS},
                 "quarantined": a.client_id in quarantined}
                for a in registry.agents.values()]
            connected = sum(1 for a in agents if a["connected"])
            recent = sorted(agents, key=lambda a: (a["seconds_since_seen"] is None, a["seconds_since_seen"] or 0.0))
            self.run_dir.write_status(run_id=run_id, phase=phase, round=round_number, rounds=self.rounds,
                                      algorithm=self.algorithm, agents=recent[:STATUS_AGENTS], agents_total=len(agents),
                                      agents_connected=connected, rejections=rejections, eta_s=eta_s,
                                      privacy=dict(privacy) if privacy is not None else None)
            if force or now - self.agents_written >= AGENTS_EVERY_S:  # every agent: `coordinator status --agents`
                self.agents_written = now
                every = [{**a, **(tallies.of(a["client_id"]) if tallies is not None else dict.fromkeys(TALLIES, 0))}
                         for a in agents]
                self.run_dir.write_json("agents.json", {"run_id": run_id, "updated_at": time.time(), "agents": every})
            self.show(f"{phase}; round {round_number}/{self.rounds}; {connected}/{len(agents)} agents connected"
                      + (f"; ETA {eta_s / 60:.1f} min" if eta_s is not None else ""))
            gauges = fleet_gauges(run_id, round_number, self.rounds, agents, bytes_total, rejections, eta_s)
            if privacy is not None:
                gauges.append(("fedge_privacy_epsilon", "Epsilon spent so far, at the run's delta.", {"run_id": run_id},
                               float(privacy["epsilon"])))
            self.run_dir.write_prometheus(gauges)


def fleet_gauges(run_id: str, round_number: int, rounds: int, agents: list[dict[str, Any]],
                 bytes_total: Mapping[str, int], rejections: Mapping[str, int],
                 eta_s: float | None) -> list[tuple[str, str, dict[str, str], float]]:
    """The Prometheus gauges of ``fedge.prom`` (docs/deployment.md, "Checking on the fleet")."""
    connected = sum(1 for a in agents if a["connected"])
    run = {"run": run_id}
    gauges: list[tuple[str, str, dict[str, str], float]] = [
        ("fedge_round", "The last committed round.", run, round_number),
        ("fedge_rounds", "The rounds the session is to play.", run, rounds),
        ("fedge_agents_connected", "Agents heard from within the liveness.", run, connected),
        ("fedge_agents_registered", "Agents that hold a client index.", run, len(agents)),
        *(("fedge_bytes", "Packet bytes of the recorded rounds.", {**run, "direction": d}, n)
          for d, n in bytes_total.items()),
        *(("fedge_agent_seconds_since_seen", "Seconds since each agent was last heard from.",
           {**run, "client": str(a["client_id"])}, float(a["seconds_since_seen"]))
          for a in agents if a["seconds_since_seen"] is not None),
        *(("fedge_rejections", "Messages refused per peer (the 100 largest counts).", {**run, "peer": peer}, n)
          for peer, n in rejections.items()),
        *(("fedge_agent_bounded", "Each agent's updates capped, clipped or rejected so far.",
           {**run, "client": str(a["client_id"]), "kind": kind}, a[kind])
          for a in agents for kind in BOUNDED_KINDS if a.get(kind)),
        *(("fedge_agent_quarantined", "1 for an agent no longer selected (robust.quarantine_after).",
           {**run, "client": str(a["client_id"])}, 1) for a in agents if a.get("quarantined")),
    ]
    if eta_s is not None:
        gauges.append(("fedge_eta_seconds", "Estimated seconds until the last round.", run, eta_s))
    return gauges
