"""Every rule of the agent's side of the round protocol, on the protocol object itself (no sockets, no threads)."""

from __future__ import annotations

import msgpack

from fedge import codec
from fedge.protocol.agent import AgentProtocol
from fedge.protocol.events import CancelTraining, Confirm, Join, Left, Send, SendFrame, Stop, Train
from tests.agent_frames import FACTS, TRAIN, from_coordinator, joined, kinds, task, welcome
from tests.packets import parts, rebuild


def test_a_welcome_is_joined_once_and_a_welcome_back_changes_nothing() -> None:
    p = AgentProtocol("pi", 3.0, facts=FACTS)
    (join,) = [a for a in p.receive(welcome(), 0.0) if isinstance(a, Join)]
    assert join.welcome.train == TRAIN and join.welcome.algorithm == "fedavg"  # typed, as the coordinator sent them
    p.joined("r1", 2, 1.0, 5.0)
    assert kinds(p.receive(welcome(), 1.0)) == []
    assert kinds(p.receive(welcome(run_id="r2"), 2.0)) == ["Join"]  # a new session


def test_a_malformed_welcome_is_declined_in_one_line_and_the_agent_backs_off() -> None:
    packet = welcome()
    tree = parts(packet)
    del tree["header"]["mod"]
    p = AgentProtocol("pi", 3.0, facts=FACTS)
    actions = p.receive(rebuild(packet, tree), 0.0)
    assert kinds(actions) == ["ErrorMessage"]  # plus one line for the log, and no Stop: it will try again
    error = next(a.message for a in actions if isinstance(a, Send))
    assert error.code == "bad-welcome" and "missing ['mod']" in error.reason  # type: ignore[attr-defined]
    tree = parts(packet)
    tree["header"]["tr"] = {**TRAIN, "lr": "fast"}
    assert kinds(AgentProtocol("pi", 3.0, facts=FACTS).receive(rebuild(packet, tree), 0.0)) == ["ErrorMessage"]
    assert p.index is None and kinds(p.tick(2.9)) == [] and kinds(p.tick(3.0)) == ["Hello"]


def test_a_task_whose_body_does_not_decode_is_reported_as_a_failed_round() -> None:
    p = joined()
    packet = task(4)
    at = codec.read_header(packet).body_at
    actions = p.receive(packet[:at] + codec.frames.compress(msgpack.packb({"g": 1, "m": b""})), 0.0)
    assert kinds(actions) == ["ErrorMessage"] and p.holding is None
    error = next(a.message for a in actions if isinstance(a, Send))
    assert (error.code, error.round) == ("round-failed", 4)  # type: ignore[attr-defined]
    assert kinds(joined().receive(b"\x00\x01garbage", 0.0)) == []  # no header: nothing to answer
    foreign = task(4, run_id="other")
    at = codec.read_header(foreign).body_at
    assert kinds(p.receive(foreign[:at] + b"junk", 0.0)) == []  # not our run: dropped


def test_a_packet_of_an_older_wire_format_backs_off_with_the_reason() -> None:
    p = AgentProtocol("pi", 3.0, facts=FACTS)
    older = codec.version2_error("r1", "coordinator", "protocol-mismatch", "upgrade")
    actions = p.receive(older, 0.0)
    notes = [a.text for a in actions if type(a).__name__ == "Noted"]
    assert any("version 2" in n and "upgrade the coordinator" in n for n in notes)
    assert p.refusals == 1 and p.hello_after == 3.0
    newer = bytearray(codec.encode(codec.ErrorMessage(run_id="r1", round=0, sender="coordinator",
                                                      code="protocol-mismatch", reason="upgrade")))
    newer[4] = codec.PROTOCOL_VERSION + 1  # a newer coordinator: this agent is the one to upgrade
    notes = [a.text for a in AgentProtocol("pi", 3.0, facts=FACTS).receive(bytes(newer), 0.0)
             if type(a).__name__ == "Noted"]
    assert any("upgrade the agent" in n for n in notes)


