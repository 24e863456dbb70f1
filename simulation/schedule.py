"""A simulated-clock fleet's calendar: the jobs out, each with its finish time, and the device trace's comings and
goings, in the order the clock meets them; no backend, no clients, no I/O.

``JobSchedule`` is what ``simulation.fleet.SimulatedFleet`` asks "what happens next?" on a simulated clock
(``fleet.clock = "simulated"``, docs/scale.md):

- **A job** is fixed when its Task is handed to its client: its number (which draws its jitter), its steps (all it
  planned, or what ``fleet.max_seconds`` leaves: ``DeviceTiming.steps_within``) and its finish, the dispatch time
  plus its training and its Task's bytes on the link. With a bandwidth set, a job that finishes training then
  uploads: its update's bytes, known once it is trained, take their time on the link before it arrives (``upload``).
- **The order.** Entries are taken by (time, job number). A job cancelled meanwhile (``drop``) is taken silently
  and moves nothing. A trace's move at a time no later than the next entry comes first.
- **The horizon.** The clock never passes the session's next deadline; with nothing due before it (and no move), a
  poll's timeout passes on the clock.
- **Checkpoint.** ``state``/``restore``: the entries (with the jobs' Task packets, kept by the caller) and the moves
  already made, so a resumed run takes up the same calendar.

Plain data and arithmetic: the clock is handed in and moved only by ``SimulatedFleet``.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from dataclasses import dataclass
from typing import Any

from fedge.simulation.timing import DeviceTiming

Entry = tuple[float, int, str, int, bool]  # (time, job number, client id, task's round, uploading)


@dataclass(frozen=True)
class Move:
    """A trace's move: client ``client_id`` comes (``there``) or goes at ``time``."""

    time: float
    client_id: str
    there: bool


class JobSchedule:
    """See the module docstring. ``ids``: the fleet's client ids by index (the trace's and the timing's client
    numbers)."""

    def __init__(self, timing: DeviceTiming, ids: list[str]) -> None:
        self.timing = timing
        self.ids = ids
        self.index = {client_id: i for i, client_id in enumerate(ids)}
        self.due: list[Entry] = []
        self.dropped: set[tuple[str, int]] = set()
        self.skipped: list[tuple[str, int]] = []  # dropped jobs taken off the calendar, their results not collected
        self.jobs = 0
        self.restored: dict[tuple[str, int], Entry] = {}  # a resumed job's entry, until its Task is received again
        trace = timing.trace
        self.moves = [Move(t, ids[c], there) for t, c, there in trace.changes()] if trace is not None else []
        self.moved = 0  # the moves already made
        self.trace_digest = hashlib.sha256(repr([(m.time, m.client_id, m.there) for m in self.moves]).encode()
                                           ).hexdigest()[:16]  # a resume refuses a trace that changed

    def absent_at(self, now: float) -> set[str]:
        """The clients the trace keeps away at ``now`` (before any move is made)."""
        trace = self.timing.trace
        return {cid for i, cid in enumerate(self.ids) if trace is not None and not trace.available(i, now)}

    def add(self, client_id: str, round_number: int, planned: int, nbytes: int, now: float) -> int:
        """A job for ``client_id``'s task: scheduled (or, for a resumed job, its checkpointed entry taken up);
        returns its work budget in steps (0: none, it trains all it planned)."""
        entry = self.restored.pop((client_id, round_number), None)
        if entry is None:
            self.jobs += 1
            job = self.jobs
        else:
            job = entry[1]
        client = self.index[client_id]
        steps = self.timing.steps_within(client, job, planned)
        if entry is None:
            entry = (now + self.timing.duration(client, job, steps, nbytes), job, client_id, round_number, False)
        heapq.heappush(self.due, entry)
        return steps if steps < planned else 0

    def drop(self, client_id: str, round_number: int) -> None:
        self.dropped.add((client_id, round_number))

    def next(self, now: float, horizon: float, timeout_s: float) -> tuple[float, Entry | Move | None]:
        """What comes next, and when: a job's entry, a trace's move, or nothing (then the time is where a poll's
        wait ends). The dropped jobs met on the way are listed in ``skipped``: the caller collects their results."""
        while self.due and (self.due[0][2], self.due[0][3]) in self.dropped:  # taken silently: no time passes
            _, _, client_id, round_number, _ = heapq.heappop(self.due)
            self.dropped.discard((client_id, round_number))
            self.skipped.append((client_id, round_number))
        head = self.due[0][0] if self.due else math.inf
        move = self.moves[self.moved] if self.moved < len(self.moves) else None
        if move is not None and move.time <= min(head, horizon, now + timeout_s if not self.due else math.inf):
            self.moved += 1
            return move.time, move
        if not self.due or head > horizon:
            return min(horizon, now + timeout_s), None
        entry = heapq.heappop(self.due)
        return entry[0], entry

    def upload(self, entry: Entry, nbytes: int) -> None:
        """A job trained: its update's ``nbytes`` go up the link, and it arrives once they have."""
        finish, job, client_id, round_number, _ = entry
        heapq.heappush(self.due, (finish + self.timing.transfer(nbytes), job, client_id, round_number, True))

    # ------------------------------------------------------------------------------------------ checkpoint
    def state(self) -> dict[str, Any]:
        due = sorted(entry for entry in self.due if (entry[2], entry[3]) not in self.dropped)
        return {"jobs": self.jobs, "due": [list(entry) for entry in due], "moved": self.moved,
                "trace": self.trace_digest}

    def restore(self, state: dict[str, Any]) -> list[Entry]:
        """Take up a checkpoint's calendar; returns the jobs out, whose Tasks the caller hands their clients again
        (each taken up by ``add``)."""
        if state.get("trace", self.trace_digest) != self.trace_digest:
            raise ValueError("fleet.trace is not the trace this run was checkpointed with (its moves differ): "
                             "restore that file to resume")
        self.jobs, self.moved = int(state["jobs"]), int(state.get("moved", 0))
        entries = [(float(t), int(job), str(cid), int(r), bool(up)) for t, job, cid, r, up in state["due"]]
        self.restored = {(entry[2], entry[3]): entry for entry in entries}
        return entries
