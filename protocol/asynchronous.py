"""Asynchronous buffered aggregation (FedBuff, Nguyen et al. 2022) as rules with no I/O: which task may be sent, how
stale an update is, whether it is folded and with what weight, when a version is flushed and which tasks it cancels.

The definitions (docs/protocol.md, "Asynchronous rounds"):

- **Versions.** The global model's number: 0 is the initial model, and each flush makes the next one.
- **A task's base** is the version current when it was sent. Its update is a change from that base (a delta), and
  its **staleness** tau is the number of versions made since it was sent: (the current version, the last flushed)
  - (its base), so an update folded into the version its task was sent on has tau = 0.
- **The weight.** An accepted update's values count s(tau) times its sample weight, with s the ``staleness`` rule:
  ``sqrt`` 1/sqrt(1+tau), ``constant`` 1. ``normalize`` says what the flush's mean divides by: ``count``, the
  undiscounted weights (FedBuff's (1/K) sum s(tau_i) delta_i under uniform weighting: a stale update moves the model
  less), or ``weight``, the discounted ones (staleness only re-weights the updates within a flush).
- **Refusal.** An update with tau > ``max_staleness`` is refused, with its reason. A task in flight whose base is more
  than ``max_staleness`` behind once a version is flushed is cancelled then: its update could only be refused.
- **Dispatch.** At most ``concurrency`` tasks are in flight, a client holds at most one, and no task is sent that
  could only be refused: the tasks in flight and the updates buffered stay below ``buffer`` times
  (``max_staleness`` + 1), the updates the versions within reach can still take. With concurrency = buffer = the
  cohort and max_staleness 0, this makes the asynchronous run the synchronous one.
- **Flush.** Every ``buffer`` accepted updates the version is closed on the one aggregation path and the next begins.

``AsyncRounds`` keeps the version, the tasks in flight (each a ``SentTask`` with its ``TaskPhase``, by the table below)
and the buffered arrivals, and can be saved and restored as JSON-able data.

    TaskPhase     event     next
    IN_FLIGHT     accept    ACCEPTED
    IN_FLIGHT     refuse    REFUSED     (staler than allowed)
    IN_FLIGHT     cancel    CANCELLED   (its base fell too far behind before it arrived)
    IN_FLIGHT     fail      FAILED      (the device reported a failure, or left)

Plain data and arithmetic: no sockets, threads, clocks (a time is passed in) or algorithms.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

from fedge.protocol.states import next_state

STALENESS_RULES = ("sqrt", "constant")
NORMALIZATIONS = ("count", "weight")


@dataclass(frozen=True)
class AsyncSettings:
    """The ``[asynchronous]`` section's keys (docs/config.md)."""

    concurrency: int = 10
    buffer: int = 10
    max_staleness: int = 10
    staleness: str = "sqrt"
    normalize: str = "count"

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.buffer < 1:
            raise ValueError("asynchronous.concurrency and asynchronous.buffer must be >= 1")
        if self.max_staleness < 0:
            raise ValueError("asynchronous.max_staleness must be >= 0 (0: only updates of the current version)")
        if self.staleness not in STALENESS_RULES:
            raise ValueError(f"asynchronous.staleness must be one of {', '.join(STALENESS_RULES)}, got "
                             f"{self.staleness!r}")
        if self.normalize not in NORMALIZATIONS:
            raise ValueError(f"asynchronous.normalize must be one of {', '.join(NORMALIZATIONS)}, got "
                             f"{self.normalize!r}")


def staleness_weight(staleness: int, rule: str) -> float:
    """s(tau): 1/sqrt(1+tau) (``sqrt``) or 1 (``constant``)."""
    if staleness < 0:
        raise ValueError(f"a staleness cannot be negative, got {staleness}")
    if rule == "sqrt":
        return 1.0 / math.sqrt(1.0 + staleness)
    if rule == "constant":
        return 1.0
    raise ValueError(f"staleness rule must be one of {', '.join(STALENESS_RULES)}, got {rule!r}")


class TaskPhase(enum.Enum):
    IN_FLIGHT = "in-flight"
    ACCEPTED = "accepted"
    REFUSED = "refused"
    CANCELLED = "cancelled"
    FAILED = "failed"


TASK_TRANSITIONS: dict[tuple[TaskPhase, str], TaskPhase] = {
    (TaskPhase.IN_FLIGHT, "accept"): TaskPhase.ACCEPTED,
    (TaskPhase.IN_FLIGHT, "refuse"): TaskPhase.REFUSED,
    (TaskPhase.IN_FLIGHT, "cancel"): TaskPhase.CANCELLED,
    (TaskPhase.IN_FLIGHT, "fail"): TaskPhase.FAILED,
}


@dataclass
class SentTask:
    """One task: its id, its client, its base version, when it was sent, the client's how-many-th task on that base
    (0 for the first: the batch order's seed derives from it), and its phase."""

    task_id: int
    index: int
    base: int
    sent_at: float
    attempt: int = 0
    phase: TaskPhase = TaskPhase.IN_FLIGHT

    def move(self, event: str) -> None:
        self.phase = next_state(TASK_TRANSITIONS, self.phase, event, f"task {self.task_id}")


@dataclass(frozen=True)
class Arrival:
    """An accepted update's place in the buffer: its task, client, staleness and the two factors its fold takes
    (``protocol.payload.ClientUpdate``'s ``discount`` and ``counted``)."""

    task_id: int
    index: int
    staleness: int
    discount: float
    counted: float


@dataclass(frozen=True)
class Refusal:
    task_id: int
    index: int
    reason: str


