"""The simulated clock's pure parts (docs/scale.md, "A simulated clock"): a device trace read from its CSV, a device's
budget in simulated seconds cutting its steps as an agent's budget does, and the calendar of jobs and moves
(``simulation.schedule``) in the order the clock meets them."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from fedge.simulation.schedule import JobSchedule, Move
from fedge.simulation.timing import DeviceTiming, DeviceTrace

TRACE = """client,speed,from_s,until_s
0,2.5,,
1,,10,20
1,,30,
2,0.5,0,3
2,,3,5
"""


def test_a_trace_gives_speeds_and_intervals_and_its_moves_in_time_order() -> None:
    trace = DeviceTrace.parse(TRACE, clients=4)
    assert trace.speeds == {0: 2.5, 2: 0.5}
    assert [trace.available(1, t) for t in (0, 9.99, 10, 19.99, 20, 29, 30, 1e9)] == \
        [False, False, True, True, False, False, True, True]
    assert trace.available(0, 1e6) and trace.available(3, 0.0) and not trace.available(2, 5.0)
    assert trace.changes() == [(5.0, 2, False), (10.0, 1, True), (20.0, 1, False), (30.0, 1, True)]
    timing = DeviceTiming(seed=1, trace=trace)
    assert timing.speed(0) == 2.5 and timing.speed(3) == DeviceTiming(seed=1).speed(3)


@pytest.mark.parametrize(("text", "said"), [
    ("client,speed\n0,1\n", "first line must be client,speed,from_s,until_s"),
    ("client,speed,from_s,until_s\n0,1,,\n7,1,,\n", "trace line 3: client 7 is not one of the fleet's 4"),
    ("client,speed,from_s,until_s\n0,-1,,\n", "trace line 2: speed must lie in [1e-06, 1e+06], got -1"),
    ("client,speed,from_s,until_s\n0,1e308,,\n", "trace line 2: speed must lie in"),
    ("client,speed,from_s,until_s\n0,nan,,\n", "trace line 2: speed must lie in"),
    ("client,speed,from_s,until_s\n0,,nan,\n", "trace line 2: an interval needs"),
    ("client,speed,from_s,until_s\n0,1,,\n0,2,,\n", "trace line 3: client 0 has two speeds"),
    ("client,speed,from_s,until_s\n0,,5,5\n", "trace line 2: an interval needs 0 <= from_s < until_s"),
    ("client,speed,from_s,until_s\n0,,0,10\n0,,5,20\n", "client 0's intervals overlap"),
    ("client,speed,from_s,until_s\n0,1,2\n", "trace line 2:"),
    ("client,speed,from_s,until_s\nx,1,,\n", "trace line 2:"),
])
def test_a_bad_trace_is_refused_naming_its_line(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        DeviceTrace.parse(text, clients=4)


def agent_steps(planned: int, step_time: float, max_seconds: float) -> int:
    """An agent's training loop under agent.max_seconds: the budget is checked before every step but the first."""
    steps = 0
    while steps < planned:
        if steps and steps * step_time >= max_seconds:
            break
        steps += 1
    return steps


def test_a_budget_in_simulated_seconds_cuts_the_steps_where_an_agents_budget_would() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        timing = DeviceTiming(seed=int(rng.integers(1000)), step_s=float(rng.uniform(0.01, 1.0)),
                              max_seconds=float(rng.choice([rng.uniform(0.001, 5.0), 2.0, 0.3])))
        client, task, planned = int(rng.integers(50)), int(rng.integers(1, 500)), int(rng.integers(1, 40))
        assert timing.steps_within(client, task, planned) == \
            agent_steps(planned, timing.step_time(client, task), timing.max_seconds)
    assert DeviceTiming().steps_within(0, 1, 17) == 17  # no budget: every step planned


