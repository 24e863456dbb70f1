"""What arrives from agents and what is said back: the coordinator's message handlers, as a mixin of ``Session``.

Every message is decoded and validated before it touches state: a malformed, spoofed, late, duplicate, stale or
mismatched packet is answered with an ``ErrorMessage`` naming the reason (and logged), and serving goes on. Hellos
are checked for protocol and model mismatches and for a full session; a failed round lets the server half forget
what it assumed of that device. Knows no algorithm by name and never imports torch.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fedge import codec
from fedge.coordinator.records import check_update

if TYPE_CHECKING:
    from fedge.coordinator.agents import AgentRegistry
    from fedge.coordinator.session import RoundState
    from fedge.coordinator.transport import RouterTransport

log = logging.getLogger("fedge.coordinator")

SENDER = "coordinator"


class Messaging:
    """The handlers; ``Session`` provides the state they read and write."""

    transport: RouterTransport
    registry: AgentRegistry
    current: RoundState | None
    server: Any
    run_id: str
    round: int
    model_hash: str
    shapes: dict[str, tuple[int, ...]]

    def session_meta(self, index: int) -> dict[str, Any]:
        raise NotImplementedError

    def send_task(self, current: RoundState, index: int) -> None:
        raise NotImplementedError

    def send(self, peer: bytes, message: codec.Message) -> int:
        frame = codec.encode(message)
        return len(frame) if self.transport.send(peer, frame) else 0

    def refuse(self, peer: bytes, code: str, reason: str) -> None:
        log.warning("rejected a message from %r: %s (%s)", peer, reason, code)
        self.send(peer, codec.ErrorMessage(run_id=self.run_id, round=self.round, sender=SENDER, code=code,
                                           reason=reason))

    def handle(self, peer: bytes, frame: bytes) -> None:
        try:
            message = codec.decode(frame)
        except codec.CodecError as exc:
            self.refuse(peer, "malformed", f"{type(exc).__name__}: {exc}")
            return
        client_id = peer.decode(errors="replace")
        if message.sender != client_id:
            self.refuse(peer, "sender-mismatch", f"sender {message.sender!r} is not the connection's id")
            return
        if isinstance(message, codec.Hello):
            self.on_hello(peer, message)
            return
        agent = self.registry.get(client_id)
        if agent is None or not agent.connected:
            self.refuse(peer, "hello-first", "this agent has not registered in this session: send a hello")
            return
        self.registry.touch(client_id)
        agent.peer = peer
        if isinstance(message, codec.Heartbeat):
            self.send(peer, codec.Heartbeat(run_id=self.run_id, round=self.round, sender=SENDER))
        elif isinstance(message, codec.Update):
            self.on_update(peer, agent.index, message, len(frame))
        elif isinstance(message, codec.Bye):
            agent.connected = False
            log.info("agent %s left: %s", client_id, message.reason)
        elif isinstance(message, codec.ErrorMessage):
            log.warning("agent %s reports %s: %s", client_id, message.code, message.reason)
            if message.code == "round-failed":
                self.on_failed_round(agent.index, message.round)
            elif message.code in codec.JOIN_REFUSALS:
                self.on_declined(client_id, agent.index)
        else:
            self.refuse(peer, "unexpected", f"a {type(message).__name__} is not expected from an agent")

    def on_hello(self, peer: bytes, hello: codec.Hello) -> None:
        if hello.protocol_version != codec.PROTOCOL_VERSION:
            self.refuse(peer, "protocol-mismatch", f"agent speaks protocol {hello.protocol_version}, "
                        f"this coordinator {codec.PROTOCOL_VERSION}: upgrade the older side")
            return
        if hello.model_hash and hello.model_hash != self.model_hash:
            self.refuse(peer, "model-mismatch", f"agent's model definition {hello.model_hash} differs from the "
                        f"session's {self.model_hash} (different Fedge or torch versions?)")
            return
        index = self.registry.index_of(hello.sender)
        if index is None:
            self.refuse(peer, "session-full", f"the session already has its {self.registry.capacity} clients")
            return
        agent = self.registry.agents[hello.sender]
        first = not agent.connected
        agent.peer, agent.connected, agent.dataset_size = peer, True, hello.dataset_size
        agent.hello = {"fedge": hello.fedge_version, "torch": hello.torch_version,
                       "capabilities": list(hello.capabilities), **dict(hello.meta)}
        self.registry.touch(hello.sender)
        if first:
            log.info("agent %s registered as client %d (%d samples, torch %s)", hello.sender, index,
                     hello.dataset_size, hello.torch_version)
        self.send(peer, codec.Welcome(run_id=self.run_id, round=self.round, sender=SENDER,
                                      meta=self.session_meta(index)))
        current = self.current
        if current is not None and index in current.selected and index not in current.updates:
            self.send_task(current, index)

    def on_update(self, peer: bytes, index: int, update: codec.Update, size: int) -> None:
        current = self.current
        if current is None or update.round != current.number:
            self.refuse(peer, "stale", f"update for round {update.round} arrived outside it "
                        f"(current: {current.number if current else 'none'})")
            return
        if index not in current.selected:
            self.refuse(peer, "not-selected", f"client {index} was not selected in round {update.round}")
            return
        if index in current.updates:
            self.refuse(peer, "duplicate", f"a second update from client {index} in round {update.round}")
            return
        problem = check_update(update, self.shapes, current.masks.get(index, set()))
        if problem:
            self.refuse(peer, "invalid-update", problem)
            return
        current.updates[index] = (update, size)

    def on_declined(self, client_id: str, index: int) -> None:
        """An agent declined the session at its welcome: it is gone, and its index is free again unless it had
        trained (then it keeps it, and the server half forgets what it assumed of the device)."""
        agent = self.registry.get(client_id)
        if agent is not None:
            agent.connected = False
        current = self.current
        if current is not None and index in current.selected:
            current.failed.add(index)
        if self.registry.release(client_id):
            forget = getattr(self.server, "forget", None)
            if forget is not None:
                forget(index)
            log.info("agent %s declined the session; client index %d is free again", client_id, index)

    def on_failed_round(self, index: int, round_number: int) -> None:
        """An agent could not do its round: stop waiting for it, and let the server half forget what it assumed
        of the device's state (e.g. ef's replica), so the next downlink is self-sufficient."""
        current = self.current
        if current is not None and current.number == round_number and index in current.selected:
            current.failed.add(index)
        forget = getattr(self.server, "forget", None)
        if forget is not None:
            forget(index)

