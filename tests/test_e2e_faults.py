"""End to end, things going wrong: an agent killed mid-round, the coordinator killed and resumed, a hostile peer,
an agent without an allowed key. Real processes on 127.0.0.1, every one of them cleaned up."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import zmq

from fedge import codec
from tests.e2e import FAST, Processes, endpoint, finished, metrics, shards, wait_for


def test_an_agent_killed_mid_round_is_dropped_and_rejoins(procs: Processes, tmp_path: Path) -> None:
    data, run_dir = shards(tmp_path, 3), tmp_path / "run"
    coordinator = procs.coordinator(
        "--bind", "tcp://127.0.0.1:0", "--expect", "3", "--rounds", "6", "--run-dir", str(run_dir),
        "--model", "cnn", "--set", "data.train_limit=500", "--set", "round.deadline_s=20",
        "--set", "fleet.heartbeat_s=0.5", "--set", "fleet.liveness_s=3.0", "--set", "data.partition=iid",
        "--set", "data.clients=3", "--quiet")
    address = endpoint(run_dir)

    def agent(i: int, name: str) -> subprocess.Popen[bytes]:
        return procs.agent("--coordinator", address, "--client-id", f"dev-{i}", "--data",
                           str(data / f"client-{i:03d}.npz"), "--state-dir", str(tmp_path / f"state-{i}"),
                           name=name)

    agents = [agent(i, f"agent-{i}") for i in range(3)]
    wait_for(lambda: len(metrics(run_dir)) >= 1, 120, "round 1")
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
    assert len(final) == 6 and final[-1]["reported"] == 3, final
    log = (run_dir / "coordinator.log").read_text()
    assert re.search(r"round \d: no update from client\(s\) \[\d\]", log)


def test_a_killed_coordinator_resumes_to_the_same_model(procs: Processes, tmp_path: Path) -> None:
    common = ["--rounds", "4", "--local-fleet", "2", "--seed", "7", *FAST]
    reference = tmp_path / "reference"
    assert finished(procs.coordinator(*common, "--run-dir", str(reference), name="ref"), 240) == 0
    run_dir = tmp_path / "run"
    victim = procs.coordinator(*common, "--run-dir", str(run_dir), name="victim")
    wait_for(lambda: len(metrics(run_dir)) >= 2, 180, "round 2")
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(10)
    resumed = procs.coordinator("--resume", str(run_dir), "--quiet", name="resumed")
    assert finished(resumed, 240) == 0, procs.output("resumed")
    assert [r["round"] for r in metrics(run_dir)] == [1, 2, 3, 4]
    with np.load(reference / "model.npz") as a, np.load(run_dir / "model.npz") as b:
        names = [n for n in a.files if n.startswith("a/")]
        assert names and all(np.array_equal(a[n], b[n]) for n in names)


def test_a_hostile_peer_is_answered_with_reasons_and_the_session_goes_on(procs: Processes,
                                                                       tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    coordinator = procs.coordinator("--rounds", "3", "--local-fleet", "2", "--run-dir", str(run_dir), *FAST)
    address = endpoint(run_dir)
    context = zmq.Context()
    rogue = context.socket(zmq.DEALER)
    rogue.setsockopt(zmq.IDENTITY, b"rogue")
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.connect(address)
    try:
        hello = codec.encode(codec.Heartbeat(run_id="x", round=0, sender="rogue"))
        for junk, expected in ((b"\x00garbage", "malformed"), (hello[: len(hello) // 2], "malformed"),
                               (hello, "hello-first"),
                               (codec.encode(codec.Heartbeat(run_id="x", round=0, sender="agent-00")),
                                "sender-mismatch")):
            rogue.send(junk)
            assert rogue.poll(20_000), f"no answer to {junk[:12]!r}"
            answer = codec.decode(rogue.recv())
            assert isinstance(answer, codec.ErrorMessage) and answer.code == expected, answer
            assert answer.reason
    finally:
        rogue.close()
        context.term()
    assert finished(coordinator, 240) == 0, procs.output("coordinator")
    assert json.loads((run_dir / "report.json").read_text())["status"] == "done"
    assert "rejected a message from b'rogue'" in (run_dir / "coordinator.log").read_text()


def test_an_agent_without_an_allowed_key_or_claiming_another_devices_id_is_refused(procs: Processes,
                                                                                  tmp_path: Path) -> None:
    """The session waits for two honest devices that join only after both refusals were seen, so a loaded machine
    cannot finish it before the impostor says hello (it did, twice, when the session had its own local fleet)."""
    data, run_dir = shards(tmp_path, 2), tmp_path / "run"
    coordinator = procs.coordinator("--bind", "tcp://127.0.0.1:0", "--expect", "2", "--rounds", "3", "--run-dir",
                                    str(run_dir), "--set", "security.curve=on", "--set", "data.clients=2",
                                    "--set", "round.min_clients=2", *FAST)
    address = endpoint(run_dir)
    assert json.loads((run_dir / "provenance.json").read_text())["curve"] is True
    allowed = run_dir / "keys" / "allowed"

    def device(name: str, client_id: str, shard: int, allowed_as: str | None) -> subprocess.Popen[bytes]:
        keys = tmp_path / f"{name}-keys"
        subprocess.run([sys.executable, "-m", "fedge.edge_agent", "keygen", "--keys-dir", str(keys)], check=True,
                       capture_output=True, timeout=60)
        if allowed_as is not None:  # added while the coordinator runs: no restart needed
            (allowed / f"{allowed_as}.key").write_bytes((keys / "agent.key").read_bytes())
        return procs.agent("--coordinator", address, "--client-id", client_id, "--data",
                           str(data / f"client-{shard:03d}.npz"), "--state-dir", str(tmp_path / f"{name}-state"),
                           "--curve", "on", "--keys-dir", str(keys), "--after-session", "exit",
                           "--coordinator-key", str(run_dir / "keys" / "coordinator.key"), name=name)

    intruder = device("intruder", "intruder", 0, allowed_as=None)
    impostor = device("impostor", "agent-00", 1, allowed_as="impostor")  # allowed, but claims another device's id
    wait_for(lambda: "refused" in procs.output("intruder"), 60, "the intruder to be told it is refused")
    wait_for(lambda: "identity-mismatch" in procs.output("impostor"), 60, "the impostor to be told it is refused")
    honest = [device(f"agent-0{i}", f"agent-0{i}", i, allowed_as=f"agent-0{i}") for i in range(2)]
    assert finished(coordinator, 240) == 0, procs.output("coordinator")
    log = (run_dir / "coordinator.log").read_text()
    assert "not in the allow-list" in log
    assert "allowed as client 'impostor', not as 'agent-00'" in log, log
    assert [r["selected"] for r in metrics(run_dir)] == [2, 2, 2]
    assert "intruder" not in (run_dir / "clients.jsonl").read_text()
    for i, agent in enumerate(honest):
        assert agent.wait(60) == 0, procs.output(f"agent-0{i}")
    for process in (intruder, impostor):
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0


def test_agents_wait_through_a_coordinator_sigterm_and_finish_with_the_resumed_run(procs: Processes,
                                                                                   tmp_path: Path) -> None:
    data, run_dir = shards(tmp_path, 2), tmp_path / "run"
    common = ["--set", "fleet.heartbeat_s=0.5", "--set", "fleet.liveness_s=6.0", "--quiet"]
    first = procs.coordinator("--bind", "tcp://127.0.0.1:0", "--expect", "2", "--rounds", "6", "--run-dir",
                              str(run_dir), "--model", "mlp", "--set", "data.train_limit=300",
                              "--set", "data.clients=2", *common, name="first")
    address = endpoint(run_dir)
    agents = [procs.agent("--coordinator", address, "--client-id", f"dev-{i}", "--data",
                          str(data / f"client-{i:03d}.npz"), "--state-dir", str(tmp_path / f"state-{i}"),
                          "--after-session", "exit", name=f"agent-{i}") for i in range(2)]
    wait_for(lambda: len(metrics(run_dir)) >= 2, 120, "round 2")
    first.send_signal(signal.SIGTERM)
    assert first.wait(60) == 0, procs.output("first")
    assert "resume with: coordinator start --resume" in procs.output("first")
    assert all(agent.poll() is None for agent in agents), "agents must wait for the coordinator to come back"
    port = address.rsplit(":", 1)[1]
    resumed = procs.coordinator("--resume", str(run_dir), "--set", f"fleet.bind=tcp://127.0.0.1:{port}",
                                *common, name="resumed")
    assert finished(resumed, 240) == 0, procs.output("resumed")
    assert [r["round"] for r in metrics(run_dir)] == [1, 2, 3, 4, 5, 6]
    assert metrics(run_dir)[-1]["reported"] == 2
    for agent in agents:
        assert agent.wait(60) == 0


def test_an_agent_serves_one_session_after_another(procs: Processes, tmp_path: Path) -> None:
    """A service agent (the default, agent.after_session = wait) survives the end of a session and trains in the
    next one its coordinator starts on the same address; SIGTERM then stops it with exit 0."""
    data = shards(tmp_path, 1)
    common = ["--model", "mlp", "--set", "data.train_limit=200", "--set", "data.clients=1", "--expect", "1",
              "--rounds", "1", "--set", "fleet.heartbeat_s=0.5", "--set", "fleet.liveness_s=6.0", "--quiet"]
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first = procs.coordinator("--bind", "tcp://127.0.0.1:0", "--run-dir", str(first_dir), *common, name="first")
    address = endpoint(first_dir)
    agent = procs.agent("--coordinator", address, "--client-id", "dev-0", "--data",
                        str(data / "client-000.npz"), "--state-dir", str(tmp_path / "state"), name="agent")
    assert finished(first, 240) == 0, procs.output("first")
    time.sleep(1.0)
    assert agent.poll() is None, "a service agent stays up after its session finished: " + procs.output("agent")
    port = address.rsplit(":", 1)[1]
    second = procs.coordinator("--bind", f"tcp://127.0.0.1:{port}", "--run-dir", str(second_dir), *common,
                               name="second")
    assert finished(second, 240) == 0, procs.output("second")
    assert [r["reported"] for r in metrics(second_dir)] == [1]
    assert "waiting for the next session" in procs.output("agent")
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(60) == 0, procs.output("agent")


def test_a_device_outside_its_training_window_declines_and_is_counted_as_unavailable(procs: Processes,
                                                                                      tmp_path: Path) -> None:
    import tomli_w

    data, run_dir = shards(tmp_path, 2), tmp_path / "run"
    coordinator = procs.coordinator("--bind", "tcp://127.0.0.1:0", "--expect", "2", "--rounds", "1", "--run-dir",
                                    str(run_dir), "--model", "mlp", "--set", "data.train_limit=200",
                                    "--set", "data.clients=2", "--set", "round.min_clients=1", "--quiet")
    address = endpoint(run_dir)
    minute = (time.localtime().tm_hour * 60 + time.localtime().tm_min + 120) % 1440
    later = f"{minute // 60:02d}:{minute % 60:02d}-{(minute + 30) % 1440 // 60:02d}:{(minute + 30) % 60:02d}"
    toml = tmp_path / "busy.toml"
    toml.write_text(tomli_w.dumps({
        "agent": {"coordinator": address, "client_id": "dev-1", "data": str(data / "client-001.npz"),
                  "state_dir": str(tmp_path / "state-1"), "after_session": "exit"},
        "availability": {"windows": [later]}}))
    procs.agent("--coordinator", address, "--client-id", "dev-0", "--data", str(data / "client-000.npz"),
                "--state-dir", str(tmp_path / "state-0"), "--after-session", "exit", name="agent-0")
    procs.agent("--config", str(toml), name="agent-1")
    assert finished(coordinator, 240) == 0, procs.output("coordinator")
    (row,) = metrics(run_dir)
    assert (row["selected"], row["reported"], row["unavailable"], row["dropped"]) == (2, 1, 1, 0)
    clients = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text().splitlines()]
    declined = [c for c in clients if not c["available"]]
    assert [c["client_id"] for c in declined] == ["dev-1"]
    assert f"outside the training windows {later}" in declined[0]["unavailable_reason"]


def test_a_rolling_upgrade_refuses_an_older_agent_readably_and_takes_it_back_upgraded(procs: Processes,
                                                                                      tmp_path: Path) -> None:
    """Coordinator first: an agent still on wire-format version 2 says hello and is answered in version 2 with
    protocol-mismatch (what that agent logs before it backs off); the same device, upgraded, joins and trains."""
    import msgpack

    from fedge.codec.frames import compress, decompress

    data, run_dir = shards(tmp_path, 1), tmp_path / "run"
    coordinator = procs.coordinator("--bind", "tcp://127.0.0.1:0", "--expect", "1", "--rounds", "1", "--run-dir",
                                    str(run_dir), "--model", "mlp", "--set", "data.train_limit=200",
                                    "--set", "data.clients=1", "--quiet")
    address = endpoint(run_dir)
    body = msgpack.packb({"v": 2, "k": 1, "run": "", "r": 0, "s": "dev-0", "fv": "0.1.0", "pv": 2, "tv": "2.9.1",
                          "mh": "", "cap": [], "ds": 100, "m": msgpack.packb({})}, use_bin_type=True)
    old_hello = b"FEDG" + bytes((2, 1, 0, 0)) + compress(body)
    context = zmq.Context()
    try:
        old = context.socket(zmq.DEALER)
        old.setsockopt(zmq.IDENTITY, b"dev-0")
        old.setsockopt(zmq.LINGER, 0)
        old.connect(address)
        old.send(old_hello)
        assert old.poll(10_000), "the older agent got no answer"
        answer = old.recv()
        old.close()
    finally:
        context.term()
    assert answer[:8] == b"FEDG\x02\x07\x00\x00"  # a version-2 ErrorMessage: readable by the older agent
    refusal = msgpack.unpackb(decompress(answer[8:], max_size=1 << 16, where="t", need_checksum=True))
    assert refusal["code"] == "protocol-mismatch" and "upgrade the agent" in refusal["why"]
    procs.agent("--coordinator", address, "--client-id", "dev-0", "--data", str(data / "client-000.npz"),
                "--state-dir", str(tmp_path / "state"), "--after-session", "exit", name="agent")
    assert finished(coordinator, 240) == 0, procs.output("coordinator")
    assert [r["reported"] for r in metrics(run_dir)] == [1]
