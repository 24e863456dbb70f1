"""The coordinator's round as named states: the round's phase (``RoundPhase``) and each selected client's outcome
(``ClientOutcome``), each with its transition table, and ``RoundState``, what the protocol keeps of the round in
progress.

    RoundPhase            event          next
    NONE, COMMITTED       open           OPEN
    OPEN                  close          CLOSED      (awaiting its checkpoint)
    OPEN                  abandon        NONE        (the session stops mid-round)
    CLOSED                abandon        NONE        (it stops while a secure round unmasks its sum)
    CLOSED                commit         COMMITTED

    ClientOutcome         event          next
    TASKED                update         UPDATED
    TASKED                fail           FAILED      (its report, its bye, its refusal of the session)
    TASKED                decline        DECLINED    (its availability rules)
    FAILED, DECLINED      update         UPDATED     (it said hello again, was tasked again and delivered)
    TASKED                close          CANCELLED   (the round closed without its update)
    TASKED                refuse         REFUSED     (its update was refused: at decoding or checking)
    UPDATED               refuse         REFUSED     (its accepted update was refused by the round's fold)

A transition not in its table is a bug of the caller: ``protocol.states.Transition`` (a RuntimeError) names it. ``RoundState``
keeps, beside the outcomes, who was selected, the tasks and masks sent, the accepted updates (typed fields and
size only: the tensors were folded), the refused ones' reasons, the bytes each way and the round's target; the set
of clients still awaited (TASKED) is kept in step, so every per-agent check takes constant time. Plain data: no I/O, no algorithms, no
clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from fedge import codec
from fedge.protocol.states import next_state


class RoundPhase(enum.Enum):
    NONE = "none"            # no round since the session started (or since one was abandoned)
    OPEN = "open"            # tasks sent, updates arriving
    CLOSED = "closed"        # closed, its checkpoint not yet written
    COMMITTED = "committed"  # checkpointed: the last committed round


ROUND_TRANSITIONS: dict[tuple[RoundPhase, str], RoundPhase] = {
    (RoundPhase.NONE, "open"): RoundPhase.OPEN,
    (RoundPhase.COMMITTED, "open"): RoundPhase.OPEN,
    (RoundPhase.OPEN, "close"): RoundPhase.CLOSED,
    (RoundPhase.OPEN, "abandon"): RoundPhase.NONE,
    (RoundPhase.CLOSED, "abandon"): RoundPhase.NONE,
    (RoundPhase.CLOSED, "commit"): RoundPhase.COMMITTED,
}


class ClientOutcome(enum.Enum):
    TASKED = "tasked"
    UPDATED = "updated"
    FAILED = "failed"
    DECLINED = "declined"
    CANCELLED = "cancelled"
    REFUSED = "refused"


OUTCOME_TRANSITIONS: dict[tuple[ClientOutcome, str], ClientOutcome] = {
    (ClientOutcome.TASKED, "update"): ClientOutcome.UPDATED,
    (ClientOutcome.TASKED, "fail"): ClientOutcome.FAILED,
    (ClientOutcome.TASKED, "decline"): ClientOutcome.DECLINED,
    (ClientOutcome.FAILED, "update"): ClientOutcome.UPDATED,
    (ClientOutcome.DECLINED, "update"): ClientOutcome.UPDATED,
    (ClientOutcome.TASKED, "close"): ClientOutcome.CANCELLED,
    (ClientOutcome.TASKED, "refuse"): ClientOutcome.REFUSED,
    (ClientOutcome.UPDATED, "refuse"): ClientOutcome.REFUSED,
}


def next_phase(phase: RoundPhase, event: str) -> RoundPhase:
    return next_state(ROUND_TRANSITIONS, phase, event, "a round")


@dataclass
class RoundState:
    number: int
    selected: list[int]
    started: float
    deadline: float
    bytes_down: dict[int, int] = field(default_factory=dict)
    masks: dict[int, set[int]] = field(default_factory=dict)
    updates: dict[int, tuple[codec.Update, int]] = field(default_factory=dict)
    tasks_sent: set[int] = field(default_factory=set)
    unavailable: dict[int, str] = field(default_factory=dict)  # DECLINED by their availability rules: why
    body_up: dict[int, int] = field(default_factory=dict)  # the accepted updates' tensor sections (bodies), bytes
    refused: dict[int, str] = field(default_factory=dict)  # REFUSED: why (its update is no longer in ``updates``)
    target: int = 0  # close once this many updates arrived (0: wait for every selected client)
    outcomes: dict[int, ClientOutcome] = field(init=False)  # every selected client's
    chosen: set[int] = field(init=False)   # ``selected`` as a set
    pending: set[int] = field(init=False)  # the TASKED ones

    def __post_init__(self) -> None:
        self.outcomes = {index: ClientOutcome.TASKED for index in self.selected}
        self.chosen, self.pending = set(self.selected), set(self.selected)

    @property
    def failed(self) -> set[int]:
        return {i for i, outcome in self.outcomes.items() if outcome is ClientOutcome.FAILED}

    def awaited(self) -> list[int]:
        """The selected clients still TASKED (no update, failure or decline), in index order."""
        return sorted(self.pending)

    def move(self, index: int, event: str) -> None:
        """Client ``index``'s outcome after ``event``, by the table."""
        outcome = self.outcomes[index]
        self.outcomes[index] = next_state(OUTCOME_TRANSITIONS, outcome, event, f"client {index} in round {self.number}")
        if outcome is ClientOutcome.TASKED:
            self.pending.discard(index)
        if outcome is ClientOutcome.DECLINED:
            self.unavailable.pop(index, None)

    def accept(self, index: int, update: codec.Update, size: int) -> None:
        self.move(index, "update")
        self.updates[index] = (update, size)

    def fail(self, index: int) -> None:
        """A TASKED client failed (a later report of one that has an outcome changes nothing)."""
        if self.outcomes[index] is ClientOutcome.TASKED:
            self.move(index, "fail")

    def decline(self, index: int, reason: str) -> None:
        """A TASKED client may not train now (a later report of one that has an outcome changes nothing)."""
        if self.outcomes[index] is ClientOutcome.TASKED:
            self.move(index, "decline")
            self.unavailable[index] = reason

    def refuse(self, index: int, reason: str) -> None:
        """Client ``index``'s update was refused (TASKED: at decoding or checking; UPDATED: by the round's fold): its
        part in the round ends, and no update of it is aggregated or committed."""
        self.move(index, "refuse")
        self.updates.pop(index, None)
        self.body_up.pop(index, None)
        self.refused[index] = reason

    def close(self) -> list[int]:
        """The clients still TASKED are CANCELLED; returns them, in index order."""
        cancelled = self.awaited()
        for index in cancelled:
            self.move(index, "close")
        return cancelled
