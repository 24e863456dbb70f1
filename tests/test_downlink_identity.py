"""With CurveZMQ on, frames for a client id go only to a connection authenticated with that id's key, whatever
routing id a peer chooses; a device that comes back on a new connection takes its place; an agent whose key is in no
allow-list, or that claims another device's id, is refused. Real sockets on 127.0.0.1: the transports in process,
then real coordinator and agent processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import zmq
import zmq.auth

from fedge.coordinator.transport import CurveServerKeys, RouterTransport
from fedge.edge_agent.transport import CurveClientKeys, DealerTransport
from fedge.plumbing.keys import AGENT_KEY, COORDINATOR_KEY, generate_keys
from tests.e2e import FAST, Processes, endpoint, finished, metrics, shards, wait_for


def device_keys(keys: Path, name: str, allowed_as: str) -> Path:
    """A device's key pair in keys/NAME, its public key allowed as ``allowed_as``."""
    public, _ = generate_keys(keys / name, AGENT_KEY)
    (keys / "allowed").mkdir(exist_ok=True)
    (keys / "allowed" / f"{allowed_as}.key").write_bytes(public.read_bytes())
    return keys / name


def raw_dealer(context: zmq.Context[zmq.Socket[bytes]], address: str, keys: Path, coordinator_key: Path,
               routing_id: bytes) -> zmq.Socket[bytes]:
    """A bare DEALER with a device's own keys that chooses its routing id, as a hostile device may."""
    public, secret = zmq.auth.load_certificate(keys / f"{AGENT_KEY}.key_secret")
    server, _ = zmq.auth.load_certificate(coordinator_key)
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, routing_id)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.curve_secretkey, dealer.curve_publickey, dealer.curve_serverkey = secret, public, server
    dealer.connect(address)
    return dealer


def arrivals(router: RouterTransport, count: int) -> list[tuple[bytes, bytes, str | None]]:
    got: list[tuple[bytes, bytes, str | None]] = []
    until = time.monotonic() + 10
    while len(got) < count and time.monotonic() < until:
        got += router.poll(50)
    assert len(got) == count, got
    return got


def received(agent: DealerTransport, seconds: float = 5.0) -> list[bytes]:
    until, frames = time.monotonic() + seconds, []
    while not frames and time.monotonic() < until:
        frames = agent.poll(50)
    return frames


def connected(agent: DealerTransport) -> DealerTransport:
    wait_for(lambda: agent.poll(20) == [] and agent.handshakes, 10, "the CurveZMQ handshake", interval=0)
    return agent


