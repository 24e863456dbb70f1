"""Asynchronous rounds in a session (docs/protocol.md, "Asynchronous rounds"): the coordinator protocol's rules for
tasks and versions, on the protocol object; simulated fleets' sessions, played in this process, and the coordinator
processes that crash at a version's checkpoint (their fleets inline) and resume; and real agent processes, two of
them slowed, that the others never wait for."""

from __future__ import annotations

import json
import logging
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedge import codec
from fedge.coordinator import crashpoints
from fedge.protocol.asynchronous import AsyncRounds, AsyncSettings
from fedge.protocol.events import Accepted, Checkpoint
from fedge.protocol.versions import VersionRounds
from tests.coordinator_frames import codes, frame, hello, joined, protocol, sent
from tests.e2e import FAST, Processes, endpoint, finished, metrics, shards
from tests.simfleet import InProcessSessions, resume_here, run_here


def delta_update(sender: str, task: int, shift: float = 0.1, arrays: dict[str, np.ndarray] | None = None) -> bytes:
    assert arrays is not None
    delta = {k: np.full_like(v, shift) if v.dtype.kind == "f" else v for k, v in arrays.items()}
    return frame(codec.Update(run_id="run-1", round=task, sender=sender, num_samples=10,
                              groups={"delta": codec.TensorGroup(dense=delta)}))


def versioned(settings: AsyncSettings, deadline_s: float = 60.0):  # type: ignore[no-untyped-def]
    p = protocol(capacity=3, options={"upload": "delta"})
    joined(p, "a", "b", "c")
    versions = VersionRounds(AsyncRounds(settings), p.registry, p.shapes, lambda _task: {}, deadline_s, 0.0)
    p.start_versions(versions)
    return p, versions


def task_of(events: Any) -> codec.Task:
    task = sent([events])[0] if not isinstance(events, list) else sent(events)[0]
    assert isinstance(task, codec.Task)
    return task


def test_a_task_is_numbered_and_its_update_accepted_with_its_staleness_discount() -> None:
    p, versions = versioned(AsyncSettings(concurrency=3, buffer=1, max_staleness=2))
    arrays = p.server.evaluation_arrays()
    first, second = task_of(p.dispatch(0, 0.0)), task_of(p.dispatch(1, 0.0))
    assert (first.round, second.round) == (1, 2)  # a task's round on the wire is its task id
    accepted = p.receive(b"a", delta_update("a", first.round, arrays=arrays), 1.0)
    assert isinstance(accepted[0], Accepted) and accepted[0].update.discount == 1.0
    p.close_version(1.0)
    late = p.receive(b"b", delta_update("b", second.round, arrays=arrays), 2.0)
    assert isinstance(late[0], Accepted) and late[0].update.discount == pytest.approx(2 ** -0.5)
    assert late[0].update.counted == 1.0  # normalize "count"


def test_an_update_of_another_devices_task_or_of_a_cancelled_one_is_refused_with_its_reason() -> None:
    p, versions = versioned(AsyncSettings(concurrency=3, buffer=2, max_staleness=0))
    arrays = p.server.evaluation_arrays()
    mine, theirs = task_of(p.dispatch(0, 0.0)), task_of(p.dispatch(1, 0.0))
    assert codes(p.receive(b"a", delta_update("a", theirs.round, arrays=arrays), 1.0)) == ["stale"]
    p.receive(b"a", delta_update("a", mine.round, arrays=arrays), 1.0)
    _, _, cancels = p.close_version(1.0)  # max_staleness 0: b's task can only be refused now: cancelled
    cancelled = [m for m in sent(cancels) if isinstance(m, codec.Cancel)]
    assert [(m.round, m.sender) for m in cancelled] == [(theirs.round, "coordinator")]
    refused = p.receive(b"b", delta_update("b", theirs.round, arrays=arrays), 2.0)
    assert codes(refused) == ["stale"] and "not in flight" in refused[0].reason


def test_a_malformed_update_fails_its_task_and_the_device_may_be_tasked_again() -> None:
    p, versions = versioned(AsyncSettings(concurrency=3, buffer=2))
    task = task_of(p.dispatch(0, 0.0))
    bad = frame(codec.Update(run_id="run-1", round=task.round, sender="a", num_samples=10,
                             groups={"delta": codec.TensorGroup(dense={"nope": np.zeros(3, np.float32)})}))
    assert codes(p.receive(b"a", bad, 1.0)) == ["invalid-update"]
    assert versions.held_by(0) is None and versions.idle([0, 1, 2]) == [0, 1, 2]


