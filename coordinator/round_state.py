"""What the coordinator's protocol object hands its driver, and what it keeps of the round in progress.

The events (``Send``, ``SendFrame``, ``Rejected``, ``Noted``) are what to send and what to log; ``RoundState`` is
one round: who was selected, the tasks and masks sent, the updates that arrived and were validated, who failed or
declined, the bytes each way, the round's target. Plain data: no I/O, no algorithms.
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

    def awaited(self) -> list[int]:
        return [i for i in self.selected if i not in self.updates and i not in self.failed and
                i not in self.unavailable]
