"""The agent's side of the round protocol, with no I/O: frames and the current time in, actions out.

``AgentProtocol`` decides what a message from the coordinator means for this device: a welcome to join (or to
ignore, when it welcomes us back), a task to train (unless the agent already holds one), a cancel that stops it, a
commit to confirm, a bye that ends the session (code ``finished``) or means "wait, I will be back", an error to
answer with a hello; when the finished update goes out (at once, or, for a paced task, when its grant comes); and,
from the clock, when to say hello (nothing heard for longer than the liveness) and when to send a heartbeat. A session-level refusal (the
coordinator's protocol or model mismatch or full session, or this device declining the session's plugin or model)
does not stop the agent: it says hello again with exponential backoff, capped at 15 minutes, so that a fixed
coordinator, a new session or a rolling upgrade recovers the fleet with no operator. A malformed
packet changes nothing: it is logged, a packet of an older wire format is answered by backing off (the coordinator
must be upgraded), a welcome whose settings do not decode is declined (``bad-welcome``), and a task whose body does
not decode is reported as a failed round, so the coordinator stops waiting for it. The driver
(``edge_agent.agent``) owns the socket, the training thread, the device state and the meter, and carries out the
actions. No sockets, threads or clocks here; no algorithm by name.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fedge import codec
from fedge.codec import vocabulary as words

MAX_BACKOFF_S = 900.0

# What a client's Hello says it decodes (every client here decodes every encoding the codec writes).
# What this side of the protocol takes beyond the wire format's minimum (``words.TASK_PARTS``: a Task in two frames).
CAPABILITIES = ("sparse-mask", "sparse-values", "sparse-indices", "f16", "bf16", "int8", words.TASK_PARTS)


@dataclass(frozen=True)
class Send:
    message: codec.Message


@dataclass(frozen=True)
class SendFrame:
    """Send the round's encoded update (``round``)."""

    round: int
    frame: bytes


@dataclass(frozen=True)
class SayHello:
    """Send a hello (the driver fills in what this device is)."""


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
class Left:
    """The session finished and the agent stays up for the next one: forget the session (the protocol has)."""

    run_id: str


@dataclass(frozen=True)
class Stop:
    exit_code: int
    reason: str


@dataclass(frozen=True)
class Noted:
    level: int
    text: str


Action = Send | SendFrame | SayHello | Join | Train | CancelTraining | Confirm | Left | Stop | Noted