def test_a_device_that_fails_leaves_or_says_hello_without_its_task_is_no_longer_awaited() -> None:
    p, versions = versioned(AsyncSettings(concurrency=3, buffer=2))
    tasks = [task_of(p.dispatch(i, 0.0)) for i in range(3)]
    p.receive(b"a", frame(codec.ErrorMessage(run_id="run-1", round=tasks[0].round, sender="a", code="round-failed",
                                             reason="out of memory")), 1.0)
    p.receive(b"b", frame(codec.Bye(run_id="run-1", round=0, sender="b", code="shutdown", reason="bye")), 1.0)
    p.receive(b"c", hello("c", holds=("run-1", tasks[2].round)), 1.0)  # still holds it: still awaited
    assert sorted(versions.rounds.busy()) == [2]
    p.receive(b"c", hello("c"), 2.0)  # restarted without it
    assert versions.rounds.busy() == set()


def test_a_task_past_its_deadline_is_cancelled_and_a_flush_checkpoints_before_it_commits() -> None:
    p, versions = versioned(AsyncSettings(concurrency=3, buffer=1), deadline_s=10.0)
    arrays = p.server.evaluation_arrays()
    slow, quick = task_of(p.dispatch(0, 0.0)), task_of(p.dispatch(1, 5.0))
    expired = versions.expire("run-1", 12.0, lambda _index: True)
    assert [(m.round, type(m).__name__) for m in sent(expired)] == [(slow.round, "Cancel")]
    p.receive(b"b", delta_update("b", quick.round, arrays=arrays), 12.0)
    flush, record, _ = p.close_version(12.0)
    events = p.flush_version(flush.version)
    assert isinstance(events[0], Checkpoint) and events[0].round == 1
    commits = [m for m in sent(events[1:]) if isinstance(m, codec.Commit)]
    assert [(m.round, m.run_id) for m in commits] == [(quick.round, "run-1")] and p.round == 1
    assert [u[0] for u in record.updates] == [1]


# ------------------------------------------------------------------------------------------------ sessions
def run_rows(run_dir: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines() if line.strip()]


ASYNC = ("model.name=mlp", "fleet.mode=simulated", "fleet.backend=inline", "fleet.clock=simulated", "round.mode=async",
         "run.export_onnx=false")


def simulated_async(run_dir: Path, rounds: int, *settings: str, status: str = "done") -> dict[str, Any]:
    """The session ``coordinator start --rounds N`` plays, of an asynchronous session of a simulated fleet (inline,
    on the simulated clock, an MLP) with these further settings, played in this process; its report."""
    return run_here([*ASYNC, f"run.rounds={rounds}", *settings], run_dir, status=status)


def crashing(procs: Processes, at: str, sets: list[str], run_dir: Path,
             name: str) -> subprocess.Popen[bytes]:
    """`coordinator start --set ... --run-dir RUN` that exits (70) at ``at`` (FEDGE_CRASH_AT=POINT:ROUND)."""
    assert crashpoints.CRASH_AT == ""  # (read at import: this process never crashes)
    return procs.cli(sets, run_dir, name=name, crash_at=at)


