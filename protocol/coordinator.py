"""The coordinator's side of the round protocol, with no I/O: frames and the current time in, events out.

``CoordinatorProtocol`` holds the agent registry, the round in progress as named states (its ``RoundPhase`` and
each selected client's ``ClientOutcome``, ``protocol.round``) and the rules that guard it: the connection's id must
be the one its key is allowed as (CurveZMQ on), hello first, the sender must be the connection's id, a full session, protocol and model mismatches, a re-hello mid-round (the task is sent
again only when the agent's hello says it holds none for this round), stale, duplicate, not-selected and invalid
updates (a device whose update is refused, at decoding, at checking or by the round's fold, has its part in the round
ended at once: ``ClientOutcome.REFUSED``, never committed, not waited for), commits only for aggregated updates and
only after the checkpoint, byes and failures in every state, and
agents that decline a session at their welcome (one that declined is not selected or counted again until a heartbeat
of this session shows that its next welcome took). A peer that keeps sending what must be refused gets no answers for
a while: ``RejectionLimiter`` counts it in a bounded table and lets a few answers and log lines through per window.
It returns ``protocol.events``: what to send (``Send``, ``SendFrame``), what to log (``Rejected``, ``Noted``),
each accepted update (``Accepted``, which the driver folds at once; the round keeps only its typed fields and
size; ``admit``, the round's own check of a fold, runs before it is accepted, and a fold that refuses it anyway is
reported back with ``unfolded``) and, from ``commits``, the checkpoint the Commits wait for (``Checkpoint``). A securely aggregated round
(``open_round(..., secure=...)``, ``protocol.secure_round``) routes the stage messages to its ``SecureRound``, adds
each masked Update to the masked sum and hands none out (no ``Accepted``: the driver folds only the unmasked mean),
stops waiting for a device that left or failed, closes once every device that shared has sent its input, follows
its Cancels with the unmask requests, and commits only the devices in the unmasked sum. No sockets, threads or clocks:
a driver (``coordinator.session``, ``simulation.inprocess``) polls, feeds, sends and writes files. The server half
is called through its torch-free contract (``protocol.server_half``) for downlinks, checks and to forget a device;
no algorithm is known by name.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from fedge import codec
from fedge.codec import vocabulary as words
from fedge.protocol.asynchronous import Flush
from fedge.protocol.events import (
    COORDINATOR,
    Accepted,
    Checkpoint,
    CoordinatorEvent,
    Noted,
    Rejected,
    Send,
    SendFrame,
)
from fedge.protocol.limiter import RejectionLimiter
from fedge.protocol.pacing import UploadPacer
from fedge.protocol.payload import ClientUpdate, Payload
from fedge.protocol.registry import AgentRegistry
from fedge.protocol.round import ClientOutcome, RoundPhase, RoundState, next_phase
from fedge.protocol.secure_round import SecureRound
from fedge.protocol.selection import censored, measured
from fedge.protocol.server_half import ServerHalf
from fedge.protocol.validation import check_fields, check_update
from fedge.protocol.versions import Refused, VersionRecord, VersionRounds


class CoordinatorProtocol:
    """The rules of a session; see the module docstring. ``welcome_fields(index)`` is a welcome's settings (the
    fields of ``codec.Welcome``), ``task_flags(round)`` the runtime's further fields of a task (``personal_eval``,
    ``evaluate``, ``norm_bounds``)."""

    def __init__(self, run_id: str, model_hash: str, shapes: dict[str, tuple[int, ...]], registry: AgentRegistry,
                 server: ServerHalf, welcome_fields: Callable[[int], dict[str, Any]],
                 task_flags: Callable[[int], dict[str, Any]] | None = None,
                 limiter: RejectionLimiter | None = None, max_uploads: int = 0,
                 admit: Callable[[ClientUpdate], str] | None = None, floats: frozenset[str] | None = None) -> None:
        self.run_id = run_id
        self.model_hash = model_hash
        self.shapes = shapes
        self.floats = floats  # the model's float tensors (None: the kinds of an update's tensors are not checked)
        self.registry = registry
        self.server = server
        self.welcome_fields = welcome_fields
        self.task_flags = task_flags or (lambda _round: {})
        # the check the round's fold makes (``Aggregation.check``), the last before an update is accepted: a reason
        self.admit = admit or (lambda _update: "")
        self.limiter = limiter or RejectionLimiter()
        self.reports = RejectionLimiter()  # the same bound on the log lines of agents' error reports
        self.round = 0                        # the last committed round
        self.over = False                     # the session finished: hellos are not answered any more
        self.phase = RoundPhase.NONE          # of the round last opened (protocol.round's table)
        self.current: RoundState | None = None  # the round while it is OPEN
        self.closed: RoundState | None = None   # the round while it is CLOSED (awaiting its checkpoint)
        self.declined: dict[str, None] = {}   # client ids that declined the session (bounded, oldest dropped)
        self.pacer = UploadPacer(max_uploads)  # paced uploads (fleet.max_uploads; 0: unpaced)
        self.secure: SecureRound | None = None  # a securely aggregated round's stages, from its opening to its commit
        self.versions: VersionRounds | None = None  # an asynchronous session's tasks and versions (start_versions)

    def resume(self, run_id: str, committed_round: int) -> None:
        """A checkpoint was loaded: the session is run ``run_id``, and ``committed_round`` its last committed
        round."""
        if self.phase not in (RoundPhase.NONE, RoundPhase.COMMITTED):
            raise RuntimeError(f"cannot resume while a round is {self.phase.value}")
        self.run_id, self.round = run_id, committed_round
        self.phase = RoundPhase.COMMITTED if committed_round else RoundPhase.NONE

    def replace_server(self, server: ServerHalf) -> None:
        """Serve with another server half (one restored from a checkpoint) from the next round on."""
        if self.phase is RoundPhase.OPEN:
            raise RuntimeError("the server half cannot change while a round is open")
        self.server = server

    # ------------------------------------------------------------------------------------------ receiving
    def receive(self, peer: bytes, frame: bytes, now: float, identity: str | None = None) -> list[CoordinatorEvent]:
        """One frame from ``peer`` (with CurveZMQ on, the client id of the connection's key; off, the routing id
        the peer chose). ``identity``: the client id the connection's CurveZMQ key is allowed as (None with CurveZMQ
        off): a peer that is not that id, or whose message names another sender, is refused."""
        if self.versions is not None:  # the time of what it journals from here (a task lost to a bye, say)
            self.versions.seen = max(self.versions.seen, now)
        if identity is not None and identity != peer.decode(errors="replace"):
            return self.refuse(peer, words.IDENTITY_MISMATCH, f"this connection's key is allowed as client "
                               f"{identity!r}, not as {peer.decode(errors='replace')!r}", now)
        try:
            message = codec.decode(frame)
        except codec.UnsupportedVersion as exc:
            older = "agent" if exc.version < codec.PROTOCOL_VERSION else "coordinator"
            return self.refuse(peer, words.PROTOCOL_MISMATCH, f"the agent speaks wire-format version {exc.version}, "
                               f"this coordinator {codec.PROTOCOL_VERSION}: upgrade the {older}", now,
                               older=exc.version)
        except codec.CodecError as exc:
            reason = f"{type(exc).__name__}: {exc}"
            return self.refuse(peer, words.MALFORMED, reason, now) + self.undecodable(peer, frame, reason)
        client_id = peer.decode(errors="replace")
        if identity is not None and message.sender != identity:
            return self.refuse(peer, words.IDENTITY_MISMATCH, f"this connection's key is allowed as client "
                               f"{identity!r}, not as {message.sender!r}", now)
        if message.sender != client_id:
            return self.refuse(peer, words.SENDER_MISMATCH, f"sender {message.sender!r} is not the connection's id",
                               now)
        if isinstance(message, codec.Hello):
            return self.on_hello(peer, message, now)
        if self.over and not isinstance(message, codec.Bye):  # the session said goodbye: what crossed it is dropped
            return [Noted(logging.DEBUG, f"a {type(message).__name__} from {client_id} after the session ended")]
        agent = self.registry.get(client_id)
        if agent is None or not agent.connected:
            return self.refuse(peer, words.HELLO_FIRST, "this agent has not registered in this session: send a "
                               "hello", now)
        self.registry.touch(client_id, now)
        agent.peer = peer
        match message:
            case codec.Heartbeat():
                if not agent.joined and message.run_id == self.run_id:  # it declined before and has joined now
                    agent.joined = True
                    self.declined.pop(client_id, None)
                echo: list[CoordinatorEvent] = [Send(peer=peer, message=codec.Heartbeat(
                    run_id=self.run_id, round=self.round, sender=COORDINATOR))]
                return echo + self.on_ready(agent.index, message, now) if message.ready else echo
            case codec.Update() if self.versions is not None:
                return self.on_task_update(peer, client_id, agent.index, message, len(frame), now)
            case codec.Update():
                outcome = self.on_update(peer, agent.index, message, len(frame), now) + self.grants(now)
                if self.current is not None and agent.index in self.current.updates and \
                        agent.index not in self.current.body_up:
                    self.current.body_up[agent.index] = len(frame) - codec.read_header(frame).body_at
                return outcome
            case codec.SecAggKeys() | codec.SecAggShares() | codec.SecAggReveal():
                if self.secure is None:
                    return [Noted(logging.INFO, f"a {type(message).__name__} from {client_id} with no securely "
                                                "aggregated round open")]
                return self.secure.receive(client_id, message, now)
            case codec.Bye():
                return self.on_bye(client_id, agent.index, message) + self.secure_gone(client_id, now)
            case codec.ErrorMessage():
                return self.on_report(peer, client_id, agent.index, message, now)
            case _:
                return self.refuse(peer, words.UNEXPECTED, f"a {type(message).__name__} is not expected from an "
                                   "agent", now)

    def on_report(self, peer: bytes, client_id: str, index: int, message: codec.ErrorMessage,
                  now: float) -> list[CoordinatorEvent]:
        """An agent's error report: logged at a bounded rate; a failed round, an unavailability or a refusal of
        the session acted on."""
        admitted, _ = self.reports.admit(peer, now)
        events: list[CoordinatorEvent] = [Noted(logging.WARNING, f"agent {client_id} reports {message.code}: "
                                                                 f"{message.reason}")] if admitted else []
        if message.run_id != self.run_id and message.code in (words.ROUND_FAILED, words.UNAVAILABLE):
            return events  # about a round of another session
        if message.code == words.ROUND_FAILED:
            events += self.on_failed_round(index, message.round)
        elif message.code == words.UNAVAILABLE:
            self.on_unavailable(index, message.round, message.reason)
        elif message.code in words.JOIN_REFUSALS:
            events += self.on_declined(client_id, index)
        else:
            return events
        if message.code in words.JOIN_REFUSALS or (self.secure is not None and message.round == self.secure.number):
            events += self.secure_gone(client_id, now)  # a report of an earlier round stops no stage
        return events

    def secure_gone(self, client_id: str, now: float) -> list[CoordinatorEvent]:
        """A device that left, failed or declined: a securely aggregated round's open stage stops waiting for it."""
        return self.secure.gone(client_id, now) if self.secure is not None else []

    def refuse(self, peer: bytes, code: str, reason: str, now: float, older: int = 0) -> list[CoordinatorEvent]:
        """Answer (and log) a refusal, at a bounded rate per peer; ``older``: the wire-format version of the packet
        refused, to answer in it where the codec still writes one (``codec.legacy``)."""
        admitted, suppressed = self.limiter.admit(peer, now)
        events: list[CoordinatorEvent] = []
        if suppressed:
            events.append(Noted(logging.WARNING, f"{suppressed} more rejections of {peer!r} were not answered "
                                                 "or logged in the last window"))
        if admitted:
            events.append(Rejected(peer, code, reason))
            frame = codec.older_error(older, self.run_id, COORDINATOR, code, reason) if older else None
            if frame is not None:
                events.append(SendFrame(peer=peer, frame=frame))
            else:
                events.append(Send(peer=peer, message=codec.ErrorMessage(run_id=self.run_id, round=self.round, sender=COORDINATOR,
                                                            code=code, reason=reason)))
        return events

    def undecodable(self, peer: bytes, frame: bytes, reason: str) -> list[CoordinatorEvent]:
        """A frame that did not decode: when its header reads as this device's Update of its round (or task) in
        progress, that update is refused, and the device's part in it ends now."""
        try:
            header = codec.read_header(frame)
        except codec.CodecError:
            return []
        agent = self.registry.get(peer.decode(errors="replace"))
        if header.cls is not codec.Update or agent is None or not agent.connected or \
                header.sender != agent.client_id or header.run_id != self.run_id:
            return []
        return self.end_part(agent.index, header.round, f"its update did not decode: {reason}")

    def end_part(self, index: int, number: int, reason: str) -> list[CoordinatorEvent]:
        """Client ``index``'s update of round ``number`` (asynchronously: of task ``number``), awaited, was refused
        at decoding or checking: it is not waited for any more (``ClientOutcome.REFUSED``)."""
        if self.versions is not None:
            return self.versions.lost(index, f"its update was refused: {reason[:200]}", number)
        current = self.current
        if current is None or current.number != number or current.outcomes.get(index) is not ClientOutcome.TASKED:
            return []
        current.refuse(index, reason[:200])
        return [Noted(logging.INFO, f"client {index}: its part in round {number} ends, its update refused: "
                                    f"{reason[:200]}")]

    def unfolded(self, number: int, index: int, reason: str, now: float) -> list[CoordinatorEvent]:
        """The round's fold refused an update it had accepted (``Aggregation.refused``; asynchronously, ``number``
        is the version it was to join): refused as any other update is (answered, logged and counted at a bounded
        rate), the device's part in the round ended (``ClientOutcome.REFUSED``), and no Commit of it."""
        agent = self.registry.by_index(index)
        reason = f"the round's aggregation refused the update: {reason[:200]}"
        if self.versions is not None:
            ended = self.versions.unfolded(index, number, reason)
        else:
            state = next((s for s in (self.current, self.closed) if s is not None and s.number == number), None)
            if state is None or state.outcomes.get(index) is not ClientOutcome.UPDATED:
                raise RuntimeError(f"client {index} has no accepted update in round {number}")
            state.refuse(index, reason)
            ended = [Noted(logging.INFO, f"client {index}: its part in round {number} ends: {reason}")]
        return self.refuse(agent.peer or agent.client_id.encode(), words.INVALID_UPDATE, reason, now) + ended

    def on_hello(self, peer: bytes, hello: codec.Hello, now: float) -> list[CoordinatorEvent]:
        if self.over:  # the session said goodbye; an agent that stays up finds the next session
            return []
        if codec.PROTOCOL_VERSION not in hello.versions:
            return self.refuse(peer, words.PROTOCOL_MISMATCH, f"agent speaks wire-format versions "
                               f"{list(hello.versions)}, this coordinator {codec.PROTOCOL_VERSION}: upgrade the older "
                               "side", now)
        if hello.model_hash and hello.model_hash != self.model_hash:
            return self.refuse(peer, words.MODEL_MISMATCH, f"agent's model definition {hello.model_hash} differs "
                               f"from the session's {self.model_hash} (different Fedge or torch versions?)", now)
        index = self.registry.index_of(hello.sender)
        if index is None:
            return self.refuse(peer, words.SESSION_FULL, f"the session already has its {self.registry.capacity} "
                               "clients", now)
        agent = self.registry.agents[hello.sender]
        first = not agent.connected
        agent.peer, agent.connected, agent.dataset_size = peer, True, hello.dataset_size
        agent.joined = hello.sender not in self.declined  # else it is not selected until a heartbeat of this run
        agent.hello = {"fedge": hello.fedge_version, "torch": hello.torch_version,
                       "capabilities": list(hello.capabilities), "device": hello.device,
                       "input_shape": list(hello.input_shape), "num_outputs": hello.num_outputs}
        self.registry.touch(hello.sender, now)
        events: list[CoordinatorEvent] = []
        if first:
            events.append(Noted(logging.INFO, f"agent {hello.sender} registered as client {index} "
                                              f"({hello.dataset_size} samples, torch {hello.torch_version})"))
        events.append(Send(peer=peer, message=codec.Welcome(run_id=self.run_id, round=self.round, sender=COORDINATOR,
                                               **self.welcome_fields(index))))
        if self.versions is not None:  # a task it does not say it holds is lost: it may be given another
            held = self.versions.held_by(index)
            if held is not None and hello.holds != (self.run_id, held.task_id):
                events += self.versions.lost(index, "its device said hello without it")
            return events
        current = self.current
        holds_this_round = current is not None and hello.holds == (self.run_id, current.number)
        if current is not None and index in current.pending and not holds_this_round:
            events.append(self.task(index, now))
        return events

    def on_update(self, peer: bytes, index: int, update: codec.Update, size: int, now: float) -> list[CoordinatorEvent]:
        current = self.current
        if update.run_id != self.run_id:
            return self.refuse(peer, words.STALE, f"update of run {update.run_id!r}; this session is run "
                               f"{self.run_id!r}", now)
        if current is None or update.round != current.number:
            return self.refuse(peer, words.STALE, f"update for round {update.round} arrived outside it (current: "
                               f"{current.number if current else 'none'})", now)
        if index not in current.chosen:
            return self.refuse(peer, words.NOT_SELECTED, f"client {index} was not selected in round {update.round}",
                               now)
        if index in current.updates or index in current.refused:
            return self.refuse(peer, words.DUPLICATE, f"a second update from client {index} in round {update.round}",
                               now)
        if current.target and len(current.updates) >= current.target:  # it arrived in the batch that closes it
            return self.refuse(peer, words.STALE, f"round {update.round} has its {current.target} updates "
                               "(round.target) and is closing", now)
        agent = self.registry.by_index(index)
        problem = check_fields(update)
        if problem:
            return self.refuse(peer, words.INVALID_UPDATE, problem, now) + self.end_part(index, current.number, problem)
        if self.secure is not None:  # a masked input joins the round's masked sum; nothing of it is kept here
            problem = self.secure.masked_update(agent.client_id, update)
            if problem:
                return self.refuse(peer, words.INVALID_UPDATE, problem, now) + \
                    self.end_part(index, current.number, problem)
            # the masked Update has no training loss: kept as unknown (NaN), never as the codec's 0.0
            current.accept(index, dataclasses.replace(update, groups={}, meta={}, train_loss=math.nan), size)
            agent.round_s = measured(agent.round_s, max(now - current.started, 0.0))
            return []
        decoded = ClientUpdate(client_id=agent.client_id, index=index, num_samples=update.num_samples,
                               payload=Payload(groups=dict(update.groups), meta=dict(update.meta)),
                               clip_scale=update.clip_scale)
        # the server half's own rule for what its fold needs (every group and tensor it reads, the meta keys it
        # converts), so that a lacking update is refused here, never failing inside a fold
        problem = check_update(update, self.shapes, current.masks.get(index, set()), self.floats) or \
            self.server.check_update(update.round, decoded) or self.admit(decoded)
        if problem:
            return self.refuse(peer, words.INVALID_UPDATE, problem, now) + self.end_part(index, current.number, problem)
        current.accept(index, dataclasses.replace(update, groups={}, meta={}), size)
        agent.round_s = measured(agent.round_s, max(now - current.started, 0.0))  # task sent to update received
        return [Accepted(current.number, decoded)]

    def on_bye(self, client_id: str, index: int, bye: codec.Bye) -> list[CoordinatorEvent]:
        """The agent leaves: it is no longer awaited in the round in progress (or its task, asynchronously)."""
        self.registry.agents[client_id].connected = False
        if self.versions is not None:
            self.versions.lost(index, "its device left")
        current = self.current
        if current is not None and index in current.pending:
            current.fail(index)
        return [Noted(logging.INFO, f"agent {client_id} left: {bye.reason}")]

    def on_unavailable(self, index: int, round_number: int, reason: str) -> None:
        """A selected agent may not train now: stop waiting for it. Not a failure: the server half keeps what it
        assumes of the device (no ``forget``), and the round does not count it as missed."""
        if self.versions is not None:
            self.versions.lost(index, f"unavailable: {reason[:200]}", round_number)
        current = self.current
        if current is not None and current.number == round_number and index in current.chosen and \
                index not in current.updates:
            current.decline(index, reason[:200])

    def on_failed_round(self, index: int, round_number: int) -> list[CoordinatorEvent]:
        """An agent could not do its round: stop waiting for it, and let the server half forget what it assumed of
        the device's state (e.g. ef's replica), so the next downlink is self-sufficient."""
        if self.versions is not None:
            events = self.versions.lost(index, "its device reported it failed", round_number)
            if events:
                self.forget(index)
            return events
        current = self.current
        if current is None or current.number != round_number:  # a stale report: nothing to stop waiting for
            return []
        if index in current.chosen:
            current.fail(index)
        self.forget(index)
        return []

    def on_declined(self, client_id: str, index: int) -> list[CoordinatorEvent]:
        """An agent declined the session at its welcome: it is gone, and its index is free again unless it had
        trained (then it keeps it, and the server half forgets what it assumed of the device)."""
        self.registry.agents[client_id].connected = False
        if self.versions is not None:
            self.versions.lost(index, "its device declined the session")
        self.declined.pop(client_id, None)
        self.declined[client_id] = None
        while len(self.declined) > 4 * self.registry.capacity + 64:
            del self.declined[next(iter(self.declined))]
        current = self.current
        if current is not None and index in current.chosen:
            current.fail(index)
        # an update of it in the round open or closing keeps its index: the round's records and commits name it
        held = any(state is not None and index in state.updates for state in (current, self.closed)) or \
            (self.versions is not None and self.versions.holds(index))
        if not held and self.registry.release(client_id):
            self.forget(index)
            return [Noted(logging.INFO, f"agent {client_id} declined the session; client index {index} is free "
                                        "again")]
        return []

    def forget(self, index: int) -> None:
        self.server.forget(index)

    # ------------------------------------------------------------------------------------------ asynchronous
    def start_versions(self, versions: VersionRounds) -> None:
        """Serve asynchronous versions (``protocol.versions``) in place of rounds, from ``versions.version`` on."""
        if self.phase is RoundPhase.OPEN:
            raise RuntimeError("cannot start asynchronous versions while a round is open")
        self.versions = versions
        self.round = versions.version

    def dispatch(self, index: int, now: float) -> Send:
        """A task on the current version for client ``index`` (``protocol.versions``)."""
        assert self.versions is not None
        return self.versions.dispatch(self.server, self.run_id, self.round, index, now)

    def on_task_update(self, peer: bytes, client_id: str, index: int, update: codec.Update, size: int,
                       now: float) -> list[CoordinatorEvent]:
        assert self.versions is not None
        if update.run_id != self.run_id:
            return self.refuse(peer, words.STALE, f"update of run {update.run_id!r}; this session is run "
                               f"{self.run_id!r}", now)
        outcome = self.versions.update(self.server, client_id, index, update, size, now, self.admit, self.floats)
        if isinstance(outcome, Refused):
            return self.refuse(peer, outcome.code, outcome.reason, now)
        return [outcome]

    def close_version(self, now: float) -> tuple[Flush, VersionRecord, list[CoordinatorEvent]]:
        """Close the version being built (``protocol.versions.VersionRounds.flush``)."""
        assert self.versions is not None
        return self.versions.flush(self.run_id, now)

    def flush_version(self, number: int) -> list[CoordinatorEvent]:
        """Version ``number`` was flushed and recorded: it is the last committed one. Its Checkpoint (write it
        now), then the Commits of its updates."""
        assert self.versions is not None
        flushed = self.versions.last_flush
        if flushed is None or flushed.version != number:
            raise RuntimeError(f"version {number} is not the version last flushed")
        self.round = number
        return self.versions.commits(self.run_id, flushed)

    # ------------------------------------------------------------------------------------------ the round
    def open_round(self, number: int, selected: Sequence[int], now: float, deadline_s: float,
                   target: int = 0, secure: SecureRound | None = None) -> list[CoordinatorEvent]:
        """Start round ``number`` with the selected clients: their tasks. ``target``: close it once this many
        updates arrived (over-selection). ``secure``: the round is securely aggregated (its tasks carry the
        ``secagg`` settings of ``task_flags``): its updates are masked inputs, summed by ``secure`` and never
        handed out one by one, and its stage messages go to it until the round is committed."""
        self.phase = next_phase(self.phase, "open")
        self.secure = secure
        self.current = RoundState(number=number, selected=list(selected), started=now, deadline=now + deadline_s,
                                  target=target)
        self.pacer.reset()
        return [self.task(index, now) for index in self.current.selected]

    def on_ready(self, index: int, heartbeat: codec.Heartbeat, now: float) -> list[CoordinatorEvent]:
        """A paced agent holds its update of the round in progress: its grant, now or when a slot frees."""
        current = self.current
        if not self.pacer.on or current is None or heartbeat.round != current.number or \
                index not in current.pending:
            return []
        again = [self.grant(index)] if self.pacer.ready(index) else []
        return again + self.grants(now)

    def grants(self, now: float) -> list[CoordinatorEvent]:
        current = self.current
        if not self.pacer.on or current is None:
            return []
        chosen = self.pacer.next_grants(current.pending,
                                        lambda i: self.registry.alive(self.registry.by_index(i), now))
        return [self.grant(index) for index in chosen]

    def grant(self, index: int) -> Send:
        current = self.current
        assert current is not None
        return Send(peer=self.registry.by_index(index).peer, message=codec.Grant(run_id=self.run_id, round=current.number,
                                                                    sender=COORDINATOR))

    def task(self, index: int, now: float) -> Send:
        """The task of the current round for client ``index`` (its downlink from the server half)."""
        current = self.current
        if current is None:
            raise RuntimeError("no round is open")
        agent = self.registry.by_index(index)
        payload: Payload = self.server.downlink(current.number, index)
        for group in payload.groups.values():
            if group.sparse is not None and group.sparse.mask is not None:
                current.masks.setdefault(index, set()).add(codec.mask_crc(group.sparse.mask))
        current.tasks_sent.add(index)
        return Send(peer=agent.peer, message=codec.Task(run_id=self.run_id, round=current.number, sender=COORDINATOR,
                                           groups=dict(payload.groups), meta=dict(payload.meta),
                                           committed_round=self.round, last_accepted_round=agent.last_accepted_round,
                                           deadline_s=max(0.0, current.deadline - now), paced=self.pacer.on,
                                           **self.task_flags(current.number)), task_of=index)

    def sent_task(self, index: int, size: int) -> None:
        """The driver sent a task of ``size`` bytes to ``index`` (0: it could not)."""
        if self.versions is not None:
            self.versions.sent(index, size)
        elif self.current is not None:
            self.current.bytes_down[index] = self.current.bytes_down.get(index, 0) + size

    def complete(self, now: float) -> bool:
        """Every selected agent reported or failed, the target number of updates arrived, the deadline passed, or
        every awaited agent is gone."""
        current = self.current
        if current is None:
            return True
        if current.target and len(current.updates) >= current.target:
            return True
        if self.secure is not None and (self.secure.done or self.secure.inputs_complete()):
            return True  # it failed before its inputs, or every device that shared has sent its input: the
            # rest (left out of the roster or the shares stage) can send nothing that would join the sum
        if not current.pending or now >= current.deadline:
            return True
        return not any(self.registry.alive(self.registry.by_index(i), now) for i in current.pending)

    def close_round(self, now: float) -> tuple[RoundState, list[CoordinatorEvent]]:
        """Close the round in progress: its state, and a Cancel to each selected agent still training it (whose
        round-time estimate is then censored: it did not finish in the time it had); a securely aggregated round's
        unmask requests follow (its sum is then ``secure``'s once ``secure.done``)."""
        current = self.current
        if current is None:
            raise RuntimeError("no round is open")
        self.phase = next_phase(self.phase, "close")
        self.current, self.closed = None, current
        cancels: list[CoordinatorEvent] = []
        for index in current.close():
            agent = self.registry.by_index(index)
            agent.round_s = censored(agent.round_s, max(now - current.started, 0.0), current.deadline - current.started)
            if agent.connected and agent.peer:
                cancels.append(Send(peer=agent.peer, message=codec.Cancel(run_id=self.run_id, round=current.number, sender=COORDINATOR,
                                                             reason="the round closed without your update")))
        if self.secure is not None:
            cancels += self.secure.close_inputs(now)
        return current, cancels

    def abandon_round(self) -> None:
        self.phase = next_phase(self.phase, "abandon")
        self.current, self.closed, self.secure = None, None, None

    def commits(self, number: int) -> list[CoordinatorEvent]:
        """Commit round ``number``, the round last closed: each agent whose update it aggregated has it as its last
        accepted round. Returns the order the driver follows: ``Checkpoint`` (write it now), then a Commit to each
        of those agents, and only those, to send once it is written."""
        closed = self.closed
        if closed is None or closed.number != number:
            raise RuntimeError(f"round {number} is not the round last closed")
        self.phase = next_phase(self.phase, "commit")
        self.round = number
        self.closed = None
        aggregated = set(closed.updates)
        if self.secure is not None:  # only the inputs of a sum that was unmasked were aggregated
            aggregated = {self.registry.agents[c].index for c in self.secure.contributors}
            self.secure = None
        for index in aggregated:
            self.registry.by_index(index).last_accepted_round = number
        return [Checkpoint(number), *(Send(peer=self.registry.by_index(i).peer, message=codec.Commit(
            run_id=self.run_id, round=number, sender=COORDINATOR)) for i in sorted(aggregated))]

    def byes(self, code: str, reason: str) -> list[CoordinatorEvent]:
        """A Bye to every connected agent (``code``: vocabulary.BYE_FINISHED ends their session, and hellos are no
        longer answered)."""
        self.over = self.over or code == words.BYE_FINISHED
        return [Send(peer=a.peer, message=codec.Bye(run_id=self.run_id, round=self.round, sender=COORDINATOR, code=code, reason=reason))
                for a in self.registry.agents.values() if a.connected and a.peer]