class AgentProtocol:
    """This device's view of the session; see the module docstring."""

    def __init__(self, client_id: str, hello_interval_s: float, stay: bool = True) -> None:
        self.client_id = client_id
        self.stay = stay                 # after a finished session: wait for the next one (or stop)
        self.hello_interval_s = hello_interval_s
        self.run_id = ""
        self.index: int | None = None
        self.heartbeat_s = 0.0
        self.liveness_s = 0.0
        self.last_heard = 0.0
        self.last_hello = -1e18
        self.last_heartbeat = -1e18
        self.holding: int | None = None  # the round of the task being trained (or whose outcome is unsent)
        self.paced = False               # the held task's update waits for a grant
        self.held: bytes | None = None   # the finished update of a paced task, until its grant
        self.refusals = 0                # session-level refusals in a row
        self.hello_after = -1e18         # no hello before this time (backoff)
        self.refused = ""                # why the last session-level refusal happened, until a session is joined
        self.declined = ""               # the last task declined by the availability rules, until the next one

    # ------------------------------------------------------------------------------------------ receiving
    def receive(self, frame: bytes, now: float) -> list[Action]:
        try:
            message = codec.decode(frame)
        except codec.UnsupportedVersion as exc:
            why = f"the coordinator speaks wire-format version {exc.version}, this agent {codec.PROTOCOL_VERSION}: " \
                  "upgrade the coordinator"
            return [Noted(logging.ERROR, why), *self.back_off(now, f"refused: {why}")]
        except codec.CodecError as exc:
            return self.on_malformed(frame, exc, now)
        self.last_heard = now
        if isinstance(message, codec.Welcome):
            return self.on_welcome(message)
        if isinstance(message, codec.Task):
            return self.on_task(message)
        if isinstance(message, codec.Cancel):
            return self.on_cancel(message)
        if isinstance(message, codec.Grant):
            return self.on_grant(message)
        if isinstance(message, codec.Commit):
            if self.joined_run(message.run_id):
                return [Confirm(message.round)]
            return [Noted(logging.WARNING, f"ignored a commit of run {message.run_id!r} (we are in "
                                           f"{self.run_id or 'none'})")]
        if isinstance(message, codec.Bye):
            if message.code == words.BYE_FINISHED:
                if not self.stay:
                    return [Noted(logging.INFO, f"coordinator says goodbye: {message.reason}"),
                            Stop(0, message.reason)]
                finished = self.run_id
                dropped = self.drop_held_round()
                self.run_id, self.index = "", None
                self.refusals, self.refused = 0, ""
                self.hello_after = now + self.hello_interval_s  # not to the coordinator that is just closing
                return [Noted(logging.INFO, f"coordinator says goodbye: {message.reason}; waiting for the next "
                                            "session"), *dropped, Left(finished)]
            self.last_heard = 0.0  # say hello again as soon as the interval allows
            return [Noted(logging.WARNING, f"coordinator says goodbye: {message.reason}; waiting for it to come "
                                           "back")]
        if isinstance(message, codec.ErrorMessage):
            actions: list[Action] = [Noted(logging.WARNING, f"coordinator: {message.code}: {message.reason}")]
            if message.code == words.HELLO_FIRST:
                actions.append(SayHello())
            elif message.code in words.SESSION_REFUSALS:
                actions += self.back_off(now, f"refused: {message.code}: {message.reason}")
            return actions
        if isinstance(message, codec.Heartbeat):
            return []
        return [Noted(logging.WARNING, f"ignored a {type(message).__name__} from the coordinator")]

    def on_malformed(self, frame: bytes, error: codec.CodecError, now: float) -> list[Action]:
        """A packet that does not decode: a welcome is declined, a task of our run reported as a failed round (its
        header still names the round), anything else dropped; each with one line."""
        noted = Noted(logging.WARNING, f"dropped a malformed packet from the coordinator: {error}")
        if codec.packet_kind(frame) is codec.Welcome:
            return self.refuse(words.BAD_WELCOME, f"the welcome does not decode: {error}", now)
        try:
            header = codec.read_header(frame)
        except codec.CodecError:
            return [noted]
        if header.cls is codec.Task and self.joined_run(header.run_id) and self.holding is None:
            return [noted, Send(codec.ErrorMessage(run_id=self.run_id, round=header.round, sender=self.client_id,
                                                   code=words.ROUND_FAILED,
                                                   reason=f"the task does not decode: {error}"))]
        return [noted]

    def on_welcome(self, welcome: codec.Welcome) -> list[Action]:
        if self.index is not None and welcome.run_id == self.run_id and welcome.client_index == self.index:
            return [Noted(logging.INFO, f"coordinator welcomed us back (run {self.run_id}, round {welcome.round})")]
        return [*self.drop_held_round(), Join(welcome)]  # another session: a round of the old one is not finished

    def refuse(self, code: str, reason: str, now: float) -> list[Action]:
        """Decline the session: tell the coordinator (it frees our index), and say hello again later."""
        return [Noted(logging.ERROR, f"{code}: {reason}"),
                Send(codec.ErrorMessage(run_id="", round=0, sender=self.client_id, code=code, reason=reason)),
                *self.back_off(now, f"declined: {code}: {reason}")]

    def back_off(self, now: float, why: str = "") -> list[Action]:
        """Leave the session (if any; a round in training is stopped) and wait before the next hello: the hello
        interval doubled per refusal in a row, at most MAX_BACKOFF_S."""
        self.refusals += 1
        self.refused = why or self.refused
        delay = min(MAX_BACKOFF_S, self.hello_interval_s * 2 ** (self.refusals - 1))
        self.hello_after = now + delay
        actions: list[Action] = [Noted(logging.WARNING, f"refused by or refusing the session ({self.refusals} in a "
                                                        f"row): saying hello again in {delay:.0f} s")]
        actions += self.drop_held_round()
        self.run_id, self.index = "", None
        return actions

    def drop_held_round(self) -> list[Action]:
        """Stop holding the current round: its training is cancelled (a finished update waiting for its grant is
        dropped); whatever it produces later is not sent."""
        training = self.holding is not None and self.held is None
        round_number = self.holding
        self.holding, self.held = None, None
        return [CancelTraining(round_number)] if training and round_number is not None else []

    def joined(self, run_id: str, index: int, heartbeat_s: float, liveness_s: float) -> None:
        self.run_id, self.index, self.heartbeat_s, self.liveness_s = run_id, index, heartbeat_s, liveness_s
        self.refusals, self.refused = 0, ""

    def joined_run(self, run_id: str) -> bool:
        return self.index is not None and run_id == self.run_id

    def on_task(self, task: codec.Task) -> list[Action]:
        if not self.joined_run(task.run_id):
            return [Noted(logging.WARNING, f"ignoring a task of run {task.run_id} (we are in "
                                           f"{self.run_id or 'none'})")]
        if self.holding is not None:
            level = logging.INFO if task.round == self.holding else logging.WARNING  # a resend of ours is benign
            return [Noted(level, f"ignoring the task of round {task.round}: still holding round {self.holding}")]
        self.holding, self.paced, self.held, self.declined = task.round, task.paced, None, ""
        return [Train(task)]

    def decline_task(self, round_number: int, reason: str) -> list[Action]:
        """This device may not train now (its availability rules): the coordinator is told, nothing is trained, and
        the agent holds no task."""
        if self.holding == round_number:
            self.holding, self.held = None, None
        self.declined = f"declined round {round_number}: {reason}"
        return [Noted(logging.INFO, f"not available for round {round_number}: {reason}"),
                Send(codec.ErrorMessage(run_id=self.run_id, round=round_number, sender=self.client_id,
                                        code=words.UNAVAILABLE, reason=reason))]

    def on_cancel(self, cancel: codec.Cancel) -> list[Action]:
        if not self.joined_run(cancel.run_id) or cancel.round != self.holding:
            return [Noted(logging.INFO, f"ignored a cancel of round {cancel.round} (holding "
                                        f"{self.holding if self.holding is not None else 'none'})")]
        # The agent holds the round no more at once: the next task is trained as soon as the stopped one has ended
        # (the driver waits for its worker), and whatever the stopped one produces is not sent.
        return [Noted(logging.INFO, f"round {cancel.round} cancelled: {cancel.reason}"), *self.drop_held_round()]

    def on_grant(self, grant: codec.Grant) -> list[Action]:
        if not self.joined_run(grant.run_id) or self.held is None or grant.round != self.holding:
            return [Noted(logging.INFO, f"ignored a grant for round {grant.round} (no update of it is waiting)")]
        frame, self.held, self.holding = self.held, None, None
        return [SendFrame(grant.round, frame)]

    # ------------------------------------------------------------------------------------------ the clock
    def finished(self, round_number: int, frame: bytes | None, error: str = "") -> list[Action]:
        """Training ended: the failure to report, or the update to send now (or, for a paced task, to hold until
        its grant, saying so in a heartbeat at once)."""
        if self.holding != round_number:  # cancelled, or the session was left meanwhile
            return [Noted(logging.INFO, f"round {round_number} ended after it was cancelled; nothing is sent")]
        if frame is None:
            self.holding = None
            return [Send(codec.ErrorMessage(run_id=self.run_id, round=round_number, sender=self.client_id,
                                            code=words.ROUND_FAILED, reason=error))]
        if self.paced:
            self.held = frame
            return [Send(self.heartbeat())]
        self.holding = None
        return [SendFrame(round_number, frame)]

    def abandoned(self) -> None:
        """Training stopped without an outcome (cancelled, or the agent is stopping): it holds no task any more."""
        self.holding, self.held = None, None

    def heartbeat(self, steps: int = 0) -> codec.Heartbeat:
        return codec.Heartbeat(run_id=self.run_id, round=self.holding or 0, sender=self.client_id, steps=steps,
                               ready=self.held is not None)

    def tick(self, now: float, steps: int = 0) -> list[Action]:
        """What the clock asks for; ``steps``: training steps taken in the held round (for the heartbeat)."""
        actions: list[Action] = []
        heard_recently = self.index is not None and now - self.last_heard < self.liveness_s
        if not heard_recently and now - self.last_hello >= self.hello_interval_s and now >= self.hello_after:
            if self.index is not None and self.last_heard:
                actions.append(Noted(logging.WARNING, f"nothing heard from the coordinator for "
                                                      f"{now - self.last_heard:.0f} s; saying hello again"))
            actions.append(self.hello_now(now))
        if self.index is not None and now - self.last_heartbeat >= self.heartbeat_s:
            self.last_heartbeat = now
            actions.append(Send(self.heartbeat(steps)))
        return actions

    def status(self, training: bool) -> str:
        """The one-line state an operator sees (``systemctl status``): waiting, refused or declined and why, idle in
        a session, training a round, or holding an update for its grant."""
        if self.index is None:
            return f"{self.refused}; saying hello again with backoff" if self.refused else \
                "waiting for a session"
        if self.held is not None:
            return f"round {self.holding} trained; its update waits for a grant (run {self.run_id})"
        if self.holding is not None and training:
            return f"training round {self.holding} as client {self.index} of run {self.run_id}"
        return f"idle: client {self.index} of run {self.run_id}" + (f" ({self.declined})" if self.declined else "")

    def hello_now(self, now: float) -> SayHello:
        self.last_hello = now
        return SayHello()

    def holds(self) -> tuple[str, int] | None:
        """The Hello's claim to the task this agent holds: (run id, round), or None."""
        if self.holding is None or self.index is None:
            return None
        return (self.run_id, self.holding)

    def leaving(self) -> list[Action]:
        if self.index is None:
            return []
        return [Send(codec.Bye(run_id=self.run_id, round=self.holding or 0, sender=self.client_id,
                               code=words.BYE_STOPPING, reason="agent stopping"))]
