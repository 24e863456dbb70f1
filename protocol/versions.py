"""The coordinator's side of asynchronous rounds, with no I/O: tasks out, updates in, versions flushed and committed.

``VersionRounds`` is what ``protocol.coordinator.CoordinatorProtocol`` delegates to in an asynchronous session
(``round.mode = "async"``): it holds the rules' state (``protocol.asynchronous.AsyncRounds``), builds each Task from
the server half's downlink, checks each Update as a round's are checked (``protocol.validation``, the half's
``check_update``) and then by the task table (a task not in flight, another device's, or one staler than allowed
is refused with its reason), hands each accepted update out with its staleness factors (``Accepted``), stops
waiting for a task whose device failed, left, declined, lost it or let its deadline pass, cancels what a flush
leaves out of reach, and, at each flush, the Checkpoint and the Commits of the updates in it. On the wire, a task's
``round`` is its task id (unique in the run, increasing), so the agent's own rules (a task held, its update, its
cancel, its commit, the task its hello holds, its device state) apply to tasks unchanged; the task's base version is
the coordinator's. An update refused at decoding or checking ends its task at once (``lost``); one the version's
fold refuses after it was accepted (``unfolded``) keeps its place in the version's count but leaves its records and
gets no Commit. It also keeps the session's dispatch journal (``journal``, each entry a plain dict): every task
sent (its client, base version and attempt), every update accepted (with the steps its device says it trained),
every task lost (with why) and every flush (the tasks in it, in their order), in the order they happened, for the
driver to write to the run's dispatches.jsonl and ``coordinator replay`` to play again. Plain rules: no sockets,
threads, clocks or algorithms by name.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedge import codec
from fedge.codec import vocabulary as words
from fedge.protocol.asynchronous import AsyncRounds, Flush, Refusal, SentTask
from fedge.protocol.events import COORDINATOR, Accepted, Checkpoint, CoordinatorEvent, Noted, Send
from fedge.protocol.payload import ClientUpdate, Payload
from fedge.protocol.registry import AgentRegistry
from fedge.protocol.selection import measured
from fedge.protocol.server_half import ServerHalf
from fedge.protocol.validation import check_fields, check_update


@dataclass
class VersionRecord:
    """What a version being built keeps for its records: each accepted update (its typed fields, no tensors), its
    packet's size, its task and staleness; the Task bytes sent while it was current; and its start."""

    number: int
    started: float
    updates: list[tuple[int, int, codec.Update, int, int]] = field(default_factory=list)  # index, task, update, size,
    bytes_down: dict[int, int] = field(default_factory=dict)                             # staleness
    refused: list[tuple[int, int, str]] = field(default_factory=list)  # index, task, why: the fold refused it


@dataclass
class Refused:
    """An update refused: the code and reason to answer with."""

    code: str
    reason: str