def test_session_level_refusals_back_off_exponentially_up_to_fifteen_minutes() -> None:
    p = AgentProtocol("pi", hello_interval_s=3.0, facts=FACTS)
    full = codec.encode(codec.ErrorMessage(run_id="", round=0, sender="coordinator", code="session-full", reason="x"))
    now, delays = 0.0, []
    for _ in range(12):
        assert kinds(p.receive(full, now)) == []
        delays.append(p.hello_after - now)
        now = p.hello_after
        assert kinds(p.tick(now - 0.01)) == [] and kinds(p.tick(now)) == ["Hello"]
    assert delays[:4] == [3.0, 6.0, 12.0, 24.0] and delays[-1] == 900.0
    p.receive(welcome(), now)
    p.joined("r1", 2, 1.0, 5.0)
    assert p.refusals == 0  # a joined session resets the backoff


def test_a_task_is_trained_only_in_the_joined_run_and_only_when_none_is_held() -> None:
    p = AgentProtocol("pi", 3.0, facts=FACTS)
    assert kinds(p.receive(task(1), 0.0)) == []  # not joined yet
    p = joined()
    assert kinds(p.receive(task(1, run_id="other"), 0.0)) == []
    assert kinds(p.receive(task(1), 0.0)) == ["Train"] and p.holding == 1
    assert kinds(p.receive(task(1), 0.1)) == []  # a resent task while training: ignored
    assert p.holds() == ("r1", 1)
    assert p.finished(1, b"frame") == [SendFrame(b"frame", round=1)] and p.holding is None and p.holds() is None
    assert kinds(p.receive(task(2), 0.2)) == ["Train"]
    assert kinds(p.finished(2, None, "OOM")) == ["ErrorMessage"]


def test_a_securely_aggregated_task_is_never_answered_in_plaintext() -> None:
    """An agent that cannot mask its update reports the round failed rather than train and send it in the clear."""
    p = joined()
    settings = {"bits": 16, "levels": 100, "clip": [0.1], "threshold": 0.6, "neighbours": 50, "seed": 1,
                "attempt": 0}
    actions = p.receive(task(1, secagg=settings), 0.0)
    assert kinds(actions) == ["ErrorMessage"] and p.holding is None
    error = next(a.message for a in actions if isinstance(a, Send))
    assert isinstance(error, codec.ErrorMessage) and error.code == "round-failed"
    assert kinds(p.receive(task(2), 0.1)) == ["Train"]  # a plain round after it is trained as ever


def test_a_cancel_stops_the_round_it_names_and_nothing_is_sent_for_it() -> None:
    p = joined()
    p.receive(task(1), 0.0)
    assert kinds(p.receive(from_coordinator(codec.Cancel, 2, reason="x"), 0.1)) == []  # another round
    assert kinds(p.receive(from_coordinator(codec.Cancel, 1, run_id="r0", reason="x"), 0.1)) == []  # another run
    assert [a for a in p.receive(from_coordinator(codec.Cancel, 1, reason="late"), 0.2)
            if isinstance(a, CancelTraining)] == [CancelTraining(1)]
    p.abandoned()  # the driver's worker ended without an outcome
    assert p.holding is None and kinds(p.finished(1, b"late frame")) == []  # an outcome after all: not sent
    assert kinds(p.receive(task(2), 0.3)) == ["Train"]


def test_a_paced_update_waits_for_its_grant() -> None:
    p = joined()
    p.receive(task(1, paced=True), 0.0)
    (beat,) = [a.message for a in p.finished(1, b"update-1") if isinstance(a, Send)]
    assert isinstance(beat, codec.Heartbeat) and beat.ready and beat.round == 1 and p.holds() == ("r1", 1)
    assert kinds(p.receive(task(1), 0.1)) == []  # still held: a resent task is not trained again
    assert kinds(p.receive(from_coordinator(codec.Grant, 2), 0.1)) == []  # another round's grant
    assert p.receive(from_coordinator(codec.Grant, 1), 0.2)[-1] == SendFrame(b"update-1", round=1)
    assert p.holding is None and kinds(p.receive(from_coordinator(codec.Grant, 1), 0.3)) == []  # once
    p.receive(task(2, paced=True), 0.4)
    p.finished(2, b"update-2")
    assert kinds(p.receive(from_coordinator(codec.Cancel, 2, reason="closed"), 0.5)) == []  # dropped, not sent
    assert p.holding is None and kinds(p.receive(from_coordinator(codec.Grant, 2), 0.6)) == []