def test_the_router_sends_a_clients_frames_only_to_its_keys_newest_connection(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    generate_keys(keys, COORDINATOR_KEY)
    coordinator_key = keys / f"{COORDINATOR_KEY}.key"
    honest_keys = device_keys(keys, "honest", "agent-00")
    thief_keys = device_keys(keys, "thief", "agent-02")
    router = RouterTransport("tcp://127.0.0.1:0", CurveServerKeys.load(keys))
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    agents: list[DealerTransport] = []

    def agent() -> DealerTransport:
        agents.append(connected(DealerTransport(router.endpoint, "agent-00",
                                                CurveClientKeys.load(honest_keys, coordinator_key))))
        return agents[-1]

    early = raw_dealer(context, router.endpoint, thief_keys, coordinator_key, b"agent-00")  # before the device
    late = context.socket(zmq.DEALER)
    try:
        honest = agent()
        late.close()
        late = raw_dealer(context, router.endpoint, thief_keys, coordinator_key, b"agent-00")  # and after it
        time.sleep(0.3)
        assert honest.send(b"hello")
        assert arrivals(router, 1) == [(b"agent-00", b"hello", "agent-00")]
        assert router.send(b"agent-00", b"task") and received(honest) == [b"task"]
        assert not early.poll(300) and not late.poll(0)
        early.send(b"me too")  # it speaks as what its key is allowed as, whatever routing id it chose
        assert arrivals(router, 1) == [(b"agent-02", b"me too", "agent-02")]
        late.send(b"me three")  # a routing id in use (early's) is never handed over: libzmq ignores the newcomer
        assert list(router.poll(300)) == []
        assert router.send(b"agent-00", b"commit") and received(honest) == [b"commit"]
        assert not early.poll(300) and not late.poll(0)
        rebooted = agent()  # the same key on a new connection: it takes the place once it speaks
        rebooted.send(b"hello again")
        assert arrivals(router, 1) == [(b"agent-00", b"hello again", "agent-00")]
        assert router.send(b"agent-00", b"task 2") and received(rebooted) == [b"task 2"] and not honest.poll(300)
        rebooted.close()
        agents.remove(rebooted)
        # the newest connection has gone: the key's connection before it (still there) is the one left
        assert wait_for(lambda: router.send(b"agent-00", b"task 3") and received(honest, 0.5) == [b"task 3"], 10,
                        "the frame to reach the older connection")
        assert not router.send(b"agent-01", b"nobody")  # no connection of that key has spoken
        honest.reconnect()  # what an agent does when it has heard nothing for the liveness
        connected(honest).send(b"back")
        assert honest.handshakes == 2 and arrivals(router, 1) == [(b"agent-00", b"back", "agent-00")]
        assert router.send(b"agent-00", b"task 4") and received(honest) == [b"task 4"]
        assert honest.routing_id == b""  # it chose none: libzmq gave each of its connections one
    finally:
        for dealer in agents:
            dealer.close()
        for socket in (early, late):
            socket.close(linger=0)
        context.term()
        router.close()


SQUAT = """
import sys, time, zmq
from fedge.coordinator.transport import RouterTransport
router = RouterTransport("tcp://127.0.0.1:0")
context = zmq.Context()
squatter = context.socket(zmq.DEALER)
squatter.setsockopt(zmq.IDENTITY, b"\\x00k\\x8bEg")  # the routing id libzmq gives first when rand() is not seeded
squatter.connect(router.endpoint)
squatter.send(b"1")
assert [p for p, _, _ in router.poll(5000)] == [b"\\x00k\\x8bEg"]
anonymous = context.socket(zmq.DEALER)  # a connection that chooses no routing id: libzmq gives it one
anonymous.connect(router.endpoint)
anonymous.send(b"2")
assert [f for _, f, _ in router.poll(5000)] == [b"2"]
print("alive")
"""


def test_a_peer_that_chose_the_next_generated_routing_id_does_not_abort_the_coordinator() -> None:
    done = subprocess.run([sys.executable, "-c", SQUAT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "alive", done.stderr


def reporters(run_dir: Path) -> list[set[str]]:
    """The client ids whose update each round aggregated (clients.jsonl)."""
    rounds: dict[int, set[str]] = {}
    for row in map(json.loads, (run_dir / "clients.jsonl").read_text().splitlines()):
        if row["available"] and "refused" not in row:
            rounds.setdefault(row["round"], set()).add(row["client_id"])
    return [rounds[r] for r in sorted(rounds)]


def test_an_impostor_before_the_device_or_after_round_one_takes_no_task_and_stops_no_device(
        procs: Processes, tmp_path: Path) -> None:
    """Two honest devices in a bound CurveZMQ session, their keys allowed while it runs (no restart needed); a
    third device, its own key allowed as agent-02, connects as agent-00 twice (as the stock agent, and as a bare
    DEALER with the routing id ``agent-00`` that says nothing), once before the honest agent-00 and once more after
    round 1; an intruder, whose key is in no allow-list, tries too. The session is stopped (SIGTERM: it checkpoints
    and exits 0) two rounds later: both honest devices reported in every round, no frame reached an impostor, and
    the refused agents, still retrying, stop on SIGTERM with exit 0."""
    data, run_dir = shards(tmp_path, 2), tmp_path / "run"
    coordinator = procs.coordinator(
        "--bind", "tcp://127.0.0.1:0", "--expect", "2", "--rounds", "100", "--run-dir", str(run_dir),
        "--set", "security.curve=on", "--set", "data.clients=2", "--set", "round.min_clients=2",
        "--set", "round.deadline_s=10", *FAST)
    address = endpoint(run_dir)
    assert json.loads((run_dir / "provenance.json").read_text())["curve"] is True
    keys, coordinator_key = run_dir / "keys", run_dir / "keys" / f"{COORDINATOR_KEY}.key"
    thief = device_keys(keys, "thief", "agent-02")  # the third device: its own key, allowed as agent-02
    stranger = tmp_path / "intruder-keys"
    generate_keys(stranger, AGENT_KEY)  # a key in no allow-list

    started: dict[str, subprocess.Popen[bytes]] = {}

    def agent(name: str, client_id: str, shard: int, device_keys_dir: Path) -> None:
        started[name] = procs.agent("--coordinator", address, "--client-id", client_id, "--data",
                                    str(data / f"client-{shard:03d}.npz"), "--state-dir",
                                    str(tmp_path / f"{name}-state"), "--curve", "on", "--keys-dir",
                                    str(device_keys_dir), "--after-session", "exit", "--coordinator-key",
                                    str(coordinator_key), name=name)

    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    bare: list[zmq.Socket[bytes]] = []

    def impostors(name: str) -> None:
        """Both impostors connected, the stock one refused."""
        bare.append(raw_dealer(context, address, thief, coordinator_key, b"agent-00"))
        agent(name, "agent-00", 0, thief)
        wait_for(lambda: "identity-mismatch" in procs.output(name), 60, f"{name}'s refusal")

    try:
        agent("intruder", "intruder", 1, stranger)
        impostors("impostor-first")
        wait_for(lambda: "refused" in procs.output("intruder"), 60, "the intruder to be told it is refused")
        for i in range(2):
            agent(f"agent-0{i}", f"agent-0{i}", i, device_keys(keys, f"agent-0{i}-keys", f"agent-0{i}"))
        wait_for(lambda: len(metrics(run_dir)) >= 1, 60, "round 1")
        impostors("impostor-after")
        since = len(metrics(run_dir))
        wait_for(lambda: len(metrics(run_dir)) >= since + 2, 60, "two rounds with the second impostors in place")
        coordinator.send_signal(signal.SIGTERM)
        assert finished(coordinator, 60) == 0, procs.output("coordinator")
        assert [socket.poll(0) for socket in bare] == [0, 0], "a bare DEALER claiming agent-00 received a frame"
    finally:
        for socket in bare:
            socket.close(linger=0)
        context.term()
    rows = metrics(run_dir)
    assert [r["reported"] for r in rows] == [2] * len(rows), rows
    assert reporters(run_dir) == [{"agent-00", "agent-01"}] * len(rows)
    for name in ("impostor-first", "impostor-after", "intruder"):
        impostor = procs.output(name)
        assert "task" not in impostor and "joined run" not in impostor, impostor
    log = (run_dir / "coordinator.log").read_text()
    assert "allowed as client 'agent-02', not as 'agent-00'" in log
    assert "not in the allow-list" in log
    assert "intruder" not in (run_dir / "clients.jsonl").read_text()
    for name in ("impostor-first", "impostor-after", "intruder"):  # refused, they go on trying until stopped
        process = started[name]
        assert process.poll() is None, procs.output(name)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, procs.output(name)