class VersionRounds:
    """See the module docstring. ``task_flags(task_id)``: the runtime's further fields of a task (its norm
    bounds)."""

    def __init__(self, rounds: AsyncRounds, registry: AgentRegistry, shapes: dict[str, tuple[int, ...]],
                 task_flags: Callable[[int], dict[str, Any]], deadline_s: float, now: float,
                 device_state: bool = False) -> None:
        self.rounds = rounds
        self.device_state = device_state  # devices keep state between tasks: one uncommitted task at most
        self.registry = registry
        self.shapes = shapes
        self.task_flags = task_flags
        self.deadline_s = deadline_s
        self.building = VersionRecord(rounds.version + 1, now)
        self.last_flush: Flush | None = None  # until its Commits are out
        self.latest: dict[int, int] = {t.index: t.task_id for t in rounds.in_flight.values()}  # each device's last task
        self.finished = False
        self.started = self.seen = now  # the session's start; the latest time this object was told (its journal's)
        self.refused: set[int] = set()  # tasks whose accepted update the fold refused: no Commit (``unfolded``)
        self.journal: list[dict[str, Any]] = []  # what happened since the driver last took it (``take_journal``)

    def note(self, event: str, now: float, **fields: Any) -> None:
        self.seen = max(self.seen, now)
        self.journal.append({"event": event, **fields, "t": round(now - self.started, 6)})

    def take_journal(self) -> list[dict[str, Any]]:
        """The journal's entries since the last call, oldest first."""
        taken, self.journal = self.journal, []
        return taken

    @property
    def version(self) -> int:
        return self.rounds.version

    def held_by(self, index: int) -> SentTask | None:
        return next((t for t in self.rounds.in_flight.values() if t.index == index), None)

    # ------------------------------------------------------------------------------------------ tasks
    def dispatch(self, server: ServerHalf, run_id: str, committed: int, index: int, now: float) -> Send:
        """Send client ``index`` a task on the current version."""
        sent = self.rounds.dispatch(index, now)
        self.latest[index] = sent.task_id
        agent = self.registry.by_index(index)
        self.note("task", now, task=sent.task_id, client=index, client_id=agent.client_id, base=sent.base,
                  attempt=sent.attempt)
        payload: Payload = server.downlink(self.version + 1, index)
        return Send(peer=agent.peer, message=codec.Task(
            run_id=run_id, round=sent.task_id, sender=COORDINATOR, groups=dict(payload.groups),
            meta=dict(payload.meta), committed_round=committed, last_accepted_round=agent.last_accepted_round,
            deadline_s=self.deadline_s, base_version=sent.base, attempt=sent.attempt,
            **self.task_flags(sent.task_id)), task_of=index)

    def sent(self, index: int, size: int) -> None:
        self.building.bytes_down[index] = self.building.bytes_down.get(index, 0) + size

    def idle(self, live: list[int]) -> list[int]:
        """The live clients holding no task, in index order; for an algorithm whose devices keep state
        (``device_state``), also none whose update waits in the version being built for its flush's Commit: a
        device holds at most one uncommitted task, so that its next starts from the state its last one left."""
        busy = self.rounds.busy()
        if self.device_state:
            busy |= {update[0] for update in self.building.updates}
        return [index for index in live if index not in busy]

    def pick(self, idle: list[int], seed: int) -> int:
        """Which of the ``idle`` clients gets the next task: drawn from (run seed, the task's id), so that a run
        that makes the same choices in the same order draws the same devices."""
        return idle[int(np.random.default_rng([seed, self.rounds.next_id]).integers(len(idle)))]

    def holds(self, index: int) -> bool:
        """Whether client ``index`` has a task in flight, was sent a task or has an update in the version being
        built, or has one in the version last flushed whose Commits are not out yet: its index must not change
        hands (the version's records and Commits name it)."""
        flushed = self.last_flush.arrivals if self.last_flush is not None else ()
        return self.held_by(index) is not None or index in self.building.bytes_down or \
            any(u[0] == index for u in self.building.updates) or any(a.index == index for a in flushed)

    def finish(self) -> None:
        """The session has its versions: every update from now on is refused."""
        self.finished = True

    # ------------------------------------------------------------------------------------------ updates
    def update(self, server: ServerHalf, client_id: str, index: int, update: codec.Update, size: int,
               now: float, admit: Callable[[ClientUpdate], str] = lambda _update: "",
               floats: frozenset[str] | None = None) -> Accepted | Refused:
        """An Update whose ``round`` names its task: accepted with its factors, or refused with a reason (also once
        the version has its ``buffer`` updates and is not flushed yet, and once the session is over); ``admit``:
        the version's own check of its fold (``Aggregation.check``); ``floats``: the model's float tensors
        (``protocol.validation.check_update``)."""
        if self.finished:
            return Refused(words.STALE, f"the session has its {self.version} versions")
        if self.rounds.flush_due:
            return Refused(words.STALE, f"version {self.version + 1} has its {self.rounds.settings.buffer} updates")
        task = self.rounds.in_flight.get(update.round)
        decoded = ClientUpdate(client_id=client_id, index=index, num_samples=update.num_samples,
                               payload=Payload(groups=dict(update.groups), meta=dict(update.meta)),
                               clip_scale=update.clip_scale)
        if task is not None and task.index == index:
            problem = check_fields(update) or check_update(update, self.shapes, set(), floats) or \
                server.check_update(self.version + 1, decoded) or \
                admit(decoded)
            if problem:
                self.rounds.fail(task.task_id)
                self.note("lost", now, task=task.task_id, client=index, why=f"invalid update: {problem}")
                return Refused(words.INVALID_UPDATE, problem)
        outcome = self.rounds.arrive(update.round, index)
        if isinstance(outcome, Refusal):
            if task is not None and task.index == index:  # it was in flight: it no longer is
                self.note("lost", now, task=task.task_id, client=index, why=outcome.reason)
            return Refused(words.STALE, outcome.reason)
        assert task is not None
        self.note("update", now, task=task.task_id, client=index, steps=update.steps)
        self.building.updates.append((index, task.task_id, dataclasses.replace(update, groups={}, meta={}), size,
                                      outcome.staleness))
        agent = self.registry.by_index(index)
        agent.round_s = measured(agent.round_s, max(now - task.sent_at, 0.0))
        return Accepted(self.version + 1, dataclasses.replace(decoded, discount=outcome.discount,
                                                              counted=outcome.counted))

    def lost(self, index: int, why: str, task_id: int | None = None) -> list[CoordinatorEvent]:
        """Client ``index``'s task (``task_id``, or whichever it holds) will not come: it is no longer awaited."""
        task = self.held_by(index)
        if task is None or (task_id is not None and task.task_id != task_id):
            return []
        self.rounds.fail(task.task_id)
        self.note("lost", self.seen, task=task.task_id, client=index, why=why)
        return [Noted(logging.INFO, f"task {task.task_id} of client {index}: {why}")]

    def unfolded(self, index: int, version: int, reason: str) -> list[CoordinatorEvent]:
        """The fold of version ``version`` (the one being built) refused client ``index``'s last update in it: the
        update leaves the version's records and its task gets no Commit."""
        if version != self.version + 1:
            raise RuntimeError(f"version {version} is not the version being built ({self.version + 1})")
        entry = next((u for u in reversed(self.building.updates) if u[0] == index and u[1] not in self.refused), None)
        if entry is None:
            raise RuntimeError(f"client {index} has no update in version {version}")
        self.building.updates.remove(entry)
        self.building.refused.append((index, entry[1], reason))
        self.refused.add(entry[1])
        return [Noted(logging.INFO, f"task {entry[1]} of client {index}: {reason}")]

    def expire(self, run_id: str, now: float, alive: Callable[[int], bool]) -> list[CoordinatorEvent]:
        """Tasks past their deadline, or whose device is gone: no longer awaited; a device still there is sent
        Cancel."""
        events: list[CoordinatorEvent] = []
        for task in list(self.rounds.in_flight.values()):
            # (the same sum as ``next_deadline``: a simulated clock stopped at a deadline finds its task late there)
            late, gone = now >= task.sent_at + self.deadline_s, not alive(task.index)
            if late or gone:
                self.rounds.fail(task.task_id)
                why = "its device is gone" if gone else "it passed its deadline"
                self.note("lost", now, task=task.task_id, client=task.index, why=why)
                events.append(Noted(logging.INFO, f"task {task.task_id} of client {task.index}: {why}"))
                if late and not gone:
                    events.append(self.cancel(run_id, task, "the task passed its deadline"))
        return events

    def next_deadline(self) -> float:
        """When the oldest task in flight passes its deadline (infinity with none in flight)."""
        return min((t.sent_at for t in self.rounds.in_flight.values()), default=math.inf) + self.deadline_s

    def cancel(self, run_id: str, task: SentTask, reason: str) -> Send:
        return Send(peer=self.registry.by_index(task.index).peer, message=codec.Cancel(
            run_id=run_id, round=task.task_id, sender=COORDINATOR, reason=reason))

    # ------------------------------------------------------------------------------------------ flushes
    def flush(self, run_id: str, now: float) -> tuple[Flush, VersionRecord, list[CoordinatorEvent]]:
        """Close the version being built: its flush, its record, and a Cancel to each task it leaves out of reach."""
        flush = self.last_flush = self.rounds.flush()
        record, self.building = self.building, VersionRecord(flush.version + 1, now)
        self.note("flush", now, version=flush.version, tasks=[a.task_id for a in flush.arrivals],
                  cancelled=[t.task_id for t in flush.cancelled])
        cancels: list[CoordinatorEvent] = [self.cancel(run_id, task, f"version {flush.version} leaves the task more "
                                                                     "than max_staleness behind")
                                           for task in flush.cancelled]
        return flush, record, cancels

    def commits(self, run_id: str, flush: Flush) -> list[CoordinatorEvent]:
        """The Checkpoint of version ``flush.version``, then a Commit of each task in it, save those whose device has
        been sent a later task since (its next task discarded what this one left pending: no Commit can find it)."""
        events: list[CoordinatorEvent] = [Checkpoint(flush.version)]
        for arrival in flush.arrivals:
            if arrival.task_id in self.refused:  # its update was not folded: nothing of it to commit
                self.refused.discard(arrival.task_id)
                continue
            agent = self.registry.by_index(arrival.index)
            agent.last_accepted_round = max(agent.last_accepted_round, arrival.task_id)
            if self.latest.get(arrival.index, 0) > arrival.task_id:
                continue
            events.append(Send(peer=agent.peer, message=codec.Commit(run_id=run_id, round=arrival.task_id,
                                                                     sender=COORDINATOR)))
        return events
