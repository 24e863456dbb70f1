"""What the coordinator's protocol object hands its driver, and what it keeps of the round in progress.

The events (``Send``, ``SendFrame``, ``Rejected``, ``Noted``) are what to send and what to log; ``RoundState`` is
one round: who was selected, the tasks and masks sent, the updates that arrived and were validated, who failed or
declined (each through ``accept``, ``fail`` or ``decline``, which keep the set of clients still awaited, so that
every per-agent check takes constant time), the bytes each way, the round's target. Plain data: no I/O, no
algorithms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedge import codec

SENDER = "coordinator"


@dataclass(frozen=True)
class Send:
    """Send ``message`` to ``peer``; ``task_of``: a task of the current round for that client (count its bytes)."""

    peer: bytes
    message: codec.Message
    task_of: int | None = None


@dataclass(frozen=True)
class Rejected:
    """A message was refused (the answer, if any, is a separate ``Send``)."""

    peer: bytes
    code: str
    reason: str


@dataclass(frozen=True)
class Noted:
    """Something the driver should log."""

    level: int
    text: str


@dataclass(frozen=True)
class SendFrame:
    """Send bytes already encoded (an answer in an older wire format) to ``peer``."""

    peer: bytes
    frame: bytes


Event = Send | SendFrame | Rejected | Noted


@dataclass
class RoundState:
    number: int
    selected: list[int]
    started: float
    deadline: float
    bytes_down: dict[int, int] = field(default_factory=dict)
    masks: dict[int, set[int]] = field(default_factory=dict)
    updates: dict[int, tuple[codec.Update, int]] = field(default_factory=dict)
    failed: set[int] = field(default_factory=set)
    tasks_sent: set[int] = field(default_factory=set)
    unavailable: dict[int, str] = field(default_factory=dict)  # declined by their availability rules: why
    body_up: dict[int, int] = field(default_factory=dict)  # the accepted updates' tensor sections (bodies), bytes
    target: int = 0  # close once this many updates arrived (0: wait for every selected client)
    chosen: set[int] = field(init=False)   # ``selected`` as a set
    pending: set[int] = field(init=False)  # selected, and no update, failure or unavailability of it yet

    def __post_init__(self) -> None:
        self.chosen, self.pending = set(self.selected), set(self.selected)

    def awaited(self) -> list[int]:
        """The selected clients that neither sent an update nor failed nor declined, in index order."""
        return sorted(self.pending)

    def accept(self, index: int, update: codec.Update, size: int) -> None:
        self.updates[index] = (update, size)
        self.failed.discard(index)
        self.unavailable.pop(index, None)
        self.pending.discard(index)

    def fail(self, index: int) -> None:
        self.failed.add(index)
        self.pending.discard(index)

    def decline(self, index: int, reason: str) -> None:
        self.unavailable[index] = reason
        self.pending.discard(index)