def test_commits_are_confirmed_only_for_the_joined_run_and_malformed_packets_change_nothing() -> None:
    p = joined()
    commit = codec.encode(codec.Commit(run_id="r1", round=3, sender="coordinator"))
    assert [a for a in p.receive(commit, 0.0) if isinstance(a, Confirm)] == [Confirm(3)]
    foreign = codec.encode(codec.Commit(run_id="r0", round=3, sender="coordinator"))
    assert kinds(p.receive(foreign, 0.0)) == []
    assert kinds(p.receive(commit + b"\x00", 0.0)) == [] and p.index == 2  # a commit has no body: malformed


def test_byes_and_errors() -> None:
    p = joined()
    finished = from_coordinator(codec.Bye, 5, code="finished", reason="session finished")
    assert [a for a in p.receive(finished, 0.0) if isinstance(a, Left)] == [Left("r1")]  # a service stays up
    assert p.index is None and p.status(training=False) == "waiting for a session"
    assert kinds(p.receive(welcome(run_id="r2"), 1.0)) == ["Join"]  # and joins the next session
    once = AgentProtocol("pi", 3.0, facts=FACTS, stay=False)
    (join,) = [a for a in once.receive(welcome(), 0.0) if isinstance(a, Join)]
    once.joined("r1", 2, 1.0, 5.0)
    assert [a.exit_code for a in once.receive(finished, 0.0) if isinstance(a, Stop)] == [0]
    p = joined()
    later = from_coordinator(codec.Bye, 5, code="stopping", reason="coordinator stopping")
    assert kinds(p.receive(later, 10.0)) == [] and p.last_heard == 0.0
    assert kinds(p.tick(10.0)) == ["Hello", "Heartbeat"]  # a hello at once, then the heartbeat is due
    unknown = from_coordinator(codec.Bye, 5, code="maintenance", reason="a code of a later version")
    assert kinds(joined().receive(unknown, 0.0)) == []  # treated as "stopping": no Stop
    for code, expected in (("hello-first", ["Hello"]), ("session-full", []), ("stale", [])):
        error = codec.encode(codec.ErrorMessage(run_id="r1", round=0, sender="coordinator", code=code, reason="x"))
        assert kinds(joined().receive(error, 0.0)) == expected, code


def test_hello_until_heard_and_heartbeats_on_time() -> None:
    p = AgentProtocol("pi", hello_interval_s=3.0, facts=FACTS)
    assert kinds(p.tick(0.0)) == ["Hello"]
    assert kinds(p.tick(1.0)) == [] and kinds(p.tick(3.0)) == ["Hello"]
    p = joined()  # heard at 0.0, liveness 5, heartbeat every 1 s
    assert kinds(p.tick(0.5)) == ["Heartbeat"] and kinds(p.tick(0.9)) == [] and kinds(p.tick(1.6)) == ["Heartbeat"]
    p.receive(task(3), 1.7)
    (beat,) = [a.message for a in p.tick(2.7, steps=40) if isinstance(a, Send)]
    assert isinstance(beat, codec.Heartbeat) and (beat.round, beat.steps, beat.ready) == (3, 40, False)
    assert "Hello" in kinds(p.tick(8.0))  # nothing heard for longer than the liveness
    assert isinstance(p.hello_now(9.0).message, codec.Hello) and kinds(p.tick(10.0)) == ["Heartbeat"]
    (bye,) = [a.message for a in p.leaving() if isinstance(a, Send)]
    assert isinstance(bye, codec.Bye) and bye.code == "stopping" and kinds(AgentProtocol("x", 1.0, facts=FACTS).leaving()) == []
    assert isinstance(Train(codec.decode(task(1))).task, codec.Task)  # type: ignore[arg-type]



