"""End to end, things going wrong: an agent killed mid-round, the coordinator killed and resumed, agents waiting
through a coordinator's SIGTERM, a service agent across sessions, and at a bound coordinator a hostile peer, an agent
of an older wire format and a device outside its training window. Real processes on 127.0.0.1, every one of them
cleaned up (the reference a killed coordinator's run is held to, and its resume, are played in this process). An agent without an
allowed key, or claiming another device's id: tests/test_downlink_identity.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgpack
import numpy as np
import pytest
import tomli_w
import zmq

from fedge import codec
from fedge.codec.frames import compress, decompress
from tests.e2e import Processes, endpoint, finished, metrics, shards, wait_for
from tests.simfleet import InProcessSessions, differences, records


def test_an_agent_killed_mid_round_is_dropped_and_rejoins(procs: Processes, tmp_path: Path) -> None:
    """A round of the MLP is paced by its agents (``--step-delay-s``: five steps of 0.4 s, sleeping, not
    computing): dev-2 is killed while it trains round 2, and the rounds after its drop last long enough for its
    restarted process to join before the last one."""
    data, run_dir, rounds = shards(tmp_path, 3), tmp_path / "run", 10
    coordinator = procs.coordinator(
        "--bind", "tcp://127.0.0.1:0", "--expect", "3", "--rounds", str(rounds), "--run-dir", str(run_dir),
        "--model", "mlp", "--set", "data.train_limit=300", "--set", "round.deadline_s=20",
        "--set", "fleet.heartbeat_s=0.5", "--set", "fleet.liveness_s=3.0", "--set", "data.partition=iid",
        "--set", "data.clients=3", "--set", "run.export_onnx=false", "--quiet")
    address = endpoint(run_dir)

    def agent(i: int, name: str, *pace: str) -> subprocess.Popen[bytes]:
        return procs.agent("--coordinator", address, "--client-id", f"dev-{i}", "--data",
                           str(data / f"client-{i:03d}.npz"), "--state-dir", str(tmp_path / f"state-{i}"),
                           *pace, name=name)

    agents = [agent(i, f"agent-{i}", "--step-delay-s", "0.4") for i in range(3)]
    wait_for(lambda: len(metrics(run_dir)) >= 1, 120, "round 1", interval=0.05)
    os.kill(agents[2].pid, signal.SIGKILL)
    agents[2].wait(10)
    # the round's row is written once its evaluation is done, beside the next round: the log says it first
    wait_for(lambda: "no update from client(s)" in (run_dir / "coordinator.log").read_text(), 120,
             "a round without dev-2")
    agent(2, "agent-2-again")
    assert finished(coordinator, 240) == 0, procs.output("coordinator")
    final = metrics(run_dir)
    dropped = [r for r in final if r["dropped"] == 1]
    assert dropped and dropped[0]["reported"] == 2 and dropped[0]["test_accuracy"] is not None
    assert len(final) == rounds and final[-1]["reported"] == 3, final
    log = (run_dir / "coordinator.log").read_text()
    assert re.search(r"round \d: no update from client\(s\) \[\d\]", log)


def test_a_killed_coordinator_resumes_to_the_same_model(procs: Processes, sessions: InProcessSessions,
                                                        tmp_path: Path) -> None:
    """SIGKILL mid-run, then a resume (through ``--resume``'s rules, in this process: the killed process is the
    subject; ``--resume`` as a command is the SIGTERM test's): the run ends as the uninterrupted one (played in this
    process), bit for bit. The coordinator is the subject: its fleet is simulated in its own process."""
    rounds = 8
    sets = [f"run.rounds={rounds}", "fleet.local_agents=2", "run.seed=7", "model.name=mlp", "data.train_limit=300",
            "fleet.heartbeat_s=0.5", "fleet.liveness_s=6.0", "run.export_onnx=false", "fleet.mode=simulated",
            "fleet.backend=inline"]
    sessions.run(sets, name="reference")
    run_dir = tmp_path / "run"
    victim = procs.cli(sets, run_dir, name="victim")
    wait_for(lambda: len(metrics(run_dir)) >= 2, 180, "round 2", interval=0.02)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(10)
    assert len(metrics(run_dir)) < rounds and not (run_dir / "report.json").exists(), "killed after its end"
    assert sessions.resume("run")["status"] == "done"
    assert [r["round"] for r in metrics(run_dir)] == list(range(1, rounds + 1))
    with np.load(tmp_path / "reference" / "model.npz") as a, np.load(run_dir / "model.npz") as b:
        names = [n for n in a.files if n.startswith("a/")]
        assert names and all(np.array_equal(a[n], b[n]) for n in names)
    assert differences(records(tmp_path / "reference"), records(run_dir)) == []


def test_agents_wait_through_a_coordinator_sigterm_and_finish_with_the_resumed_run(procs: Processes,
                                                                                   tmp_path: Path) -> None:
    data, run_dir = shards(tmp_path, 2), tmp_path / "run"
    common = ["--set", "fleet.heartbeat_s=0.5", "--set", "fleet.liveness_s=6.0", "--set", "run.export_onnx=false",
              "--quiet"]
    first = procs.coordinator("--bind", "tcp://127.0.0.1:0", "--expect", "2", "--rounds", "4", "--run-dir",
                              str(run_dir), "--model", "mlp", "--set", "data.train_limit=300",
                              "--set", "data.clients=2", *common, name="first")
    address = endpoint(run_dir)
    agents = [procs.agent("--coordinator", address, "--client-id", f"dev-{i}", "--data",
                          str(data / f"client-{i:03d}.npz"), "--state-dir", str(tmp_path / f"state-{i}"),
                          "--after-session", "exit", name=f"agent-{i}") for i in range(2)]
    wait_for(lambda: len(metrics(run_dir)) >= 1, 120, "round 1", interval=0.05)
    first.send_signal(signal.SIGTERM)
    assert first.wait(60) == 0, procs.output("first")
    assert "resume with: coordinator start --resume" in procs.output("first")
    assert all(agent.poll() is None for agent in agents), "agents must wait for the coordinator to come back"
    port = address.rsplit(":", 1)[1]
    resumed = procs.coordinator("--resume", str(run_dir), "--set", f"fleet.bind=tcp://127.0.0.1:{port}",
                                *common, name="resumed")
    assert finished(resumed, 240) == 0, procs.output("resumed")
    assert [r["round"] for r in metrics(run_dir)] == [1, 2, 3, 4]
    assert metrics(run_dir)[-1]["reported"] == 2
    for agent in agents:
        assert agent.wait(60) == 0


def test_an_agent_serves_one_session_after_another(procs: Processes, tmp_path: Path) -> None:
    """A service agent (the default, agent.after_session = wait) survives the end of a session and trains in the
    next one its coordinator starts on the same address; SIGTERM then stops it with exit 0."""
    data = shards(tmp_path, 1)
    common = ["--model", "mlp", "--set", "data.train_limit=200", "--set", "data.clients=1", "--expect", "1",
              "--rounds", "1", "--set", "fleet.heartbeat_s=0.5", "--set", "fleet.liveness_s=6.0",
              "--set", "run.export_onnx=false", "--quiet"]
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first = procs.coordinator("--bind", "tcp://127.0.0.1:0", "--run-dir", str(first_dir), *common, name="first")
    address = endpoint(first_dir)
    agent = procs.agent("--coordinator", address, "--client-id", "dev-0", "--data",
                        str(data / "client-000.npz"), "--state-dir", str(tmp_path / "state"), name="agent")
    assert finished(first, 240) == 0, procs.output("first")
    wait_for(lambda: "waiting for the next session" in procs.output("agent"), 60, "the agent to wait")
    assert agent.poll() is None, "a service agent stays up after its session finished: " + procs.output("agent")
    port = address.rsplit(":", 1)[1]
    second = procs.coordinator("--bind", f"tcp://127.0.0.1:{port}", "--run-dir", str(second_dir), *common,
                               name="second")
    assert finished(second, 240) == 0, procs.output("second")
    assert [r["reported"] for r in metrics(second_dir)] == [1]  # this agent's process: it stayed up
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(60) == 0, procs.output("agent")


@dataclass(frozen=True)
class Bound:
    """One bound session of one round, shared by the tests below: before its two devices join, a rogue peer sends
    junk and an agent of wire-format version 2 says hello (what each was answered is kept); then dev-0 joins, and
    dev-1, whose only training window opens two hours from now."""

    run_dir: Path
    rogue: list[tuple[str, codec.ErrorMessage]]  # (the code expected, the answer)
    old_answer: bytes
    window: str  # dev-1's training window


def answers_to_a_rogue(address: str) -> list[tuple[str, codec.ErrorMessage]]:
    """A peer that sends junk, a cut message, a heartbeat before its hello, and a heartbeat in another's name."""
    context = zmq.Context()
    rogue = context.socket(zmq.DEALER)
    rogue.setsockopt(zmq.IDENTITY, b"rogue")
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.connect(address)
    answers = []
    try:
        hello = codec.encode(codec.Heartbeat(run_id="x", round=0, sender="rogue"))
        for junk, expected in ((b"\x00garbage", "malformed"), (hello[: len(hello) // 2], "malformed"),
                               (hello, "hello-first"),
                               (codec.encode(codec.Heartbeat(run_id="x", round=0, sender="agent-00")),
                                "sender-mismatch")):
            rogue.send(junk)
            assert rogue.poll(20_000), f"no answer to {junk[:12]!r}"
            answers.append((expected, codec.decode(rogue.recv())))
    finally:
        rogue.close()
        context.term()
    return answers


def answer_to_an_older_agent(address: str) -> bytes:
    """What an agent still on wire-format version 2 is answered when it says hello as dev-0."""
    body = msgpack.packb({"v": 2, "k": 1, "run": "", "r": 0, "s": "dev-0", "fv": "0.1.0", "pv": 2, "tv": "2.9.1",
                          "mh": "", "cap": [], "ds": 100, "m": msgpack.packb({})}, use_bin_type=True)
    context = zmq.Context()
    try:
        old = context.socket(zmq.DEALER)
        old.setsockopt(zmq.IDENTITY, b"dev-0")
        old.setsockopt(zmq.LINGER, 0)
        old.connect(address)
        old.send(b"FEDG" + bytes((2, 1, 0, 0)) + compress(body))
        assert old.poll(10_000), "the older agent got no answer"
        answer: bytes = old.recv()
        old.close()
    finally:
        context.term()
    return answer


@pytest.fixture(scope="module")
def bound(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bound]:
    root = tmp_path_factory.mktemp("bound")
    processes = Processes(root)
    try:
        data, run_dir = shards(root, 2), root / "run"
        coordinator = processes.coordinator(
            "--bind", "tcp://127.0.0.1:0", "--expect", "2", "--rounds", "1", "--run-dir", str(run_dir),
            "--model", "mlp", "--set", "data.train_limit=200", "--set", "data.clients=2",
            "--set", "round.min_clients=1", "--set", "run.export_onnx=false", "--quiet")
        address = endpoint(run_dir)
        rogue = answers_to_a_rogue(address)
        old_answer = answer_to_an_older_agent(address)
        minute = (time.localtime().tm_hour * 60 + time.localtime().tm_min + 120) % 1440
        window = f"{minute // 60:02d}:{minute % 60:02d}-{(minute + 30) % 1440 // 60:02d}:{(minute + 30) % 60:02d}"
        busy = root / "busy.toml"
        busy.write_text(tomli_w.dumps({
            "agent": {"coordinator": address, "client_id": "dev-1", "data": str(data / "client-001.npz"),
                      "state_dir": str(root / "state-1"), "after_session": "exit"},
            "availability": {"windows": [window]}}))
        processes.agent("--coordinator", address, "--client-id", "dev-0", "--data", str(data / "client-000.npz"),
                        "--state-dir", str(root / "state-0"), "--after-session", "exit", name="agent-0")
        processes.agent("--config", str(busy), name="agent-1")
        processes.finish(coordinator, "coordinator", 240)
        yield Bound(run_dir, rogue, old_answer, window)
    finally:
        processes.cleanup()


@pytest.mark.xdist_group("e2e_faults_bound")
def test_a_hostile_peer_is_answered_with_reasons_and_the_session_goes_on(bound: Bound) -> None:
    assert [expected for expected, _ in bound.rogue] == ["malformed", "malformed", "hello-first", "sender-mismatch"]
    for expected, answer in bound.rogue:
        assert isinstance(answer, codec.ErrorMessage) and answer.code == expected, answer
        assert answer.reason
    assert json.loads((bound.run_dir / "report.json").read_text())["status"] == "done"
    assert "rejected a message from b'rogue'" in (bound.run_dir / "coordinator.log").read_text()


@pytest.mark.xdist_group("e2e_faults_bound")
def test_a_device_outside_its_training_window_declines_and_is_counted_as_unavailable(bound: Bound) -> None:
    (row,) = metrics(bound.run_dir)
    assert (row["selected"], row["reported"], row["unavailable"], row["dropped"]) == (2, 1, 1, 0)
    clients = [json.loads(line) for line in (bound.run_dir / "clients.jsonl").read_text().splitlines()]
    declined = [c for c in clients if not c["available"]]
    assert [c["client_id"] for c in declined] == ["dev-1"]
    assert f"outside the training windows {bound.window}" in declined[0]["unavailable_reason"]


@pytest.mark.xdist_group("e2e_faults_bound")
def test_a_rolling_upgrade_refuses_an_older_agent_readably_and_takes_it_back_upgraded(bound: Bound) -> None:
    """Coordinator first: an agent still on wire-format version 2 says hello and is answered in version 2 with
    protocol-mismatch (what that agent logs before it backs off); the same device, upgraded, joins and trains."""
    answer = bound.old_answer
    assert answer[:8] == b"FEDG\x02\x07\x00\x00"  # a version-2 ErrorMessage: readable by the older agent
    refusal = msgpack.unpackb(decompress(answer[8:], max_size=1 << 16, where="t", need_checksum=True))
    assert refusal["code"] == "protocol-mismatch" and "upgrade the agent" in refusal["why"]
    clients = [json.loads(line) for line in (bound.run_dir / "clients.jsonl").read_text().splitlines()]
    assert [c["client_id"] for c in clients if c["available"]] == ["dev-0"]
    assert [r["reported"] for r in metrics(bound.run_dir)] == [1]