def test_a_simulated_async_session_resumes_after_a_crash_at_a_versions_checkpoint(
        procs: Processes, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The coordinator's process (its fleet inline) ends at version 3's checkpoint; the run resumed (in this
    process, through `coordinator start --resume`'s rules) takes up the tasks in flight."""
    run_dir = tmp_path / "run"
    common = ["run.rounds=5", "model.name=mlp", "fleet.mode=simulated", "fleet.backend=inline", "data.clients=6",
              "data.train_limit=300", "round.mode=async", "algorithm.name=fedavg", "asynchronous.buffer=2",
              "asynchronous.concurrency=3", "run.export_onnx=false"]
    crashed = crashing(procs, "checkpoint:3", common, run_dir, "crashed")
    assert finished(crashed, 240) == 70, procs.output("crashed")
    from fedge.plumbing import load_arrays

    _, meta = load_arrays(run_dir / "checkpoint.npz")
    restored = [task for task, *_ in meta["asynchronous"]["in_flight"]]
    assert meta["round"] == 3 and restored, meta["asynchronous"]
    caplog.set_level(logging.INFO)
    assert resume_here(run_dir)["status"] == "done"
    log = "\n".join(caplog.messages)  # what coordinator.log holds of the resumed run
    for task in restored:  # the restarted fleet's devices said hello without them: not awaited until a deadline
        assert f"task {task} of client" in log and "said hello without it" in log, task
    rows = metrics(run_dir)
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5] and all(r["updates"] == 2 for r in rows)
    assert all(r["test_accuracy"] is not None for r in rows)
    clients = run_rows(run_dir, "clients.jsonl")
    assert [c["round"] for c in clients] == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    tasks = [c["task"] for c in clients]
    assert len(set(tasks)) == len(tasks)  # no task counted twice across the crash
    assert all(c["staleness"] <= 10 for c in clients) and any(c["staleness"] > 0 for c in clients)


def test_real_agents_two_of_them_slowed_never_hold_the_others_back(procs: Processes, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str],
                                                                   logging_kept: None) -> None:
    """5 agents, 2 of them 0.4 s a step slower: versions of 3 updates go on without them."""
    data, run_dir = shards(tmp_path, 5), tmp_path / "run"
    coordinator = procs.coordinator(
        "--bind", "tcp://127.0.0.1:0", "--expect", "5", "--rounds", "8", "--run-dir", str(run_dir),
        "--set", "data.clients=5", "--set", "round.mode=async", "--set", "algorithm.name=fedavg",
        "--set", "asynchronous.concurrency=5", "--set", "asynchronous.buffer=3", "--set", "asynchronous.max_staleness=4",
        "--set", "round.deadline_s=60", *FAST)
    address = endpoint(run_dir)
    for i in range(5):
        slow = ["--step-delay-s", "0.4"] if i >= 3 else []
        procs.agent("--coordinator", address, "--client-id", f"dev-{i}", "--data", str(data / f"client-{i:03d}.npz"),
                    "--state-dir", str(tmp_path / f"state-{i}"), "--max-steps", "4", *slow, name=f"agent-{i}")
    assert finished(coordinator, 300) == 0, procs.output("coordinator")
    rows = metrics(run_dir)
    assert [r["round"] for r in rows] == list(range(1, 9)) and all(r["updates"] == 3 for r in rows)
    clients = run_rows(run_dir, "clients.jsonl")
    by_device: dict[int, int] = {}
    for row in clients:
        by_device[row["client_index"]] = by_device.get(row["client_index"], 0) + 1
    ids = {row["client_index"]: row["client_id"] for row in clients}
    slow_indices = {i for i, cid in ids.items() if cid in ("dev-3", "dev-4")}
    fast = [n for i, n in by_device.items() if i not in slow_indices]
    slowed = [by_device.get(i, 0) for i in slow_indices]
    assert sum(fast) >= 20 and max(slowed, default=0) < min(fast), by_device  # the fast devices did the work
    late = [row["staleness"] for row in clients if row["client_index"] in slow_indices]
    assert all(s >= 1 for s in late), late  # a slowed device's update arrives versions after its base
    # the run's dispatch journal, played again through the simulated fleet (`coordinator replay`, in this process):
    # the same final model, bit for bit
    from fedge.runtime.cli import main

    given = [f"--data=dev-{i}={data / f'client-{i:03d}.npz'}" for i in range(5)]
    capsys.readouterr()
    code, said = main(["replay", str(run_dir), *given]), capsys.readouterr()
    assert code == 0, said.out + said.err
    assert "the final model is the run's, bit for bit" in said.out
    journal = run_rows(run_dir, "dispatches.jsonl")
    replayed = run_rows(run_dir / "replay", "dispatches.jsonl")
    assert [{k: v for k, v in e.items() if k != "t"} for e in replayed] == \
        [{k: v for k, v in e.items() if k != "t"} for e in journal][:len(replayed)]
    assert [r["updates"] for r in metrics(run_dir / "replay")] == [3] * 8


def test_a_devices_second_task_on_one_version_is_its_next_attempt_and_only_its_last_task_is_committed() -> None:
    p, versions = versioned(AsyncSettings(concurrency=3, buffer=2, max_staleness=2))
    arrays = p.server.evaluation_arrays()
    first = task_of(p.dispatch(0, 0.0))
    assert (first.base_version, first.attempt) == (0, 0)
    p.receive(b"a", delta_update("a", first.round, arrays=arrays), 1.0)
    again = task_of(p.dispatch(0, 1.0))  # its update is in: a stateless device takes the next task at once
    assert (again.base_version, again.attempt) == (0, 1) and again.round > first.round
    other = task_of(p.dispatch(1, 1.0))
    p.receive(b"b", delta_update("b", other.round, arrays=arrays), 2.0)
    flush, _, _ = p.close_version(2.0)
    commits = [m for m in sent(p.flush_version(flush.version)) if isinstance(m, codec.Commit)]
    # a's first task is superseded (its next task discarded what it left pending); b's is committed
    assert [(m.round) for m in commits] == [other.round]


def test_a_device_that_declines_with_an_update_in_the_version_keeps_its_index_until_the_commits() -> None:
    p, versions = versioned(AsyncSettings(concurrency=3, buffer=2))
    arrays = p.server.evaluation_arrays()
    task = task_of(p.dispatch(0, 0.0))
    p.receive(b"a", delta_update("a", task.round, arrays=arrays), 1.0)
    p.receive(b"a", frame(codec.ErrorMessage(run_id="", round=0, sender="a", code="model-failed",
                                             reason="declined")), 1.5)
    assert p.registry.get("a") is not None and p.registry.agents["a"].index == 0  # not handed to a newcomer
    other = task_of(p.dispatch(1, 2.0))
    p.receive(b"b", delta_update("b", other.round, arrays=arrays), 2.0)
    flush, record, _ = p.close_version(2.0)
    assert [u[0] for u in record.updates] == [0, 1]
    p.flush_version(flush.version)  # its Commit names client 0 as it was: no KeyError, no other device's peer


