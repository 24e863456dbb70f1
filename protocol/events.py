"""The one set of events and actions the round protocol's two objects hand their drivers.

What to send (``Send``, ``SendFrame``) and what to log (``Noted``) are shared; the coordinator's object adds a
refusal (``Rejected``), an accepted update to fold (``Accepted``) and the checkpoint a round's commits wait for
(``Checkpoint``); the agent's adds what its driver must do (``Join``, ``Train``, ``CancelTraining``, ``Confirm``,
``Left``, ``Stop``, ``Reconnect``). ``CoordinatorEvent`` and ``AgentAction`` are the unions each driver's one ``match`` covers
(with ``fedge.exhaustive.assert_never`` as its last case). ``Outcome`` is a finished training as a driver reports
it back. Plain data: no I/O, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedge import codec
from fedge.protocol.payload import ClientUpdate

COORDINATOR = "coordinator"  # the sender name of every message the coordinator sends


@dataclass(frozen=True)
class Send:
    """Send ``message``: on the coordinator's side to ``peer`` (an agent has one peer); ``task_of``: a task of the
    current round for that client (its bytes are counted)."""

    message: codec.Message
    peer: bytes = b""
    task_of: int | None = None


@dataclass(frozen=True)
class SendFrame:
    """Send bytes already encoded: an agent's finished update of ``round``, or the coordinator's answer to
    ``peer`` in an older wire format."""

    frame: bytes
    peer: bytes = b""
    round: int = 0


@dataclass(frozen=True)
class Noted:
    """Something the driver should log."""

    level: int
    text: str


@dataclass(frozen=True)
class Rejected:
    """A message was refused (the answer, if any, is a separate ``Send``)."""

    peer: bytes
    code: str
    reason: str


@dataclass(frozen=True)
class Accepted:
    """An update of round ``round`` passed every check: the driver folds it into the round's aggregation at once
    (``protocol.server_half.Aggregation``); the round keeps only its typed fields and size."""

    round: int
    update: ClientUpdate


@dataclass(frozen=True)
class Checkpoint:
    """Checkpoint the session now, with round ``round`` as its last committed round; the Commits that follow in the
    same list go out only after it is written."""

    round: int


@dataclass(frozen=True)
class Join:
    """Build the session the welcome describes (``client.joining``), then call ``AgentProtocol.joined``."""

    welcome: codec.Welcome


@dataclass(frozen=True)
class Train:
    task: codec.Task


@dataclass(frozen=True)
class CancelTraining:
    """Stop the training of ``round`` at its next step; it ends with no outcome."""

    round: int


@dataclass(frozen=True)
class Confirm:
    """Promote the pending device state of this round (it was checkpointed with our update in it)."""

    round: int


@dataclass(frozen=True)
class Masked:
    """Write durably, before the action that follows (its masked update), that this device masked an input of
    ``round`` of run ``run_id``: it never masks another of that round (``protocol.agent``'s restart rule)."""

    run_id: str
    round: int


@dataclass(frozen=True)
class Left:
    """The session finished and the agent stays up for the next one: forget the session (the protocol has)."""

    run_id: str


@dataclass(frozen=True)
class Stop:
    exit_code: int
    reason: str


@dataclass(frozen=True)
class Reconnect:
    """Nothing heard from the coordinator for the session's liveness: the connection may have died without either
    side knowing, so close the socket and open a new one (the new connection's handshake is followed by a hello)."""


@dataclass(frozen=True)
class Outcome:
    """A finished training of ``round``: the Update packet, or None and the one-line reason it failed
    (``client_id``: whose, where one driver trains for several clients)."""

    round: int
    frame: bytes | None
    error: str = ""
    client_id: str = ""


CoordinatorEvent = Send | SendFrame | Noted | Rejected | Accepted | Checkpoint
AgentAction = Send | SendFrame | Noted | Join | Train | CancelTraining | Confirm | Masked | Left | Stop | Reconnect
