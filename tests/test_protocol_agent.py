"""Every rule of the agent's side of the round protocol, on the protocol object itself (no sockets, no threads)."""

from __future__ import annotations

from typing import Any

from fedge import codec
from fedge.edge_agent.protocol import AgentProtocol, Confirm, Join, SayHello, Send, Stop, Train

WELCOME = {"run_id": "r1", "client_index": 2, "seed": 0, "model": {"name": "cnn"}, "model_hash": "h",
           "algorithm": {"name": "fedavg"}, "train": {}, "heartbeat_s": 1.0, "liveness_s": 5.0}


def welcome(**meta: Any) -> bytes:
    return codec.encode(codec.Welcome(run_id="r1", round=0, sender="coordinator", meta={**WELCOME, **meta}))


def task(round_number: int, run_id: str = "r1") -> bytes:
    return codec.encode(codec.Task(run_id=run_id, round=round_number, sender="coordinator", groups={}, meta={}))


def kinds(actions: list[Any]) -> list[str]:
    return [type(a).__name__ if not isinstance(a, Send) else type(a.message).__name__ for a in actions
            if type(a).__name__ != "Noted"]


def joined() -> AgentProtocol:
    p = AgentProtocol("pi", hello_interval_s=3.0)
    (join,) = [a for a in p.receive(welcome(), 0.0) if isinstance(a, Join)]
    p.joined(join.meta["run_id"], join.meta["client_index"], 1.0, 5.0)
    return p


def test_a_welcome_is_joined_once_and_a_welcome_back_changes_nothing() -> None:
    p = AgentProtocol("pi", 3.0)
    assert kinds(p.receive(welcome(), 0.0)) == ["Join"]
    p.joined("r1", 2, 1.0, 5.0)
    assert kinds(p.receive(welcome(), 1.0)) == []
    assert kinds(p.receive(welcome(run_id="r2"), 2.0)) == ["Join"]  # a new session


def test_a_malformed_welcome_is_refused_in_one_line_and_the_agent_backs_off() -> None:
    p = AgentProtocol("pi", 3.0)
    without_model = {k: v for k, v in WELCOME.items() if k != "model"}
    frame = codec.encode(codec.Welcome(run_id="r1", round=0, sender="coordinator", meta=without_model))
    actions = p.receive(frame, 0.0)
    assert kinds(actions) == ["ErrorMessage"]  # plus one line for the log, and no Stop: it will try again
    error = next(a.message for a in actions if isinstance(a, Send))
    assert error.code == "bad-welcome" and error.reason == "the welcome lacks model"  # type: ignore[attr-defined]
    assert kinds(AgentProtocol("pi", 3.0).receive(welcome(algorithm=[1]), 0.0)) == ["ErrorMessage"]
    assert p.index is None and kinds(p.tick(2.9)) == [] and kinds(p.tick(3.0)) == ["SayHello"]


def test_session_level_refusals_back_off_exponentially_up_to_fifteen_minutes() -> None:
    p = AgentProtocol("pi", hello_interval_s=3.0)
    full = codec.encode(codec.ErrorMessage(run_id="", round=0, sender="coordinator", code="session-full", reason="x"))
    now, delays = 0.0, []
    for _ in range(12):
        assert kinds(p.receive(full, now)) == []
        delays.append(p.hello_after - now)
        now = p.hello_after
        assert kinds(p.tick(now - 0.01)) == [] and kinds(p.tick(now)) == ["SayHello"]
    assert delays[:4] == [3.0, 6.0, 12.0, 24.0] and delays[-1] == 900.0
    p.receive(welcome(), now)
    p.joined("r1", 2, 1.0, 5.0)
    assert p.refusals == 0  # a joined session resets the backoff


def test_a_task_is_trained_only_in_the_joined_run_and_only_when_none_is_held() -> None:
    p = AgentProtocol("pi", 3.0)
    assert kinds(p.receive(task(1), 0.0)) == []  # not joined yet
    p = joined()
    assert kinds(p.receive(task(1, run_id="other"), 0.0)) == []
    assert kinds(p.receive(task(1), 0.0)) == ["Train"] and p.holding == 1
    assert kinds(p.receive(task(1), 0.1)) == []  # a resent task while training: ignored
    assert p.holds() == {codec.HELLO_HOLDS: ["r1", 1]}
    assert kinds(p.finished(1, b"frame")) == [] and p.holding is None and p.holds() == {}
    assert kinds(p.receive(task(2), 0.2)) == ["Train"]
    assert kinds(p.finished(2, None, "OOM")) == ["ErrorMessage"]


def test_commits_are_confirmed_only_for_the_joined_run_and_malformed_packets_change_nothing() -> None:
    p = joined()
    commit = codec.encode(codec.Commit(run_id="r1", round=3, sender="coordinator"))
    assert [a for a in p.receive(commit, 0.0) if isinstance(a, Confirm)] == [Confirm(3)]
    foreign = codec.encode(codec.Commit(run_id="r0", round=3, sender="coordinator"))
    assert kinds(p.receive(foreign, 0.0)) == []
    assert kinds(p.receive(b"\x00\x01garbage", 0.0)) == [] and p.index == 2


def test_byes_and_errors() -> None:
    p = joined()
    finished = codec.encode(codec.Bye(run_id="r1", round=5, sender="coordinator", reason=codec.SESSION_FINISHED))
    assert [a.exit_code for a in p.receive(finished, 0.0) if isinstance(a, Stop)] == [0]
    p = joined()
    later = codec.encode(codec.Bye(run_id="r1", round=5, sender="coordinator", reason="coordinator stopping"))
    assert kinds(p.receive(later, 10.0)) == [] and p.last_heard == 0.0
    assert kinds(p.tick(10.0)) == ["SayHello", "Heartbeat"]  # a hello at once, then the heartbeat is due
    for code, expected in (("hello-first", ["SayHello"]), ("session-full", []), ("stale", [])):
        error = codec.encode(codec.ErrorMessage(run_id="r1", round=0, sender="coordinator", code=code, reason="x"))
        assert kinds(joined().receive(error, 0.0)) == expected, code


def test_hello_until_heard_and_heartbeats_on_time() -> None:
    p = AgentProtocol("pi", hello_interval_s=3.0)
    assert kinds(p.tick(0.0)) == ["SayHello"]
    assert kinds(p.tick(1.0)) == [] and kinds(p.tick(3.0)) == ["SayHello"]
    p = joined()  # heard at 0.0, liveness 5, heartbeat every 1 s
    assert kinds(p.tick(0.5)) == ["Heartbeat"] and kinds(p.tick(0.9)) == [] and kinds(p.tick(1.6)) == ["Heartbeat"]
    assert "SayHello" in kinds(p.tick(6.0))  # nothing heard for longer than the liveness
    assert isinstance(p.hello_now(7.0), SayHello) and kinds(p.tick(8.0)) == ["Heartbeat"]
    assert kinds(p.leaving()) == ["Bye"] and kinds(AgentProtocol("x", 1.0).leaving()) == []
    assert isinstance(Train(codec.decode(task(1))).task, codec.Task)  # type: ignore[arg-type]