def test_an_update_after_the_session_has_its_versions_or_beyond_a_full_version_is_refused() -> None:
    p, versions = versioned(AsyncSettings(concurrency=3, buffer=1))
    arrays = p.server.evaluation_arrays()
    tasks = [task_of(p.dispatch(i, 0.0)) for i in range(1)]
    p.receive(b"a", delta_update("a", tasks[0].round, arrays=arrays), 1.0)
    late = task_of(p.dispatch(1, 1.0))  # (max_staleness 10 leaves room)
    assert versions.rounds.flush_due  # a driver that reads on past the K-th update gets a refusal, never an exception
    assert codes(p.receive(b"b", delta_update("b", late.round, arrays=arrays), 1.5)) == ["stale"]
    flush, _, _ = p.close_version(2.0)
    p.flush_version(flush.version)
    versions.finish()
    after = task_of(p.dispatch(2, 2.0))
    refused = p.receive(b"c", delta_update("c", after.round, arrays=arrays), 3.0)
    assert codes(refused) == ["stale"] and "has its 1 versions" in refused[0].reason


def test_what_crosses_the_sessions_goodbye_is_dropped_without_a_refusal() -> None:
    p, versions = versioned(AsyncSettings(concurrency=3, buffer=2))
    arrays = p.server.evaluation_arrays()
    task = task_of(p.dispatch(0, 0.0))
    p.byes("finished", "the session is over")
    late = p.receive(b"a", delta_update("a", task.round, arrays=arrays), 1.0)
    assert codes(late) == [] and not any(isinstance(e, Accepted) for e in late)
    p.receive(b"a", frame(codec.Bye(run_id="run-1", round=0, sender="a", code="finished", reason="bye")), 1.0)
    assert not p.registry.agents["a"].connected  # its own goodbye is still heard


TIMINGS = ("wall_s", "train_s_max", "eval_s", "checkpoint_s", "receive_s", "fold_s", "downlink_s", "close_s", "tail_s")


TRACE = "client,speed,from_s,until_s\n1,,0,0.5\n1,,0.9,\n2,,0.3,\n5,,0,1.5\n"


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    """An asynchronous ef-fedprox session on the simulated clock (devices coming and going by a trace, budgets in
    simulated seconds, both packets on the link), without its backend; and its uninterrupted run, inline in this
    process: the run every other backend and a crashed-and-resumed run must be, bit for bit (played once)."""
    root = tmp_path_factory.mktemp("traced")
    trace = root / "trace.csv"
    trace.write_text(TRACE)
    common = ["run.rounds=6", "model.name=mlp", "fleet.mode=simulated", "fleet.clock=simulated", "data.clients=8",
              "data.train_limit=300", "round.mode=async", "algorithm.name=ef-fedprox", "asynchronous.buffer=2",
              "asynchronous.concurrency=4", f"fleet.trace={trace}", "fleet.max_seconds=0.3", "fleet.bandwidth_bps=2e7",
              "run.export_onnx=false"]
    run_here([*common, "fleet.backend=inline"], root / "whole")
    return common, root / "whole"


def untimed(run_dir: Path, name: str) -> list[dict[str, Any]]:
    """A run's records without what depends on the machine's time."""
    return [{k: v for k, v in row.items() if k not in (*TIMINGS, "train_s")} for row in run_rows(run_dir, name)]


def test_a_session_on_the_simulated_clock_is_the_same_bit_for_bit_on_every_backend(
        sessions: InProcessSessions, traced: tuple[list[str], Path]) -> None:
    """The session played in this process on the inline backend (the shared run) and on worker processes (the local
    backend)."""
    common, whole = traced
    sessions.run([*common, "fleet.backend=local", "fleet.workers=2"], name="local")
    local = sessions.root / "local"
    runs = {"inline": [{k: v for k, v in row.items() if k not in TIMINGS} for row in metrics(whole)],
            "local": [{k: v for k, v in row.items() if k not in TIMINGS} for row in metrics(local)]}
    assert runs["inline"] == runs["local"]
    assert untimed(whole, "clients.jsonl") == untimed(local, "clients.jsonl")
    times = [row["sim_time_s"] for row in runs["inline"]]
    assert times == sorted(times) and times[0] > 0 and len(times) == 6
    with np.load(whole / "model.npz") as a, np.load(local / "model.npz") as b:
        assert a.files == b.files and all(np.array_equal(a[name], b[name]) for name in a.files)


