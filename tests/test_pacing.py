"""Paced uploads: at most fleet.max_uploads updates are granted and not yet received; the next grant follows each
arrival (or an awaited agent's departure); a ready agent granted already is granted again; a paced session gives the
same records as an unpaced one."""

from __future__ import annotations

from pathlib import Path

from fedge import codec
from fedge.protocol.pacing import UploadPacer
from tests.coordinator_frames import hello, protocol, update
from tests.simfleet import InProcessSessions, differences, overrides, records


def grants(events: list) -> list[bytes]:
    return [e.peer for e in events if getattr(e, "message", None) is not None and isinstance(e.message, codec.Grant)]


def ready(sender: str, round_number: int) -> bytes:
    return codec.encode(codec.Heartbeat(run_id="run-1", round=round_number, sender=sender, ready=True))


def test_one_upload_in_flight_at_a_time() -> None:
    p = protocol(3, max_uploads=1)
    for name in ("a", "b", "c"):
        p.receive(name.encode(), hello(name), 0.0)
    tasks = p.open_round(1, [0, 1, 2], 0.0, 60.0)
    assert all(e.message.paced for e in tasks)
    assert grants(p.receive(b"a", ready("a", 1), 1.0)) == [b"a"]
    assert grants(p.receive(b"b", ready("b", 1), 1.0)) == []  # one in flight already
    assert grants(p.receive(b"c", ready("c", 1), 1.0)) == []
    assert grants(p.receive(b"a", ready("a", 1), 1.5)) == [b"a"]  # ready again: its grant was lost, granted again
    assert grants(p.receive(b"a", update(p, "a", 1), 2.0)) == [b"b"]  # a arrived: b, the oldest waiting
    assert grants(p.receive(b"b", codec.encode(codec.Bye(run_id="run-1", round=1, sender="b", code="stopping",
                                                         reason="x")), 2.5)) == []
    assert grants(p.receive(b"c", ready("c", 1), 3.0)) == [b"c"]  # b left: its slot is free
    assert grants(p.receive(b"c", ready("c", 9), 3.5)) == []  # not this round's


def test_unpaced_tasks_say_so_and_grant_nothing() -> None:
    p = protocol(2)
    for name in ("a", "b"):
        p.receive(name.encode(), hello(name), 0.0)
    assert not any(e.message.paced for e in p.open_round(1, [0, 1], 0.0, 60.0))
    assert grants(p.receive(b"a", ready("a", 1), 1.0)) == []


def test_the_pacer_frees_slots_of_agents_no_longer_awaited() -> None:
    pacer = UploadPacer(2)
    for index in (0, 1, 2, 3):
        pacer.ready(index)
    assert pacer.next_grants({0, 1, 2, 3}, lambda i: True) == [0, 1]
    assert pacer.next_grants({0, 1, 2, 3}, lambda i: i != 1) == [2]  # 1 went silent
    assert pacer.next_grants({3}, lambda i: True) == [3]  # 0 and 2 reported


def test_a_paced_session_gives_the_same_records_as_an_unpaced_one(sessions: InProcessSessions,
                                                                  tmp_path: Path) -> None:
    base = overrides("scaffold", 1.0, "simulated", "inline", ("round.deadline_s=30",))
    sessions.run(base, name="free")
    sessions.run([*base, "fleet.max_uploads=1"], name="paced")
    assert differences(records(tmp_path / "free"), records(tmp_path / "paced")) == []
    assert records(tmp_path / "paced")["metrics"][-1]["reported"] == 6
