"""Paced uploads: which agents that finished training may send their update now (``fleet.max_uploads``).

With pacing on, every Task says ``paced``: an agent holds its finished update and says so in its heartbeat
(``ready``); the coordinator grants at most ``max_in_flight`` uploads at a time, in the order the agents became
ready, and grants the next as each granted update arrives (or its agent stops being awaited: it failed, left,
was cancelled, or went silent). So a thousand dense updates never sit in the coordinator's receive queues at once.
An agent that says it is ready again after its grant is granted again (the Grant may have been lost; a second
Grant of an update already sent is ignored by the agent). Pure: indices and callbacks in, indices out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection


class UploadPacer:
    """The grants of the round in progress. Every call takes time in the waiting agents it grants or skips and the
    uploads in flight (at most ``max_in_flight``), never in the round's size."""

    def __init__(self, max_in_flight: int = 0) -> None:
        self.max_in_flight = max_in_flight
        self.reset()

    @property
    def on(self) -> bool:
        return self.max_in_flight > 0

    def reset(self) -> None:
        """A new round: nobody waits, nothing is granted."""
        self.waiting: deque[int] = deque()
        self.queued: set[int] = set()      # the members of ``waiting``
        self.granted: set[int] = set()     # every grant of the round
        self.in_flight: set[int] = set()   # grants whose update is still awaited

    def ready(self, index: int) -> bool:
        """``index`` holds its update; True when it was granted already (grant it again)."""
        if index in self.granted:
            return True
        if index not in self.queued:
            self.queued.add(index)
            self.waiting.append(index)
        return False

    def next_grants(self, awaited: Collection[int], alive: Callable[[int], bool]) -> list[int]:
        """Who may upload now: waiting agents, oldest first, while fewer than the limit are in flight (a grant stops
        being in flight when its update arrived, or its agent stopped being awaited or went silent)."""
        self.in_flight = {i for i in self.in_flight if i in awaited and alive(i)}
        grants = []
        while self.waiting and len(self.in_flight) < self.max_in_flight:
            index = self.waiting.popleft()
            self.queued.discard(index)
            if index not in awaited:
                continue
            self.granted.add(index)
            self.in_flight.add(index)
            grants.append(index)
        return grants