def test_the_calendar_takes_jobs_by_finish_skips_cancelled_ones_and_puts_uploads_and_moves_in_their_place() -> None:
    trace = DeviceTrace.parse("client,speed,from_s,until_s\n2,,0,2.5\n", clients=3)
    timing = DeviceTiming(seed=0, step_s=1.0, speeds="equal", jitter_sigma=0.0, bandwidth_bps=8000.0, trace=trace)
    calendar = JobSchedule(timing, ["a", "b", "c"])
    assert calendar.absent_at(0.0) == set() and calendar.absent_at(2.5) == {"c"}
    assert calendar.add("a", 1, planned=3, nbytes=1000, now=0.0) == 0  # 3 steps + 1000 bytes at 1 kB/s: 4 s
    calendar.add("b", 2, planned=1, nbytes=0, now=0.0)                  # 1 s
    calendar.add("c", 3, planned=2, nbytes=0, now=0.0)                  # 2 s, then cancelled
    calendar.drop("c", 3)
    when, entry = calendar.next(0.0, math.inf, 0.1)
    assert (when, entry) == (1.0, (1.0, 2, "b", 2, False))
    when, move = calendar.next(1.0, math.inf, 0.1)  # c's job is taken off silently; c goes at 2.5, before a's 4
    assert (when, move) == (2.5, Move(2.5, "c", False)) and calendar.skipped == [("c", 3)]
    when, entry = calendar.next(2.5, math.inf, 0.1)
    assert when == 4.0 and entry is not None and not isinstance(entry, Move)
    calendar.upload(entry, nbytes=2000)  # its update's 2,000 bytes: 2 s more on the link
    assert calendar.next(4.0, 5.0, 0.1) == (4.1, None)  # due after the session's horizon: a poll's wait passes,
    assert calendar.next(4.1, 5.0, 10.0) == (5.0, None)  # and the horizon holds the clock
    assert calendar.next(5.0, math.inf, 0.1) == (6.0, (6.0, 1, "a", 1, True))
    assert calendar.next(6.0, math.inf, 0.25) == (6.25, None)  # nothing due: a poll's wait passes


def test_the_calendar_resumes_with_its_jobs_numbers_finishes_and_budgets() -> None:
    timing = DeviceTiming(seed=4, step_s=0.5, max_seconds=1.2)
    first = JobSchedule(timing, ["a", "b"])
    budgets = [first.add("a", 1, planned=10, nbytes=0, now=0.0), first.add("b", 2, planned=10, nbytes=0, now=0.0)]
    first.next(0.0, math.inf, 0.1)  # one of them arrives before the checkpoint
    state = first.state()
    second = JobSchedule(timing, ["a", "b"])
    [(finish, job, client, round_number, _)] = second.restore(state)
    assert second.add(client, round_number, planned=10, nbytes=0, now=123.0) == budgets[job - 1] > 0
    assert second.next(123.0, math.inf, 0.1) == (finish, (finish, job, client, round_number, False))
    assert second.add("a", 5, planned=10, nbytes=0, now=200.0) >= 0 and second.jobs == 3  # numbering goes on


def test_a_device_that_comes_back_by_its_trace_says_hello_at_that_time(tmp_path: Path) -> None:
    """Not when its hello interval would next allow: the same moment whether or not the fleet was restarted since
    its last hello (a resumed run's clients are new)."""
    from fedge import codec
    from fedge.simulation.backends import InlineBackend
    from fedge.simulation.fleet import SimulatedFleet
    from fedge.simulation.timing import SimulatedClock
    from fedge.simulation.worker import ClientFiles

    trace = DeviceTrace.parse("client,speed,from_s,until_s\n0,,0,0.5\n0,,0.9,\n", clients=2)
    clock = SimulatedClock()
    fleet = SimulatedFleet([ClientFiles(f"c{i}", "unused.npz", str(tmp_path / f"c{i}")) for i in range(2)],
                           InlineBackend(), (4,), 2, [10, 10], clock=clock, timing=DeviceTiming(trace=trace),
                           steps=lambda _samples: 1)

    def hellos(timeout_ms: int) -> list[tuple[str, float]]:
        return [(peer.decode(), clock()) for peer, frame, _ in fleet.poll(timeout_ms)
                if codec.packet_kind(frame) is codec.Hello]

    assert sorted(hellos(0)) == [("c0", 0.0), ("c1", 0.0)]
    assert hellos(600) == [] and clock() == 0.5  # c0 goes (it never joined: nothing to say)
    assert hellos(300) == [] and clock() == 0.8
    assert hellos(300) == [("c0", 0.9)]  # back at 0.9, 0.9 s after its last hello
