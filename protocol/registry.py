"""The coordinator's registry of agents: who registered, under which index, and who is alive.

A client id (chosen by the device) maps to a stable index, assigned in order of first registration (or fixed up
front for a local fleet) and kept in the checkpoint, so algorithms that need indices see the same client after any
restart. Liveness is the time since the agent was last heard from, against the time the caller gives (no clock is read
here). Knows nothing of sockets or torch.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Agent:
    client_id: str
    index: int
    peer: bytes = b""
    dataset_size: int = 0
    last_seen: float = 0.0
    connected: bool = False
    hello: dict[str, Any] = field(default_factory=dict)
    last_accepted_round: int = 0
    round_s: float | None = None  # measured round time (task sent to update received), averaged; None: not yet
    joined: bool = True  # False for an agent that declined this session before: not alive until it shows it joined


class AgentRegistry:
    """Client id -> Agent, with a capacity (the session's client count N). Every per-agent operation (look-up by
    id or by index, registration, release) takes constant time, or log N for the next free index."""

    def __init__(self, capacity: int, liveness_s: float) -> None:
        self.capacity = capacity
        self.liveness_s = liveness_s
        self.agents: dict[str, Agent] = {}
        self.indexed: dict[int, Agent] = {}
        self.free = list(range(capacity))  # a heap: the smallest free index is assigned first

    def reserve(self, client_ids: list[str]) -> None:
        """Fix indices up front (a local fleet: agent i holds shard i)."""
        for client_id in client_ids:
            self.index_of(client_id)

    def index_of(self, client_id: str) -> int | None:
        """The index of a client id, assigning the next free one; None when the session is full."""
        if client_id in self.agents:
            return self.agents[client_id].index
        if not self.free:
            return None
        self.add(Agent(client_id=client_id, index=heapq.heappop(self.free)))
        return self.agents[client_id].index

    def add(self, agent: Agent) -> None:
        self.agents[agent.client_id] = agent
        self.indexed[agent.index] = agent

    def release(self, client_id: str) -> bool:
        """Free the index of an agent that declined the session before any update of it was accepted; True when
        freed (an agent that has trained keeps its index: algorithms hold state under it)."""
        agent = self.agents.get(client_id)
        if agent is None or agent.last_accepted_round > 0:
            return False
        del self.agents[client_id]
        del self.indexed[agent.index]
        heapq.heappush(self.free, agent.index)
        return True

    def get(self, client_id: str) -> Agent | None:
        return self.agents.get(client_id)

    def by_index(self, index: int) -> Agent:
        return self.indexed[index]

    def touch(self, client_id: str, now: float) -> None:
        agent = self.agents.get(client_id)
        if agent is not None:
            agent.last_seen = now

    def alive(self, agent: Agent, now: float) -> bool:
        return agent.connected and agent.joined and now - agent.last_seen <= self.liveness_s

    def live_indices(self, now: float) -> list[int]:
        return sorted(a.index for a in self.agents.values() if self.alive(a, now))

    def state(self) -> dict[str, Any]:
        return {
            "clients": {a.client_id: a.index for a in self.agents.values()},
            "last_accepted": {a.client_id: a.last_accepted_round for a in self.agents.values()},
        }

    def load_state(self, state: dict[str, Any]) -> None:
        for client_id, index in sorted(state.get("clients", {}).items(), key=lambda kv: kv[1]):
            self.add(Agent(client_id=client_id, index=int(index)))
        taken = set(self.indexed)
        self.free = [i for i in range(self.capacity) if i not in taken]  # sorted: already a heap
        for client_id, round_number in state.get("last_accepted", {}).items():
            if client_id in self.agents:
                self.agents[client_id].last_accepted_round = int(round_number)