@dataclass(frozen=True)
class Flush:
    """A closed version: its number (the version it makes), the arrivals folded into it, and the tasks in flight it
    cancels (their bases are now more than max_staleness behind)."""

    version: int
    arrivals: tuple[Arrival, ...]
    cancelled: tuple[SentTask, ...]

    def staleness(self) -> dict[str, float]:
        """The flush's staleness figures for metrics.jsonl."""
        values = sorted(a.staleness for a in self.arrivals)
        if not values:
            return {"staleness_mean": 0.0, "staleness_max": 0}
        return {"staleness_mean": sum(values) / len(values), "staleness_max": values[-1]}


@dataclass
class AsyncRounds:
    """The asynchronous session's state: see the module docstring."""

    settings: AsyncSettings
    version: int = 0
    next_id: int = 1
    in_flight: dict[int, SentTask] = field(default_factory=dict)
    buffered: list[Arrival] = field(default_factory=list)
    attempts: dict[tuple[int, int], int] = field(default_factory=dict)  # (client, base) -> tasks sent on that base

    def busy(self) -> set[int]:
        """The clients holding a task."""
        return {task.index for task in self.in_flight.values()}

    def room(self) -> int:
        """How many more tasks may be sent now (see the module docstring, "Dispatch")."""
        s = self.settings
        reach = s.buffer * (s.max_staleness + 1) - len(self.in_flight) - len(self.buffered)
        return max(0, min(s.concurrency - len(self.in_flight), reach))

    def dispatch(self, index: int, now: float) -> SentTask:
        """Send client ``index`` a task on the current version."""
        if self.room() < 1:
            raise RuntimeError("no room for another task (concurrency, or updates that could only be refused)")
        if index in self.busy():
            raise RuntimeError(f"client {index} already holds a task")
        key = (index, self.version)
        attempt = self.attempts.get(key, 0)
        self.attempts[key] = attempt + 1
        task = SentTask(self.next_id, index, self.version, now, attempt)
        self.next_id += 1
        self.in_flight[task.task_id] = task
        return task

    def arrive(self, task_id: int, index: int) -> Arrival | Refusal:
        """An update of task ``task_id`` from client ``index``: buffered with its factors, or refused with a reason
        (a task that is not in flight, another client's task, or one staler than allowed). A version takes exactly
        ``buffer`` updates: the driver flushes it before it hands over the next."""
        if self.flush_due:
            raise RuntimeError(f"version {self.version + 1} has its {self.settings.buffer} updates: flush it first")
        task = self.in_flight.get(task_id)
        if task is None:
            return Refusal(task_id, index, f"task {task_id} is not in flight (never sent, already answered, or "
                                           "cancelled)")
        if task.index != index:
            return Refusal(task_id, index, f"task {task_id} was sent to client {task.index}, not to client {index}")
        del self.in_flight[task_id]
        staleness = self.version - task.base
        if staleness > self.settings.max_staleness:
            task.move("refuse")
            return Refusal(task_id, index, f"the update of task {task_id} is {staleness} versions stale (base "
                                           f"{task.base}, now {self.version}); asynchronous.max_staleness is "
                                           f"{self.settings.max_staleness}")
        task.move("accept")
        discount = staleness_weight(staleness, self.settings.staleness)
        counted = 1.0 if self.settings.normalize == "count" else discount
        arrival = Arrival(task_id, index, staleness, discount, counted)
        self.buffered.append(arrival)
        return arrival

    def fail(self, task_id: int) -> SentTask | None:
        """The task's device failed or left: it is no longer in flight (None when it was not)."""
        task = self.in_flight.pop(task_id, None)
        if task is not None:
            task.move("fail")
        return task

    @property
    def flush_due(self) -> bool:
        return len(self.buffered) >= self.settings.buffer

    def flush(self) -> Flush:
        """Close the current version over the buffered arrivals: the next version begins, and the tasks in flight
        whose bases are now more than max_staleness behind are cancelled."""
        if not self.buffered:
            raise RuntimeError("nothing to flush")
        self.version += 1
        arrivals, self.buffered = tuple(self.buffered), []
        oldest = self.version - self.settings.max_staleness
        cancelled = tuple(task for task in self.in_flight.values() if task.base < oldest)
        for task in cancelled:
            del self.in_flight[task.task_id]
            task.move("cancel")
        self.attempts = {key: n for key, n in self.attempts.items() if key[1] >= oldest}
        return Flush(self.version, arrivals, cancelled)

    # ------------------------------------------------------------------------------------------ checkpoint
    def state(self) -> dict[str, Any]:
        return {"version": self.version, "next_id": self.next_id,
                "in_flight": [[t.task_id, t.index, t.base, t.sent_at, t.attempt] for t in self.in_flight.values()],
                "buffered": [[a.task_id, a.index, a.staleness, a.discount, a.counted] for a in self.buffered],
                "attempts": [[i, b, n] for (i, b), n in self.attempts.items()]}

    @classmethod
    def restored(cls, settings: AsyncSettings, state: dict[str, Any]) -> AsyncRounds:
        rounds = cls(settings, int(state["version"]), int(state["next_id"]))
        for task_id, index, base, sent_at, attempt in state["in_flight"]:
            rounds.in_flight[int(task_id)] = SentTask(int(task_id), int(index), int(base), float(sent_at),
                                                      int(attempt))
        rounds.buffered = [Arrival(int(t), int(i), int(s), float(d), float(c)) for t, i, s, d, c in state["buffered"]]
        rounds.attempts = {(int(i), int(b)): int(n) for i, b, n in state["attempts"]}
        return rounds
