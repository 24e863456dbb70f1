"""The coordinator's last goodbye: it keeps serving until finished agents answer, within a bound.

A coordinator that closed right after sending its final Bye once left an agent waiting for a session that had
ended (seen once in the e2e SIGTERM test; most likely the agent's DEALER, with ZMQ_IMMEDIATE, discarded the unread
Bye when the connection closed). These drive ``Session.say_goodbye`` with the transport's two calls
replaced: ``send`` records, ``pump`` plays the agents' answers.
"""

from __future__ import annotations

import time

from fedge import codec
from fedge.coordinator.session import Session
from fedge.protocol.coordinator import CoordinatorProtocol
from fedge.protocol.registry import Agent, AgentRegistry


def session_with(agents: list[Agent], answer_after: int | None) -> tuple[Session, list[bytes], list[int]]:
    session = Session.__new__(Session)
    registry = AgentRegistry(len(agents), 10.0)
    for agent in agents:
        registry.add(agent)
    session.protocol = CoordinatorProtocol("run", "hash", {}, registry, None, lambda index: {})
    session.protocol.resume("run", 5)
    session.progress = 0
    sent: list[bytes] = []
    pumps: list[int] = []

    def send(peer: bytes, message: codec.Bye) -> int:
        assert isinstance(message, codec.Bye) and message.code == "finished" and message.round == 5
        sent.append(peer)
        return 1

    def pump(timeout_ms: int) -> None:
        pumps.append(timeout_ms)
        if answer_after is not None and len(pumps) >= answer_after:
            for agent in agents:
                agent.connected = False  # what handling the agents' own Bye does
        time.sleep(timeout_ms / 1000)

    session.send, session.pump = send, pump  # type: ignore[method-assign]
    return session, sent, pumps


def agents() -> list[Agent]:
    return [Agent("dev-0", 0, b"dev-0", connected=True), Agent("dev-1", 1, b"dev-1", connected=True),
            Agent("gone", 2, b"gone", connected=False)]


def test_the_coordinator_serves_until_every_told_agent_has_answered() -> None:
    session, sent, pumps = session_with(agents(), answer_after=3)
    session.say_goodbye("finished", "session finished", wait_s=5.0)
    assert sent == [b"dev-0", b"dev-1"]
    assert len(pumps) == 3


def test_the_wait_is_bounded_when_an_agent_never_answers() -> None:
    session, sent, pumps = session_with(agents(), answer_after=None)
    start = time.monotonic()
    session.say_goodbye("finished", "session finished", wait_s=0.3)
    assert 0.3 <= time.monotonic() - start < 2.0 and len(pumps) >= 3
    assert sent == [b"dev-0", b"dev-1"]


def test_no_wait_asked_means_no_serving() -> None:
    session, sent, pumps = session_with(agents(), answer_after=1)
    session.say_goodbye("finished", "session finished")
    assert sent == [b"dev-0", b"dev-1"] and pumps == []