def test_an_agent_that_hears_nothing_for_the_liveness_opens_a_new_connection_once_per_liveness() -> None:
    p = joined()  # liveness 5
    p.receive(from_coordinator(codec.Heartbeat, 0), 1.0)
    assert "Reconnect" not in kinds(p.tick(5.9))
    actions = kinds(p.tick(6.0))
    assert actions.count("Reconnect") == 1 and actions.index("Reconnect") < actions.index("Hello")
    assert "Reconnect" not in kinds(p.tick(10.9)) and "Reconnect" in kinds(p.tick(11.0))  # still nothing: again
    p.receive(from_coordinator(codec.Heartbeat, 0), 11.5)
    assert "Reconnect" not in kinds(p.tick(16.4)) and "Reconnect" in kinds(p.tick(16.5))
    assert "Reconnect" not in kinds(AgentProtocol("pi", 3.0, facts=FACTS).tick(100.0))  # no session, no liveness

def test_the_status_line_says_what_the_agent_is_doing_and_why_it_waits() -> None:
    p = AgentProtocol("pi", 3.0, facts=FACTS)
    assert p.status(training=False) == "waiting for a session"
    full = codec.encode(codec.ErrorMessage(run_id="", round=0, sender="coordinator", code="session-full",
                                           reason="the session already has its 3 clients"))
    p.receive(full, 0.0)
    assert p.status(training=False) == "refused: session-full: the session already has its 3 clients; saying " \
                                       "hello again with backoff"
    p.refuse("plugin-refused", "model 'x:y' is not allowed", 1.0)
    assert p.status(training=False).startswith("declined: plugin-refused: model 'x:y'")
    p = joined()
    assert p.status(training=False) == "idle: client 2 of run r1"
    p.receive(task(4, paced=True), 0.0)
    assert p.status(training=True) == "training round 4 as client 2 of run r1"
    p.finished(4, b"update")
    assert p.status(training=False) == "round 4 trained; its update waits for a grant (run r1)"


def test_a_task_right_after_a_cancel_is_trained_and_a_refusal_mid_round_stops_the_training() -> None:
    p = joined()
    p.receive(task(1), 0.0)
    actions = p.receive(from_coordinator(codec.Cancel, 1, reason="closed"), 0.1)
    assert CancelTraining(1) in actions and p.holding is None  # no longer held, though its worker still stops
    assert kinds(p.receive(task(2), 0.2)) == ["Train"]  # the next round's task is not lost
    assert p.finished(1, b"late") and p.holding == 2  # the stopped round's late outcome is not sent ...
    assert kinds(p.finished(1, b"late")) == []
    assert p.finished(2, b"update-2") == [SendFrame(b"update-2", round=2)]  # ... the new one is
    p.receive(task(3), 0.3)
    full = codec.encode(codec.ErrorMessage(run_id="r1", round=3, sender="coordinator", code="session-full", reason="x"))
    assert CancelTraining(3) in p.receive(full, 0.4)  # leaving the session stops the round it trains
    p = joined()
    p.receive(task(5), 0.0)
    other = p.receive(welcome(run_id="r9"), 0.1)  # another session welcomes us: the old round stops
    assert CancelTraining(5) in other and any(isinstance(a, Join) for a in other) and p.holding is None


def test_after_a_finished_session_the_agent_does_not_say_hello_to_the_closing_coordinator() -> None:
    p = joined()
    p.receive(from_coordinator(codec.Bye, 5, code="finished", reason="session finished"), 10.0)
    assert kinds(p.tick(10.0)) == [] and kinds(p.tick(10.0 + p.hello_interval_s)) == ["Hello"]
