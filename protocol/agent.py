"""The agent's side of the round protocol, with no I/O: frames and the current time in, actions out.

``AgentProtocol`` decides what a message from the coordinator means for this device: a welcome to join (or to
ignore, when it welcomes us back), a task to train (unless the agent already holds one), a cancel that stops it, a
commit to confirm, a bye that ends the session (code ``finished``) or means "wait, I will be back", an error to
answer with a hello; when the finished update goes out (at once, or, for a paced task, when its grant comes); and,
from the clock, when to say hello (nothing heard for longer than the liveness), when to open a new connection (in a
session, nothing heard for the liveness: at most once per liveness) and when to send a heartbeat. A session-level refusal (the
coordinator's protocol or model mismatch or full session, or this device declining the session's plugin or model)
does not stop the agent: it says hello again with exponential backoff, capped at 15 minutes, so that a fixed
coordinator, a new session or a rolling upgrade recovers the fleet with no operator. A securely aggregated task
(its ``secagg`` settings set) is held in a ``protocol.secure_device.SecureTask``: its keys go out with the training,
its stage messages are answered, and its update goes out masked, once its shares have come (a task it cannot mask,
or a stage it refuses, fails the round: nothing goes out in the clear). A masked update goes out after a
``Masked`` action (the driver writes it durably first), and a device never masks a second input of a round of
which it sent one (``masked_before``): a coordinator that restarted redoes the round with fresh keys, and two sums
of the same inputs over different devices would give one device's update away, so it reports the round failed
instead. The agent's state is named
(``AgentState``) and changes only by ``AGENT_TRANSITIONS``:

    AgentState       event      next
    NO_SESSION       join       IDLE             (the welcome's session was built)
    IDLE             task       TRAINING
    TRAINING         send       IDLE             (its update, or its failure, goes out)
    TRAINING         hold       AWAITING_GRANT   (a paced task finished: its update waits for a grant)
    AWAITING_GRANT   grant      IDLE             (the update goes out)
    TRAINING         await shares  AWAITING_SHARES  (a securely aggregated task finished before its shares came)
    AWAITING_SHARES  send       IDLE             (its delivery came: the masked update goes out)
    TRAINING         decline    IDLE             (this device's availability rules: nothing is trained)
    TRAINING         cancel     IDLE             (a Cancel, another session's welcome, a refusal, a finished bye,
    AWAITING_GRANT   cancel     IDLE              a training that ended with no outcome, or a secure stage
    AWAITING_SHARES  cancel     IDLE              refused)
    IDLE             leave      NO_SESSION       (a finished bye, a refusal, another session's welcome)

A malformed packet changes nothing: it is logged, a packet of an older wire format is answered by backing off (the coordinator
must be upgraded), a welcome whose settings do not decode is declined (``bad-welcome``), and a task whose body does
not decode is reported as a failed round, so the coordinator stops waiting for it. The driver
(``edge_agent.agent``) owns the socket, the training thread, the device state and the meter, and carries out the
actions. No sockets, threads or clocks here; no algorithm by name.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

from fedge import codec
from fedge.codec import vocabulary as words
from fedge.protocol.events import (
    AgentAction,
    CancelTraining,
    Confirm,
    Join,
    Left,
    Masked,
    Noted,
    Reconnect,
    Send,
    SendFrame,
    Stop,
    Train,
)
from fedge.protocol.secure_device import SecureTask
from fedge.protocol.states import next_state
from fedge.secagg.device import Refused

MAX_BACKOFF_S = 900.0

# What a client's Hello says it decodes (every client here decodes every encoding the codec writes).
# What this side of the protocol takes beyond the wire format's minimum (``words.TASK_PARTS``: a Task in several frames).
CAPABILITIES = ("sparse-mask", "sparse-values", "sparse-indices", "f16", "bf16", "int8", words.TASK_PARTS)


@dataclass(frozen=True)
class DeviceFacts:
    """What this device's Hello says of it: known to its driver (the protocol imports no torch), fixed for the
    process. The one place a Hello is built is ``AgentProtocol.hello``."""

    fedge_version: str
    torch_version: str
    dataset_size: int
    device: str = "cpu"
    input_shape: tuple[int, ...] = ()
    num_outputs: int = 0
    capabilities: tuple[str, ...] = CAPABILITIES


class AgentState(enum.Enum):
    NO_SESSION = "no session"          # waiting for a welcome (perhaps backing off after a refusal)
    IDLE = "idle"                      # in a session, holding no task
    TRAINING = "training"              # holding a task whose training runs
    AWAITING_GRANT = "awaiting grant"  # holding a paced task's finished update until its grant
    AWAITING_SHARES = "awaiting shares"  # holding a securely aggregated task's update until its delivery of shares


AGENT_TRANSITIONS: dict[tuple[AgentState, str], AgentState] = {
    (AgentState.NO_SESSION, "join"): AgentState.IDLE,
    (AgentState.IDLE, "task"): AgentState.TRAINING,
    (AgentState.TRAINING, "send"): AgentState.IDLE,
    (AgentState.TRAINING, "hold"): AgentState.AWAITING_GRANT,
    (AgentState.AWAITING_GRANT, "grant"): AgentState.IDLE,
    (AgentState.TRAINING, "decline"): AgentState.IDLE,
    (AgentState.TRAINING, "cancel"): AgentState.IDLE,
    (AgentState.AWAITING_GRANT, "cancel"): AgentState.IDLE,
    (AgentState.TRAINING, "await shares"): AgentState.AWAITING_SHARES,
    (AgentState.AWAITING_SHARES, "send"): AgentState.IDLE,
    (AgentState.AWAITING_SHARES, "cancel"): AgentState.IDLE,
    (AgentState.IDLE, "leave"): AgentState.NO_SESSION,
}

HOLDING = (AgentState.TRAINING, AgentState.AWAITING_GRANT, AgentState.AWAITING_SHARES)


class AgentProtocol:
    """This device's view of the session; see the module docstring."""

    def __init__(self, client_id: str, hello_interval_s: float, facts: DeviceFacts, stay: bool = True) -> None:
        self.client_id = client_id
        self.facts = facts
        self.stay = stay                 # after a finished session: wait for the next one (or stop)
        self.hello_interval_s = hello_interval_s
        self.state = AgentState.NO_SESSION
        self.run_id = ""                 # the session's, while not NO_SESSION
        self.index: int | None = None    # our client index in it, while not NO_SESSION
        self.task_round: int | None = None  # the round of the task held (TRAINING, AWAITING_GRANT)
        self.paced = False               # the held task's update waits for a grant
        self.update: bytes | None = None  # the finished update of a paced task (AWAITING_GRANT)
        self.heartbeat_s = 0.0
        self.liveness_s = 0.0
        self.last_heard = 0.0
        self.last_hello = -1e18
        self.last_reconnect = -1e18
        self.last_heartbeat = -1e18
        self.refusals = 0                # session-level refusals in a row
        self.hello_after = -1e18         # no hello before this time (backoff)
        self.refused = ""                # why the last session-level refusal happened, until a session is joined
        self.declined = ""               # the last task declined by the availability rules, until the next one
        self.seed = 0                    # the session's run seed (a secure task's rounding draws from it)
        self.secure: SecureTask | None = None  # the securely aggregated task held, until its unmask is answered
        # run id -> the last round this device masked an input of (its driver loads it from the device's state):
        # it masks nothing more of that round or an earlier one of that run
        self.masked_before: dict[str, int] = {}

    def move(self, event: str, task_round: int | None = None, update: bytes | None = None) -> None:
        """The one place the state changes: by ``AGENT_TRANSITIONS`` (a RuntimeError names a transition it does
        not allow: ``protocol.states``), with the held task's round (entering TRAINING) or finished update (entering AWAITING_GRANT)."""
        self.state = state = next_state(AGENT_TRANSITIONS, self.state, event, "the agent")
        if state is AgentState.TRAINING:
            self.task_round = task_round
        elif state is AgentState.AWAITING_GRANT:
            self.update = update
        elif state is AgentState.AWAITING_SHARES:
            pass  # its update waits in ``secure``
        else:
            self.task_round, self.update = None, None
        if state is AgentState.NO_SESSION:
            self.run_id, self.index = "", None

    @property
    def holding(self) -> int | None:
        """The round of the task held (being trained, or its update awaiting a grant), or None."""
        return self.task_round if self.state in HOLDING else None

    # ------------------------------------------------------------------------------------------ receiving
    def receive(self, frame: bytes, now: float) -> list[AgentAction]:
        try:
            message = codec.decode(frame)
        except codec.UnsupportedVersion as exc:
            older = "coordinator" if exc.version < codec.PROTOCOL_VERSION else "agent"
            why = f"the coordinator speaks wire-format version {exc.version}, this agent {codec.PROTOCOL_VERSION}: " \
                  f"upgrade the {older}"
            return [Noted(logging.ERROR, why), *self.back_off(now, f"refused: {why}")]
        except codec.CodecError as exc:
            return self.on_malformed(frame, exc, now)
        self.last_heard = now
        match message:
            case codec.Welcome():
                return self.on_welcome(message)
            case codec.Task():
                return self.on_task(message)
            case codec.Cancel():
                return self.on_cancel(message)
            case codec.Grant():
                return self.on_grant(message)
            case codec.Commit():
                if self.joined_run(message.run_id):
                    return [Confirm(message.round)]
                return [Noted(logging.WARNING, f"ignored a commit of run {message.run_id!r} (we are in "
                                               f"{self.run_id or 'none'})")]
            case codec.Bye():
                return self.on_bye(message, now)
            case codec.ErrorMessage():
                actions: list[AgentAction] = [Noted(logging.WARNING, f"coordinator: {message.code}: {message.reason}")]
                if message.code == words.HELLO_FIRST:
                    actions.append(Send(self.hello()))
                elif message.code in words.SESSION_REFUSALS:
                    actions += self.back_off(now, f"refused: {message.code}: {message.reason}")
                return actions
            case codec.Heartbeat():
                return []
            case codec.SecAggRoster() | codec.SecAggDelivery() | codec.SecAggUnmask():
                return self.on_secure(message)
            case _:
                return [Noted(logging.WARNING, f"ignored a {type(message).__name__} from the coordinator")]

    def on_bye(self, bye: codec.Bye, now: float) -> list[AgentAction]:
        """A finished session (stop, or wait for the next one), or a coordinator that will be back."""
        if bye.code != words.BYE_FINISHED:
            self.last_heard = 0.0  # say hello again as soon as the interval allows
            return [Noted(logging.WARNING, f"coordinator says goodbye: {bye.reason}; waiting for it to come back")]
        if not self.stay:
            return [Noted(logging.INFO, f"coordinator says goodbye: {bye.reason}"), Stop(0, bye.reason)]
        finished = self.run_id
        dropped = self.leave_session()
        self.refusals, self.refused = 0, ""
        self.hello_after = now + self.hello_interval_s  # not to the coordinator that is just closing
        return [Noted(logging.INFO, f"coordinator says goodbye: {bye.reason}; waiting for the next session"),
                *dropped, Left(finished)]

    def on_malformed(self, frame: bytes, error: codec.CodecError, now: float) -> list[AgentAction]:
        """A packet that does not decode: a welcome is declined, a task of our run reported as a failed round (its
        header still names the round), anything else dropped; each with one line."""
        noted = Noted(logging.WARNING, f"dropped a malformed packet from the coordinator: {error}")
        if codec.packet_kind(frame) is codec.Welcome:
            return self.refuse(words.BAD_WELCOME, f"the welcome does not decode: {error}", now)
        try:
            header = codec.read_header(frame)
        except codec.CodecError:
            return [noted]
        if header.cls is codec.Task and self.joined_run(header.run_id) and self.state is AgentState.IDLE:
            return [noted, Send(codec.ErrorMessage(run_id=self.run_id, round=header.round, sender=self.client_id,
                                                   code=words.ROUND_FAILED,
                                                   reason=f"the task does not decode: {error}"))]
        return [noted]

    def on_welcome(self, welcome: codec.Welcome) -> list[AgentAction]:
        if self.index is not None and welcome.run_id == self.run_id and welcome.client_index == self.index:
            return [Noted(logging.INFO, f"coordinator welcomed us back (run {self.run_id}, round {welcome.round})")]
        return [*self.leave_session(), Join(welcome)]  # another session: a round of the old one is not finished

    def refuse(self, code: str, reason: str, now: float) -> list[AgentAction]:
        """Decline the session: tell the coordinator (it frees our index), and say hello again later."""
        return [Noted(logging.ERROR, f"{code}: {reason}"),
                Send(codec.ErrorMessage(run_id="", round=0, sender=self.client_id, code=code, reason=reason)),
                *self.back_off(now, f"declined: {code}: {reason}")]

    def back_off(self, now: float, why: str = "") -> list[AgentAction]:
        """Leave the session (if any; a round in training is stopped) and wait before the next hello: the hello
        interval doubled per refusal in a row, at most MAX_BACKOFF_S."""
        self.refusals += 1
        self.refused = why or self.refused
        delay = min(MAX_BACKOFF_S, self.hello_interval_s * 2 ** (self.refusals - 1))
        self.hello_after = now + delay
        actions: list[AgentAction] = [Noted(logging.WARNING, f"refused by or refusing the session ({self.refusals} in a "
                                                        f"row): saying hello again in {delay:.0f} s")]
        return actions + self.leave_session()

    def leave_session(self) -> list[AgentAction]:
        """Stop holding a task (``drop_held_round``) and leave the session, if in one."""
        dropped = self.drop_held_round()
        self.secure = None
        if self.state is AgentState.IDLE:
            self.move("leave")
        return dropped

    def drop_held_round(self) -> list[AgentAction]:
        """Stop holding the current task: its training is cancelled (a finished update waiting for its grant is
        dropped); whatever it produces later is not sent."""
        training, round_number = self.state is AgentState.TRAINING, self.task_round
        if self.state in HOLDING:
            self.move("cancel")
            self.secure = None  # a secure task dropped before its masked input went out is never masked
        return [CancelTraining(round_number)] if training and round_number is not None else []

    def joined(self, run_id: str, index: int, heartbeat_s: float, liveness_s: float, seed: int = 0) -> None:
        self.move("join")
        self.run_id, self.index, self.heartbeat_s, self.liveness_s = run_id, index, heartbeat_s, liveness_s
        self.seed = seed
        self.refusals, self.refused = 0, ""

    def joined_run(self, run_id: str) -> bool:
        return self.index is not None and run_id == self.run_id

    def on_task(self, task: codec.Task) -> list[AgentAction]:
        if not self.joined_run(task.run_id):
            return [Noted(logging.WARNING, f"ignoring a task of run {task.run_id} (we are in "
                                           f"{self.run_id or 'none'})")]
        if self.state is not AgentState.IDLE:
            level = logging.INFO if task.round == self.holding else logging.WARNING  # a resend of ours is benign
            return [Noted(level, f"ignoring the task of round {task.round}: still holding round {self.holding}")]
        keys: list[AgentAction] = []
        if task.secagg is not None:  # its keys go out at once; a task it cannot mask is never trained
            try:
                if task.paced:
                    raise ValueError("a paced task cannot be securely aggregated")
                last = self.masked_before.get(task.run_id, 0)
                if task.round <= last:
                    raise ValueError(f"this device masked an input of round {last} already (an earlier attempt): "
                                     "two sums over different devices would give one device's update away")
                assert self.index is not None
                self.secure = SecureTask(self.run_id, self.client_id, self.index, self.seed, task)
            except (ValueError, Refused) as error:
                return self.secure_failed(task.round, f"secure aggregation: {error}")
            keys.append(Send(self.secure.device.keys()))
        self.move("task", task_round=task.round)
        self.paced, self.declined = task.paced, ""
        return [Train(task), *keys]

    def on_secure(self, message: codec.SecAggRoster | codec.SecAggDelivery | codec.SecAggUnmask) -> list[AgentAction]:
        """A stage message of the securely aggregated task held: its answer; after the delivery, the masked
        update if training has ended; a message it refuses fails the round."""
        secure = self.secure
        if not self.joined_run(message.run_id) or secure is None or message.round != secure.round:
            return [Noted(logging.INFO, f"ignored a {type(message).__name__} of round {message.round} (no secure "
                                        "task of it is held)")]
        try:
            actions: list[AgentAction] = [Send(reply) for reply in secure.device.receive(message)]
            if secure.pending is not None and secure.device.ready and self.state is AgentState.AWAITING_SHARES:
                frame, secure.pending = secure.masked_frame(secure.pending), None
                self.move("send")
                actions += self.send_masked(frame, message.round)
        except Refused as refusal:
            return self.secure_failed(message.round, f"secure aggregation: {refusal}")
        if isinstance(message, codec.SecAggUnmask):
            self.secure = None  # answered once: nothing more of this round
        return actions

    def secure_failed(self, round_number: int, reason: str) -> list[AgentAction]:
        """A securely aggregated round this device cannot go on with: reported failed, its training (or held
        update) dropped, nothing more sent for it."""
        self.secure = None
        dropped = self.drop_held_round() if self.holding == round_number else []
        return [Noted(logging.WARNING, f"round {round_number}: {reason}"), *dropped,
                Send(codec.ErrorMessage(run_id=self.run_id, round=round_number, sender=self.client_id,
                                        code=words.ROUND_FAILED, reason=reason))]

    def decline_task(self, round_number: int, reason: str) -> list[AgentAction]:
        """This device may not train now (its availability rules): the coordinator is told, nothing is trained, and
        the agent holds no task."""
        if self.state is AgentState.TRAINING and self.task_round == round_number:
            self.move("decline")
        if self.secure is not None and self.secure.round == round_number:
            self.secure = None  # it answers no stage of the round (its keys, already queued, are withdrawn)
        self.declined = f"declined round {round_number}: {reason}"
        return [Noted(logging.INFO, f"not available for round {round_number}: {reason}"),
                Send(codec.ErrorMessage(run_id=self.run_id, round=round_number, sender=self.client_id,
                                        code=words.UNAVAILABLE, reason=reason))]

    def on_cancel(self, cancel: codec.Cancel) -> list[AgentAction]:
        if not self.joined_run(cancel.run_id) or cancel.round != self.holding:
            return [Noted(logging.INFO, f"ignored a cancel of round {cancel.round} (holding "
                                        f"{self.holding if self.holding is not None else 'none'})")]
        # The agent holds the round no more at once: the next task is trained as soon as the stopped one has ended
        # (the driver waits for its worker), and whatever the stopped one produces is not sent.
        return [Noted(logging.INFO, f"round {cancel.round} cancelled: {cancel.reason}"), *self.drop_held_round()]

    def on_grant(self, grant: codec.Grant) -> list[AgentAction]:
        update = self.update
        if not self.joined_run(grant.run_id) or self.state is not AgentState.AWAITING_GRANT or update is None or \
                grant.round != self.task_round:
            return [Noted(logging.INFO, f"ignored a grant for round {grant.round} (no update of it is waiting)")]
        self.move("grant")
        return [SendFrame(update, round=grant.round)]

    # ------------------------------------------------------------------------------------------ the clock
    def finished(self, round_number: int, frame: bytes | None, error: str = "") -> list[AgentAction]:
        """Training ended: the failure to report, or the update to send now (or, for a paced task, to hold until
        its grant, saying so in a heartbeat at once)."""
        if self.state is not AgentState.TRAINING or self.task_round != round_number:  # cancelled, or left
            return [Noted(logging.INFO, f"round {round_number} ended after it was cancelled; nothing is sent")]
        if frame is None:
            self.move("send")
            return [Send(codec.ErrorMessage(run_id=self.run_id, round=round_number, sender=self.client_id,
                                            code=words.ROUND_FAILED, reason=error))]
        if self.secure is not None and self.secure.round == round_number:
            return self.finished_secure(self.secure, round_number, frame)
        if self.paced:
            self.move("hold", update=frame)
            return [Send(self.heartbeat())]
        self.move("send")
        return [SendFrame(frame, round=round_number)]

    def finished_secure(self, secure: SecureTask, round_number: int, frame: bytes) -> list[AgentAction]:
        """A securely aggregated task's training ended: its masked update now, or once its delivery comes."""
        try:
            update = codec.decode(frame)
            if not isinstance(update, codec.Update):
                raise Refused(f"training produced a {type(update).__name__}, not an Update")
            if not secure.device.ready:
                secure.change_of(update)  # refused now rather than when the delivery comes
                secure.pending = update
                self.move("await shares")
                return []
            masked = secure.masked_frame(update)
        except (codec.CodecError, Refused) as error:
            return self.secure_failed(round_number, f"secure aggregation: {error}")
        self.move("send")
        return self.send_masked(masked, round_number)

    def send_masked(self, frame: bytes, round_number: int) -> list[AgentAction]:
        """A masked update goes out once it is remembered (``Masked``, written by the driver first)."""
        self.masked_before[self.run_id] = round_number
        return [Masked(self.run_id, round_number), SendFrame(frame, round=round_number)]

    def abandoned(self) -> None:
        """Training stopped without an outcome (cancelled, or the agent is stopping): it holds no task any more. An
        update that finished and waits (for its grant, or its secure round's shares) has no training either and is
        kept: only TRAINING is abandoned."""
        if self.state is AgentState.TRAINING:
            self.move("cancel")

    def heartbeat(self, steps: int = 0) -> codec.Heartbeat:
        return codec.Heartbeat(run_id=self.run_id, round=self.holding or 0, sender=self.client_id, steps=steps,
                               ready=self.state is AgentState.AWAITING_GRANT)

    def tick(self, now: float, steps: int = 0) -> list[AgentAction]:
        """What the clock asks for; ``steps``: training steps taken in the held round (for the heartbeat)."""
        actions: list[AgentAction] = []
        if self.index is not None and self.last_heard and self.liveness_s > 0 and \
                now - max(self.last_heard, self.last_reconnect) >= self.liveness_s:
            self.last_reconnect = now
            actions += [Noted(logging.WARNING, f"nothing heard from the coordinator for {now - self.last_heard:.0f} s: "
                                               "its connection may be dead; opening a new one"), Reconnect()]
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
        if self.state is AgentState.NO_SESSION:
            return f"{self.refused}; saying hello again with backoff" if self.refused else \
                "waiting for a session"
        if self.state is AgentState.AWAITING_GRANT:
            return f"round {self.holding} trained; its update waits for a grant (run {self.run_id})"
        if self.state is AgentState.TRAINING and training:
            return f"training round {self.holding} as client {self.index} of run {self.run_id}"
        return f"idle: client {self.index} of run {self.run_id}" + (f" ({self.declined})" if self.declined else "")

    def hello_now(self, now: float) -> Send:
        self.last_hello = now
        return Send(self.hello())

    def hello(self) -> codec.Hello:
        """This device's Hello: its facts, and the task it holds."""
        facts = self.facts
        return codec.Hello(run_id=self.run_id, round=0, sender=self.client_id, fedge_version=facts.fedge_version,
                           versions=codec.SPOKEN_VERSIONS, torch_version=facts.torch_version, model_hash="",
                           capabilities=facts.capabilities, dataset_size=facts.dataset_size, device=facts.device,
                           input_shape=facts.input_shape, num_outputs=facts.num_outputs, holds=self.holds())

    def holds(self) -> tuple[str, int] | None:
        """The Hello's claim to the task this agent holds: (run id, round), or None."""
        if self.holding is None or self.index is None:
            return None
        return (self.run_id, self.holding)

    def leaving(self) -> list[AgentAction]:
        if self.index is None:
            return []
        return [Send(codec.Bye(run_id=self.run_id, round=self.holding or 0, sender=self.client_id,
                               code=words.BYE_STOPPING, reason="agent stopping"))]
