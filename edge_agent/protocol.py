"""The agent's side of the round protocol, with no I/O: frames and the current time in, actions out.

``AgentProtocol`` decides what a message from the coordinator means for this device: a welcome to join (or to
ignore, when it welcomes us back), a task to train (unless the agent already holds one), a commit to confirm, a bye
that ends the session or means "wait, I will be back", an error to answer with a hello; and, from the clock, when to
say hello (nothing heard for longer than the liveness) and when to send a heartbeat. A session-level refusal (the
coordinator's protocol or model mismatch or full session, or this device declining the session's plugin or model)
does not stop the agent: it says hello again with exponential backoff, capped at 15 minutes, so that a fixed
coordinator, a new session or a rolling upgrade recovers the fleet with no operator. A malformed
packet, or a welcome that lacks what a session needs, is refused with a reason and changes nothing. The driver
(``edge_agent.agent``) owns the socket, the training thread, the device state and the meter, and carries out the
actions. No sockets, threads or clocks here; no algorithm by name.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from fedge import codec

WELCOME_KEYS = ("run_id", "client_index", "seed", "model", "model_hash", "algorithm", "train", "heartbeat_s",
                "liveness_s")
BACK_OFF_ON = ("protocol-mismatch", "model-mismatch", "session-full")  # session-level refusals by the coordinator
MAX_BACKOFF_S = 900.0


@dataclass(frozen=True)
class Send:
    message: codec.Message


@dataclass(frozen=True)
class SayHello:
    """Send a hello (the driver fills in what this device is)."""


@dataclass(frozen=True)
class Join:
    """Build the session the welcome describes (``edge_agent.joining``), then call ``AgentProtocol.joined``."""

    meta: dict[str, Any]


@dataclass(frozen=True)
class Train:
    task: codec.Task


@dataclass(frozen=True)
class Confirm:
    """Promote the pending device state of this round (it was checkpointed with our update in it)."""

    round: int


@dataclass(frozen=True)
class Stop:
    exit_code: int
    reason: str


@dataclass(frozen=True)
class Noted:
    level: int
    text: str


Action = Send | SayHello | Join | Train | Confirm | Stop | Noted


class AgentProtocol:
    """This device's view of the session; see the module docstring."""

    def __init__(self, client_id: str, hello_interval_s: float) -> None:
        self.client_id = client_id
        self.hello_interval_s = hello_interval_s
        self.run_id = ""
        self.index: int | None = None
        self.heartbeat_s = 0.0
        self.liveness_s = 0.0
        self.last_heard = 0.0
        self.last_hello = -1e18
        self.last_heartbeat = -1e18
        self.holding: int | None = None  # the round of the task being trained (or whose outcome is unsent)
        self.refusals = 0                # session-level refusals in a row
        self.hello_after = -1e18         # no hello before this time (backoff)

    # ------------------------------------------------------------------------------------------ receiving
    def receive(self, frame: bytes, now: float) -> list[Action]:
        try:
            message = codec.decode(frame)
        except codec.CodecError as exc:
            return [Noted(logging.WARNING, f"dropped a malformed packet from the coordinator: {exc}")]
        self.last_heard = now
        if isinstance(message, codec.Welcome):
            return self.on_welcome(message, now)
        if isinstance(message, codec.Task):
            return self.on_task(message)
        if isinstance(message, codec.Commit):
            if self.joined_run(message.run_id):
                return [Confirm(message.round)]
            return [Noted(logging.WARNING, f"ignored a commit of run {message.run_id!r} (we are in "
                                           f"{self.run_id or 'none'})")]
        if isinstance(message, codec.Bye):
            if message.reason.startswith(codec.SESSION_FINISHED):
                return [Noted(logging.INFO, f"coordinator says goodbye: {message.reason}"),
                        Stop(0, message.reason)]
            self.last_heard = 0.0  # say hello again as soon as the interval allows
            return [Noted(logging.WARNING, f"coordinator says goodbye: {message.reason}; waiting for it to come "
                                           "back")]
        if isinstance(message, codec.ErrorMessage):
            actions: list[Action] = [Noted(logging.WARNING, f"coordinator: {message.code}: {message.reason}")]
            if message.code == "hello-first":
                actions.append(SayHello())
            elif message.code in BACK_OFF_ON:
                actions.append(self.back_off(now))
            return actions
        if isinstance(message, codec.Heartbeat):
            return []
        return [Noted(logging.WARNING, f"ignored a {type(message).__name__} from the coordinator")]

    def on_welcome(self, welcome: codec.Welcome, now: float) -> list[Action]:
        meta = dict(welcome.meta)
        if self.index is not None and meta.get("run_id") == self.run_id and meta.get("client_index") == self.index:
            return [Noted(logging.INFO, f"coordinator welcomed us back (run {self.run_id}, round {welcome.round})")]
        missing = [key for key in WELCOME_KEYS if key not in meta]
        if missing:
            return self.refuse("bad-welcome", f"the welcome lacks {', '.join(missing)}", now)
        if not isinstance(meta["model"], dict) or not isinstance(meta["train"], dict) or \
                not isinstance(meta["algorithm"], dict) or "name" not in meta["algorithm"]:
            return self.refuse("bad-welcome", "the welcome's model, train and algorithm must be maps (the "
                                              "algorithm with a name)", now)
        return [Join(meta)]

    def refuse(self, code: str, reason: str, now: float) -> list[Action]:
        """Decline the session: tell the coordinator (it frees our index), and say hello again later."""
        return [Noted(logging.ERROR, f"{code}: {reason}"),
                Send(codec.ErrorMessage(run_id="", round=0, sender=self.client_id, code=code, reason=reason)),
                self.back_off(now)]

    def back_off(self, now: float) -> Noted:
        """Leave the session (if any) and wait before the next hello: the hello interval doubled per refusal in a
        row, at most MAX_BACKOFF_S."""
        self.refusals += 1
        delay = min(MAX_BACKOFF_S, self.hello_interval_s * 2 ** (self.refusals - 1))
        self.hello_after = now + delay
        self.run_id, self.index, self.holding = "", None, None
        return Noted(logging.WARNING, f"refused by or refusing the session ({self.refusals} in a row): saying "
                                      f"hello again in {delay:.0f} s")

    def joined(self, run_id: str, index: int, heartbeat_s: float, liveness_s: float) -> None:
        self.run_id, self.index, self.heartbeat_s, self.liveness_s = run_id, index, heartbeat_s, liveness_s
        self.refusals = 0

    def joined_run(self, run_id: str) -> bool:
        return self.index is not None and run_id == self.run_id

    def on_task(self, task: codec.Task) -> list[Action]:
        if not self.joined_run(task.run_id):
            return [Noted(logging.WARNING, f"ignoring a task of run {task.run_id} (we are in "
                                           f"{self.run_id or 'none'})")]
        if self.holding is not None:
            level = logging.INFO if task.round == self.holding else logging.WARNING  # a resend of ours is benign
            return [Noted(level, f"ignoring the task of round {task.round}: still holding round {self.holding}")]
        self.holding = task.round
        return [Train(task)]

    # ------------------------------------------------------------------------------------------ the clock
    def finished(self, round_number: int, frame: bytes | None, error: str = "") -> list[Action]:
        """Training ended: the update to send, or the failure to report; the agent holds no task any more."""
        self.holding = None
        if frame is None:
            return [Send(codec.ErrorMessage(run_id=self.run_id, round=round_number, sender=self.client_id,
                                            code="round-failed", reason=error))]
        return []  # the driver sends the already encoded update frame itself

    def abandoned(self) -> None:
        """Training stopped without an outcome (the agent is stopping): it holds no task any more."""
        self.holding = None

    def tick(self, now: float) -> list[Action]:
        actions: list[Action] = []
        heard_recently = self.index is not None and now - self.last_heard < self.liveness_s
        if not heard_recently and now - self.last_hello >= self.hello_interval_s and now >= self.hello_after:
            if self.index is not None and self.last_heard:
                actions.append(Noted(logging.WARNING, f"nothing heard from the coordinator for "
                                                      f"{now - self.last_heard:.0f} s; saying hello again"))
            actions.append(self.hello_now(now))
        if self.index is not None and now - self.last_heartbeat >= self.heartbeat_s:
            self.last_heartbeat = now
            actions.append(Send(codec.Heartbeat(run_id=self.run_id, round=self.holding or 0,
                                                sender=self.client_id)))
        return actions

    def hello_now(self, now: float) -> SayHello:
        self.last_hello = now
        return SayHello()

    def holds(self) -> dict[str, Any]:
        """The Hello's claim to the task this agent holds, or nothing."""
        if self.holding is None or self.index is None:
            return {}
        return {codec.HELLO_HOLDS: [self.run_id, self.holding]}

    def leaving(self) -> list[Action]:
        if self.index is None:
            return []
        return [Send(codec.Bye(run_id=self.run_id, round=self.holding or 0, sender=self.client_id,
                               reason="agent stopping"))]