def test_on_the_simulated_clock_tasks_longer_than_the_liveness_lose_no_device(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The clock jumps past fleet.liveness_s (20 s) while a task trains: the devices' heartbeats of the new time are
    heard before the update that moved it, so no live device's task is dropped."""
    run_dir = tmp_path / "run"
    caplog.set_level(logging.INFO)
    simulated_async(run_dir, 4, "fleet.step_s=20", "data.clients=8", "data.train_limit=300", "algorithm.name=fedavg",
                    "asynchronous.buffer=2", "asynchronous.concurrency=4")
    rows = metrics(run_dir)
    assert len(rows) == 4 and rows[0]["sim_time_s"] > 20
    log = "\n".join(caplog.messages)  # what coordinator.log holds
    assert re.search(r"task \d+ of client|rejected a message|not in flight", log) is None, log[-2000:]


def test_a_synchronous_round_on_the_simulated_clock_closes_at_its_deadline_and_a_resume_keeps_the_time(
        procs: Processes, tmp_path: Path) -> None:
    """Tasks of 4-16 simulated seconds against a 30 s deadline: a round closes at its deadline (no update after it is
    taken, no time lost to the cancelled jobs), and a run resumed after a crash (the coordinator's process, its fleet
    inline; resumed in this process through `coordinator start --resume`'s rules) goes on from the checkpoint's
    time."""
    run_dir = tmp_path / "run"
    common = ["run.rounds=4", "model.name=mlp", "fleet.mode=simulated", "fleet.backend=inline",
              "fleet.clock=simulated", "fleet.step_s=4", "round.deadline_s=30", "data.clients=8",
              "data.train_limit=600", "round.fraction=0.5", "algorithm.name=fedavg", "run.export_onnx=false"]
    assert finished(crashing(procs, "committed:2", common, run_dir, "first"), 240) == 70, \
        procs.output("first")
    assert resume_here(run_dir)["status"] == "done"
    rows = metrics(run_dir)
    times = [row["sim_time_s"] for row in rows]
    assert [row["round"] for row in rows] == [1, 2, 3, 4] and times == sorted(times), times
    steps = np.diff([0.0, *times])
    assert all(step <= 30.0 + 0.5 for step in steps), times  # each round ends by its deadline (it opens within 0.5 s)
    assert any(row["dropped"] > 0 for row in rows)  # some devices were too slow for it
    assert all(row["reported"] + row["dropped"] == row["selected"] for row in rows)


def test_a_device_that_declines_with_its_task_still_in_flight_keeps_its_index_for_the_versions_records() -> None:
    p, versions = versioned(AsyncSettings(concurrency=3, buffer=1))
    arrays = p.server.evaluation_arrays()
    p.sent_task(0, 100)
    gone = task_of(p.dispatch(0, 0.0))
    p.sent_task(0, 100)
    p.receive(b"a", frame(codec.ErrorMessage(run_id="", round=0, sender="a", code="model-failed",
                                             reason="declined")), 0.5)
    assert versions.held_by(0) is None and p.registry.agents["a"].index == 0  # lost, but not handed on
    other = task_of(p.dispatch(1, 1.0))
    p.receive(b"b", delta_update("b", other.round, arrays=arrays), 1.0)
    _, record, _ = p.close_version(1.0)
    assert 0 in record.bytes_down and p.registry.by_index(0).client_id == "a" and gone.round == 1


def joined_session(run_dir: Path, algorithm: str) -> tuple[Any, Any]:
    """A session (``coordinator.session.Session``) of four simulated devices, built as ``coordinator start`` builds
    it (``runtime.launch``), the fourth away until 100 s (a trace): the three there said hello and were welcomed
    over the fleet (``Session.wait_for_agents``). Its versions (``coordinator.asynchronous.start``) and the fleet."""
    from fedge.coordinator import asynchronous
    from fedge.coordinator.config import load_config
    from fedge.coordinator.rundir import RunDir
    from fedge.coordinator.session import Session
    from fedge.runtime.launch import prepare_local_fleet, simulated_fleet
    from fedge.runtime.plan import plan_session

    run_dir.mkdir(parents=True)
    (run_dir / "trace.csv").write_text("client,speed,from_s,until_s\n3,,100,\n")
    plan = plan_session(load_config(None, [*ASYNC, f"algorithm.name={algorithm}", "data.clients=4",
                                           "data.train_limit=20", "asynchronous.buffer=3", "robust.quarantine_after=1",
                                           f"fleet.trace={run_dir / 'trace.csv'}"]))
    files = RunDir(run_dir)
    agents = prepare_local_fleet(plan, files)
    fleet = simulated_fleet(plan, agents)
    session = Session(plan.config, files, fleet, plan.spec, len(agents), None, run_id="run-1",
                      reserved_ids=[a.client_id for a in agents], clock=fleet.clock)
    assert session.wait_for_agents(3, 30) and session.registry.live_indices(session.clock()) == [0, 1, 2]
    return session, asynchronous.start(session, None)


def test_a_quarantined_device_gets_no_task_even_if_it_comes_back_during_the_version(tmp_path: Path) -> None:
    import dataclasses

    from fedge.coordinator.asynchronous import quarantined
    from fedge.protocol.influence import Bounded

    def clipped(session: Any, version: int, index: int) -> None:  # quarantined (after 1) by its clipped update
        client_id = session.registry.by_index(index).client_id
        session.trust.note_round(version, [Bounded(client_id, index, 10, 10, {"delta": 3.0}, {"delta": 0.5})],
                                 unit="version")
        assert client_id in session.trust.quarantine.quarantined

    opened: list[Any] = []
    try:
        for name in ("fedavg", "ef-fedavg"):
            opened.append(joined_session(tmp_path / name, name))
        (stateless, stateless_versions), (stateful, stateful_versions) = opened
        assert not stateless_versions.device_state and stateful_versions.device_state
        for session in (stateless, stateful):  # d (index 3) is not there at the version's start
            clipped(session, 1, 3)
        now = stateless.clock()
        assert quarantined(stateless, stateless_versions, now) == {3}  # held out whether live or not
        for session in (stateless, stateful):
            clipped(session, 2, 0)
        assert quarantined(stateless, stateless_versions, now) == {0, 3}
        # devices that keep state give one update a version: holding a out would leave 2 for a buffer of 3
        assert quarantined(stateful, stateful_versions, stateful.clock()) == set()
        config = stateless.config
        stateless.config = dataclasses.replace(config, round=dataclasses.replace(config.round, min_clients=3))
        # waived: it would leave fewer live devices than min_clients
        assert quarantined(stateless, stateless_versions, now) == set()
    finally:
        for session, _ in opened:
            session.transport.close()


def test_the_trusts_warnings_name_a_version_in_an_asynchronous_session(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    from fedge.coordinator.rundir import RunDir
    from fedge.coordinator.sections import RobustSection
    from fedge.coordinator.trust import SessionTrust
    from fedge.protocol.influence import Bounded

    trust = SessionTrust(RobustSection(quarantine_after=1), 0, RunDir(tmp_path))
    clipped = Bounded("dev-1", 1, 10, 10, {"delta": 3.0}, {"delta": 0.5})
    with caplog.at_level("WARNING", logger="fedge.coordinator"):
        trust.note_round(4, [clipped], unit="version")
    text = caplog.text
    assert "version 4: bounded 1 update(s): dev-1" in text and "version 4: agent dev-1 quarantined" in text
    assert "round 4" not in text


def test_replay_refuses_what_it_cannot_play_and_catches_a_journal_that_is_not_the_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], logging_kept: None) -> None:
    import argparse

    from fedge.coordinator.config import ConfigError
    from fedge.runtime.replay import command_replay

    run_dir = tmp_path / "run"
    simulated_async(run_dir, 3, "data.clients=4", "data.train_limit=200", "algorithm.name=fedavg",
                    "asynchronous.buffer=2", "asynchronous.concurrency=3")
    given = [f"agent-{i:02d}={run_dir / 'data' / f'client-{i:03d}.npz'}" for i in range(4)]

    def replay(*data: str, out: str | None = None) -> tuple[int, str]:
        """The command's exit code and what it said (2 and the one line for a refusal, as ``coordinator`` exits)."""
        try:
            code = command_replay(argparse.Namespace(run_dir=str(run_dir), data=list(data), out=out,
                                                     backend="inline", workers=2))
        except ConfigError as refusal:
            return 2, str(refusal)
        said = capsys.readouterr()
        return code, said.out + said.err

    code, said = replay(*given[:3])  # a device's shard missing: refused before anything is written
    assert code == 2 and "--data agent-03=SHARD" in said and not (run_dir / "replay").exists()
    code, said = replay(*given, out=str(tmp_path / "same"))
    assert code == 0 and "bit for bit" in said, said
    journal = run_rows(run_dir, "dispatches.jsonl")

    def tampered(name: str, entries: list[dict[str, Any]]) -> tuple[int, str]:
        (run_dir / "dispatches.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
        return replay(*given, out=str(tmp_path / name))

    flush = next(i for i, e in enumerate(journal) if e["event"] == "flush")
    swapped = [*journal[:flush], {**journal[flush], "tasks": journal[flush]["tasks"][::-1]}, *journal[flush + 1:]]
    code, said = tampered("order", swapped)  # the run folded them in another order than the journal says
    assert code == 1 and f"journal line {flush + 1}" in said and "diverged" in said, said
    update = next(i for i, e in enumerate(journal) if e["event"] == "update")
    fewer = [*journal[:update], {**journal[update], "steps": journal[update]["steps"] - 1}, *journal[update + 1:]]
    code, said = tampered("steps", fewer)  # a device that says it trained a step less than it did
    assert code == 1 and "arrays differ" in said, said
    code, said = tampered("resumed", [{"event": "resumed", "version": 1}, *journal])
    assert code == 2 and "resumed at version 1" in said
    code, said = tampered("field", [*journal[:update], {**journal[update], "steps": "4"}, *journal[update + 1:]])
    assert code == 2 and f"journal line {update + 1}: a update entry needs steps (int)" in said, said
    (run_dir / "dispatches.jsonl").write_text(json.dumps(journal[0]) + "\n{\"event\": \"task\"\n")
    code, said = replay(*given, out=str(tmp_path / "cut"))
    assert code == 2 and "dispatches.jsonl line 2 is not JSON" in said, said


def test_a_simulated_clock_session_resumed_after_a_crash_is_the_uninterrupted_one_bit_for_bit(
        procs: Processes, tmp_path: Path, caplog: pytest.LogCaptureFixture, traced: tuple[list[str], Path]) -> None:
    """The checkpoint at a flush holds the fleet's jobs out (their finish times, numbers and Task packets) and the
    trace's moves made: the resumed run makes every choice the uninterrupted one made (devices coming and going by a
    trace, budgets in simulated seconds, both packets on the link). The crash ends the coordinator's process (its
    fleet inline); the resume is played in this process (through `coordinator start --resume`'s rules), the
    uninterrupted run is the module's (the same on every backend: the test above)."""
    common, whole = traced
    cut = tmp_path / "cut"
    crashed = crashing(procs, "checkpoint:3", [*common, "fleet.backend=inline"], cut, "cut")
    assert finished(crashed, 240) == 70, procs.output("cut")
    from fedge.plumbing import load_arrays

    _, meta = load_arrays(cut / "checkpoint.npz")
    assert meta["round"] == 3 and meta["fleet"]["due"], meta["fleet"]  # jobs were out when it crashed
    caplog.set_level(logging.INFO)
    assert resume_here(cut)["status"] == "done"
    for name in ("metrics.jsonl", "clients.jsonl"):
        rows = [untimed(d, name) for d in (whole, cut)]
        assert rows[0] == rows[1] and len(rows[0]) >= 6, name
    with np.load(whole / "model.npz") as a, np.load(cut / "model.npz") as b:
        assert a.files == b.files and all(np.array_equal(a[name], b[name]) for name in a.files)
    said = (cut / "coordinator.log").read_text() + "\n".join(caplog.messages)  # the crashed run's, the resumed one's
    assert "said hello without it" not in said  # every task out was taken up
    journal = run_rows(cut, "dispatches.jsonl")
    assert [e["event"] for e in journal].count("resumed") == 1
    assert any(e["event"] == "lost" and "left" in e["why"] for e in journal)  # the trace's moves played


def test_a_device_trace_a_budget_in_simulated_seconds_and_a_link_shape_who_trains_and_for_how_long(
        tmp_path: Path) -> None:
    """Clients 0 and 1 come at 5 s, client 2 goes at 3 s and comes back at 20 s (fleet.trace); each device trains
    at most 1 simulated second a task (fleet.max_seconds); Task and Update bytes take their time (bandwidth_bps)."""
    from fedge.coordinator.config import load_config
    from fedge.simulation.timing import DeviceTiming

    trace = tmp_path / "trace.csv"
    trace.write_text("client,speed,from_s,until_s\n0,,5,\n1,,5,\n2,,0,3\n2,,20,\n")
    run_dir, bandwidth = tmp_path / "run", 8e6
    simulated_async(run_dir, 8, "fleet.step_s=0.5", "fleet.max_seconds=1.0", f"fleet.trace={trace}",
                    f"fleet.bandwidth_bps={bandwidth}", "data.clients=8", "data.train_limit=300", "algorithm.name=fedavg",
                    "asynchronous.buffer=2", "asynchronous.concurrency=7")
    journal = run_rows(run_dir, "dispatches.jsonl")
    tasks = {e["task"]: e for e in journal if e["event"] == "task"}
    assert all(e["t"] >= 5 for e in tasks.values() if e["client"] in (0, 1))
    assert any(e["client"] in (0, 1) for e in tasks.values())  # they did come
    assert not any(3 <= e["t"] < 20 for e in tasks.values() if e["client"] == 2)
    assert any(e["event"] == "lost" and e["client"] == 2 and "left" in e["why"] and 3 <= e["t"] < 20
               for e in journal)  # it went holding a task: the coordinator stopped waiting for it
    config = load_config(run_dir / "config.toml", [], {})
    timing = DeviceTiming(step_s=0.5, seed=config.run.seed, max_seconds=1.0)
    updates = [e for e in journal if e["event"] == "update"]
    for update in updates:  # the steps of an agent that stops once 1 simulated second has passed (job = task)
        with np.load(run_dir / "data" / f"client-{update['client']:03d}.npz") as shard:
            samples = min(len(shard["train_y"]), 300)
        planned = config.train.epochs * -(-samples // config.train.batch_size)
        assert update["steps"] == timing.steps_within(update["client"], update["task"], planned), update
    assert any(u["steps"] < config.train.epochs * -(-300 // config.train.batch_size) for u in updates)
    # what each task took beyond its training and its update's bytes on the link: its Task's bytes
    up = {row["task"]: row["bytes_up"] for row in run_rows(run_dir, "clients.jsonl")}
    down = [(u["t"] - tasks[u["task"]]["t"] - timing.duration(u["client"], u["task"], u["steps"])
             - up[u["task"]] * 8 / bandwidth) * bandwidth / 8 for u in updates if u["task"] in up]
    assert len(down) >= 16 and 300_000 < min(down) <= max(down) < 1_000_000, down  # the MLP's Task: ~650 kB


def test_ef_runs_asynchronously_a_device_holding_at_most_one_uncommitted_task_and_its_replica_in_step(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """ef-fedprox in versions: stale sparse updates folded under their discount, each device given its next task
    only once its last is committed (its residual and replica are device state), so no replica drifts (no dense
    resync), and every Task a sparse catch-up, not the model."""
    run_dir = tmp_path / "run"
    caplog.set_level(logging.INFO)
    simulated_async(run_dir, 10, "data.clients=10", "data.train_limit=300", "algorithm.name=ef-fedprox",
                    "algorithm.keyframe_rounds=3", "asynchronous.buffer=3", "asynchronous.concurrency=6")
    rows = metrics(run_dir)
    assert len(rows) == 10 and all(r["ef_dense_resyncs"] == 0 and r["ef_stale_updates"] == 0 for r in rows)
    assert sum(r["ef_keyframe"] for r in rows) >= 3  # keyframes every 3 versions: devices catch up through them
    assert any(r["staleness_max"] > 0 for r in rows) and rows[-1]["test_accuracy"] > 0.4, rows[-1]
    journal = run_rows(run_dir, "dispatches.jsonl")
    uncommitted: set[int] = set()  # devices whose update waits for its version's flush (and Commit)
    for entry in journal:
        if entry["event"] == "update":
            uncommitted.add(entry["client"])
        elif entry["event"] == "flush":
            uncommitted.clear()
        elif entry["event"] == "task":
            assert entry["client"] not in uncommitted, entry
    log = "\n".join(caplog.messages)  # what coordinator.log holds
    assert log and "failed" not in log and "no pending state" not in log  # no replica refused a task
    with np.load(run_dir / "model.npz") as model:
        dense = sum(model[name].nbytes for name in model.files)
    tasks = sum(1 for e in journal if e["event"] == "task")
    assert sum(r["bytes_down"] for r in rows) / tasks < dense / 10  # a catch-up, not the model


def test_a_stateful_fleet_too_small_for_its_buffer_is_named_and_ends_the_session_instead_of_hanging(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], logging_kept: None) -> None:
    """Two of four ef devices leave for good (a trace) with a buffer of 3: every device left holds an update that
    waits for the flush, so no task can be sent; after fleet.join_timeout_s the session ends with no-agents.
    (`coordinator start`, run in this process: a hang would be the test's timeout.)"""
    from fedge.runtime.cli import main

    trace = tmp_path / "trace.csv"
    trace.write_text("client,speed,from_s,until_s\n0,,0,0.3\n1,,0,0.3\n")
    run_dir = tmp_path / "run"
    sets = [*ASYNC, "run.rounds=20", f"fleet.trace={trace}", "fleet.join_timeout_s=30", "data.clients=4",
            "data.train_limit=200", "algorithm.name=ef-fedavg", "asynchronous.buffer=3", "asynchronous.concurrency=4"]
    code = main(["start", "--run-dir", str(run_dir), *[a for s in sets for a in ("--set", s)]])
    assert code != 0, capsys.readouterr()  # (`coordinator start`, whose exit status says the session failed)
    assert json.loads((run_dir / "report.json").read_text())["status"] == "no-agents"
    log = (run_dir / "coordinator.log").read_text()
    assert "none of the 2 live agents can take one (2 hold an update that waits for version" in log, log[-2000:]


def test_on_the_simulated_clock_a_task_is_given_up_exactly_at_its_deadline(tmp_path: Path) -> None:
    """The clock stops at the oldest task's deadline (sent + deadline_s), and the task is late there: it is given
    up at that very time (a strict comparison of a difference left the clock stopped and the session turning)."""
    run_dir = tmp_path / "run"
    simulated_async(run_dir, 4, "data.clients=6", "data.train_limit=300", "algorithm.name=fedavg",
                    "asynchronous.buffer=3", "asynchronous.concurrency=3", "round.deadline_s=0.25")
    journal = run_rows(run_dir, "dispatches.jsonl")
    sent = {e["task"]: e["t"] for e in journal if e["event"] == "task"}
    late = [e for e in journal if e["event"] == "lost" and e["why"] == "it passed its deadline"]
    assert late and all(abs(e["t"] - (sent[e["task"]] + 0.25)) < 1e-6 for e in late), late
