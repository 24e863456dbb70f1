"""The coordinator's side of the round protocol, with no I/O: frames and the current time in, events out.

``CoordinatorProtocol`` holds the agent registry, the round in progress (who was selected, the tasks and masks
sent, what arrived and was validated) and the rules that guard it: hello first, the sender must be the connection's
id, a full session, protocol and model mismatches, a re-hello mid-round (the task is sent again only when the
agent's hello says it holds none for this round), stale, duplicate, not-selected and invalid updates, commits only
for aggregated updates, byes and failures in every state, and agents that decline a session at their welcome.
A peer that keeps sending what must be refused gets no answers for a while: ``RejectionLimiter`` counts it in a
bounded table and lets a few answers and log lines through per window. What to send comes back as ``Send`` events;
what to log as ``Rejected`` and ``Noted``. No sockets, threads or clocks: the driver (``coordinator.session``)
polls, feeds, sends and writes files. The server half is called for downlinks and to forget a device (pure
computation); it knows no algorithm by name and never imports torch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from fedge import codec
from fedge.algorithms.base import ClientUpdate, Payload
from fedge.algorithms.contract import ServerHalf
from fedge.codec import vocabulary as words
from fedge.coordinator.agents import AgentRegistry
from fedge.coordinator.limiter import RejectionLimiter
from fedge.coordinator.pacing import UploadPacer
from fedge.coordinator.records import check_update
from fedge.coordinator.round_state import SENDER, Event, Noted, Rejected, RoundState, Send, SendFrame
from fedge.coordinator.selection import censored, measured

__all__ = ["CoordinatorProtocol", "Event", "Noted", "Rejected", "RejectionLimiter", "RoundState", "Send", "SendFrame"]

class CoordinatorProtocol:
    """The rules of a session; see the module docstring. ``welcome_fields(index)`` is a welcome's settings (the
    fields of ``codec.Welcome``), ``task_flags(round)`` the evaluation flags of a task (``personal_eval``,
    ``evaluate``)."""

    def __init__(self, run_id: str, model_hash: str, shapes: dict[str, tuple[int, ...]], registry: AgentRegistry,
                 server: ServerHalf, welcome_fields: Callable[[int], dict[str, Any]],
                 task_flags: Callable[[int], dict[str, bool]] | None = None,
                 limiter: RejectionLimiter | None = None, max_uploads: int = 0) -> None:
        self.run_id = run_id
        self.model_hash = model_hash
        self.shapes = shapes
        self.registry = registry
        self.server = server
        self.welcome_fields = welcome_fields
        self.task_flags = task_flags or (lambda _round: {})
        self.limiter = limiter or RejectionLimiter()
        self.reports = RejectionLimiter()  # the same bound on the log lines of agents' error reports
        self.round = 0                        # the last checkpointed round
        self.over = False                     # the session finished: hellos are not answered any more
        self.current: RoundState | None = None
        self.closed: RoundState | None = None  # the round last closed, until its commits are sent
        self.pacer = UploadPacer(max_uploads)  # paced uploads (fleet.max_uploads; 0: unpaced)

    # ------------------------------------------------------------------------------------------ receiving
    def receive(self, peer: bytes, frame: bytes, now: float) -> list[Event]:
        try:
            message = codec.decode(frame)
        except codec.UnsupportedVersion as exc:
            return self.refuse(peer, words.PROTOCOL_MISMATCH, f"the agent speaks wire-format version {exc.version}, "
                               f"this coordinator {codec.PROTOCOL_VERSION}: upgrade the agent", now,
                               older=exc.version == 2)
        except codec.CodecError as exc:
            return self.refuse(peer, words.MALFORMED, f"{type(exc).__name__}: {exc}", now)
        client_id = peer.decode(errors="replace")
        if message.sender != client_id:
            return self.refuse(peer, words.SENDER_MISMATCH, f"sender {message.sender!r} is not the connection's id",
                               now)
        if isinstance(message, codec.Hello):
            return self.on_hello(peer, message, now)
        agent = self.registry.get(client_id)
        if agent is None or not agent.connected:
            return self.refuse(peer, words.HELLO_FIRST, "this agent has not registered in this session: send a "
                               "hello", now)
        self.registry.touch(client_id, now)
        agent.peer = peer
        if isinstance(message, codec.Heartbeat):
            echo: list[Event] = [Send(peer, codec.Heartbeat(run_id=self.run_id, round=self.round, sender=SENDER))]
            return echo + self.on_ready(agent.index, message, now) if message.ready else echo
        if isinstance(message, codec.Update):
            outcome = self.on_update(peer, agent.index, message, len(frame), now) + self.grants(now)
            if self.current is not None and agent.index in self.current.updates and \
                    agent.index not in self.current.body_up:
                self.current.body_up[agent.index] = len(frame) - codec.read_header(frame).body_at
            return outcome
        if isinstance(message, codec.Bye):
            return self.on_bye(client_id, agent.index, message)
        if isinstance(message, codec.ErrorMessage):
            admitted, _ = self.reports.admit(peer, now)  # an agent's reports are logged at a bounded rate too
            events: list[Event] = [Noted(logging.WARNING, f"agent {client_id} reports {message.code}: "
                                                          f"{message.reason}")] if admitted else []
            if message.run_id != self.run_id and message.code in (words.ROUND_FAILED, words.UNAVAILABLE):
                return events  # about a round of another session
            if message.code == words.ROUND_FAILED:
                events += self.on_failed_round(agent.index, message.round)
            elif message.code == words.UNAVAILABLE:
                self.on_unavailable(agent.index, message.round, message.reason)
            elif message.code in words.JOIN_REFUSALS:
                events += self.on_declined(client_id, agent.index)
            return events
        return self.refuse(peer, words.UNEXPECTED, f"a {type(message).__name__} is not expected from an agent", now)

    def refuse(self, peer: bytes, code: str, reason: str, now: float, older: bool = False) -> list[Event]:
        """Answer (and log) a refusal, at a bounded rate per peer; ``older``: answer in wire-format version 2."""
        admitted, suppressed = self.limiter.admit(peer, now)
        events: list[Event] = []
        if suppressed:
            events.append(Noted(logging.WARNING, f"{suppressed} more rejections of {peer!r} were not answered "
                                                 "or logged in the last window"))
        if admitted:
            events.append(Rejected(peer, code, reason))
            if older:
                events.append(SendFrame(peer, codec.version2_error(self.run_id, SENDER, code, reason)))
            else:
                events.append(Send(peer, codec.ErrorMessage(run_id=self.run_id, round=self.round, sender=SENDER,
                                                            code=code, reason=reason)))
        return events

    def on_hello(self, peer: bytes, hello: codec.Hello, now: float) -> list[Event]:
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
        agent.hello = {"fedge": hello.fedge_version, "torch": hello.torch_version,
                       "capabilities": list(hello.capabilities), "device": hello.device,
                       "input_shape": list(hello.input_shape), "num_outputs": hello.num_outputs}
        self.registry.touch(hello.sender, now)
        events: list[Event] = []
        if first:
            events.append(Noted(logging.INFO, f"agent {hello.sender} registered as client {index} "
                                              f"({hello.dataset_size} samples, torch {hello.torch_version})"))
        events.append(Send(peer, codec.Welcome(run_id=self.run_id, round=self.round, sender=SENDER,
                                               **self.welcome_fields(index))))
        current = self.current
        holds_this_round = current is not None and hello.holds == (self.run_id, current.number)
        if current is not None and index in current.pending and not holds_this_round:
            events.append(self.task(index, now))
        return events

    def on_update(self, peer: bytes, index: int, update: codec.Update, size: int, now: float) -> list[Event]:
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
        if index in current.updates:
            return self.refuse(peer, words.DUPLICATE, f"a second update from client {index} in round {update.round}",
                               now)
        problem = check_update(update, self.shapes, current.masks.get(index, set())) or \
            self.server_check(index, update)
        if problem:
            return self.refuse(peer, words.INVALID_UPDATE, problem, now)
        current.accept(index, update, size)
        agent = self.registry.by_index(index)
        agent.round_s = measured(agent.round_s, max(now - current.started, 0.0))  # task sent to update received
        return []

    def server_check(self, index: int, update: codec.Update) -> str:
        """The server half's own rule for what its aggregate needs of an update (every group and tensor it reads,
        the meta keys it converts), so a lacking update is refused here, never failing inside an aggregate."""
        agent = self.registry.by_index(index)
        return self.server.check_update(update.round, ClientUpdate(
            client_id=agent.client_id, index=index, num_samples=update.num_samples,
            payload=Payload(groups=dict(update.groups), meta=dict(update.meta))))

    def on_bye(self, client_id: str, index: int, bye: codec.Bye) -> list[Event]:
        """The agent leaves: it is no longer awaited in the round in progress."""
        self.registry.agents[client_id].connected = False
        current = self.current
        if current is not None and index in current.pending:
            current.fail(index)
        return [Noted(logging.INFO, f"agent {client_id} left: {bye.reason}")]

    def on_unavailable(self, index: int, round_number: int, reason: str) -> None:
        """A selected agent may not train now: stop waiting for it. Not a failure: the server half keeps what it
        assumes of the device (no ``forget``), and the round does not count it as missed."""
        current = self.current
        if current is not None and current.number == round_number and index in current.chosen and \
                index not in current.updates:
            current.decline(index, reason[:200])

    def on_failed_round(self, index: int, round_number: int) -> list[Event]:
        """An agent could not do its round: stop waiting for it, and let the server half forget what it assumed of
        the device's state (e.g. ef's replica), so the next downlink is self-sufficient."""
        current = self.current
        if current is None or current.number != round_number:  # a stale report: nothing to stop waiting for
            return []
        if index in current.chosen:
            current.fail(index)
        self.forget(index)
        return []

    def on_declined(self, client_id: str, index: int) -> list[Event]:
        """An agent declined the session at its welcome: it is gone, and its index is free again unless it had
        trained (then it keeps it, and the server half forgets what it assumed of the device)."""
        self.registry.agents[client_id].connected = False
        current = self.current
        if current is not None and index in current.chosen:
            current.fail(index)
        if self.registry.release(client_id):
            self.forget(index)
            return [Noted(logging.INFO, f"agent {client_id} declined the session; client index {index} is free "
                                        "again")]
        return []

    def forget(self, index: int) -> None:
        self.server.forget(index)

    # ------------------------------------------------------------------------------------------ the round
    def open_round(self, number: int, selected: Sequence[int], now: float, deadline_s: float,
                   target: int = 0) -> list[Event]:
        """Start round ``number`` with the selected clients: their tasks. ``target``: close it once this many
        updates arrived (over-selection)."""
        if self.current is not None:
            raise RuntimeError(f"round {self.current.number} is still open")
        self.current = RoundState(number=number, selected=list(selected), started=now, deadline=now + deadline_s,
                                  target=target)
        self.pacer.reset()
        return [self.task(index, now) for index in self.current.selected]

    def on_ready(self, index: int, heartbeat: codec.Heartbeat, now: float) -> list[Event]:
        """A paced agent holds its update of the round in progress: its grant, now or when a slot frees."""
        current = self.current
        if not self.pacer.on or current is None or heartbeat.round != current.number or \
                index not in current.pending:
            return []
        again = [self.grant(index)] if self.pacer.ready(index) else []
        return again + self.grants(now)

    def grants(self, now: float) -> list[Event]:
        current = self.current
        if not self.pacer.on or current is None:
            return []
        chosen = self.pacer.next_grants(current.pending,
                                        lambda i: self.registry.alive(self.registry.by_index(i), now))
        return [self.grant(index) for index in chosen]

    def grant(self, index: int) -> Send:
        current = self.current
        assert current is not None
        return Send(self.registry.by_index(index).peer, codec.Grant(run_id=self.run_id, round=current.number,
                                                                    sender=SENDER))

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
        return Send(agent.peer, codec.Task(run_id=self.run_id, round=current.number, sender=SENDER,
                                           groups=dict(payload.groups), meta=dict(payload.meta),
                                           committed_round=self.round, last_accepted_round=agent.last_accepted_round,
                                           deadline_s=max(0.0, current.deadline - now), paced=self.pacer.on,
                                           **self.task_flags(current.number)), task_of=index)

    def sent_task(self, index: int, size: int) -> None:
        """The driver sent a task of ``size`` bytes to ``index`` (0: it could not)."""
        if self.current is not None:
            self.current.bytes_down[index] = self.current.bytes_down.get(index, 0) + size

    def complete(self, now: float) -> bool:
        """Every selected agent reported or failed, the target number of updates arrived, the deadline passed, or
        every awaited agent is gone."""
        current = self.current
        if current is None:
            return True
        if current.target and len(current.updates) >= current.target:
            return True
        if not current.pending or now >= current.deadline:
            return True
        return not any(self.registry.alive(self.registry.by_index(i), now) for i in current.pending)

    def close_round(self, now: float) -> tuple[RoundState, list[Event]]:
        """Close the round in progress: its state, and a Cancel to each selected agent still training it (whose
        round-time estimate is then censored: it did not finish in the time it had)."""
        current = self.current
        if current is None:
            raise RuntimeError("no round is open")
        self.current, self.closed = None, current
        cancels: list[Event] = []
        for index in current.awaited():
            agent = self.registry.by_index(index)
            agent.round_s = censored(agent.round_s, max(now - current.started, 0.0), current.deadline - current.started)
            if agent.connected and agent.peer:
                cancels.append(Send(agent.peer, codec.Cancel(run_id=self.run_id, round=current.number, sender=SENDER,
                                                             reason="the round closed without your update")))
        return current, cancels

    def abandon_round(self) -> None:
        self.current = None

    def commits(self, number: int) -> list[Event]:
        """After round ``number`` was checkpointed: a Commit to each agent whose update it aggregated, and only
        those."""
        closed = self.closed
        if closed is None or closed.number != number:
            raise RuntimeError(f"round {number} is not the round last closed")
        self.round = number
        self.closed = None
        return [Send(self.registry.by_index(i).peer, codec.Commit(run_id=self.run_id, round=number, sender=SENDER))
                for i in sorted(closed.updates)]

    def byes(self, code: str, reason: str) -> list[Event]:
        """A Bye to every connected agent (``code``: vocabulary.BYE_FINISHED ends their session, and hellos are no
        longer answered)."""
        self.over = self.over or code == words.BYE_FINISHED
        return [Send(a.peer, codec.Bye(run_id=self.run_id, round=self.round, sender=SENDER, code=code, reason=reason))
                for a in self.registry.agents.values() if a.connected and a.peer]
