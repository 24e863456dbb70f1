"""A Task in parts: an agent whose hello lists ``task-parts`` is sent its header and the round's shared body, cut
into frames of at most ``BODY_FRAME`` bytes, as the frames of one ZeroMQ message, which its transport joins into the
packet; an agent that does not list it (an older one) is sent the packet in one frame. Real sockets on 127.0.0.1."""

from __future__ import annotations

import time

import numpy as np
import zmq

from fedge import codec
from fedge.codec import vocabulary as words
from fedge.coordinator.downlinks import BODY_FRAME, DownlinkBodies
from fedge.coordinator.session import Session
from fedge.coordinator.transport import RouterTransport
from fedge.edge_agent.transport import DealerTransport
from fedge.protocol.registry import AgentRegistry


def task_for(client: str, model: codec.TensorGroup) -> codec.Task:
    return codec.Task(run_id="r", round=3, sender="coordinator", groups={"model": model}, meta={"k": 1},
                      committed_round=2, last_accepted_round=2, deadline_s=30.0)


def received(socket: zmq.Socket[bytes], seconds: float = 10.0) -> list[bytes]:
    assert socket.poll(int(seconds * 1000)), "nothing arrived"
    return socket.recv_multipart()


def test_a_capable_agent_gets_the_body_in_bounded_frames_and_an_older_one_one_frame_and_both_decode_alike() -> None:
    router = RouterTransport("tcp://127.0.0.1:0")
    context = zmq.Context()
    dealers = {}
    try:
        for name in ("new", "old"):
            dealer = context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.IDENTITY, name.encode())
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(router.endpoint)
            dealer.send(b"hi")
            dealers[name] = dealer
        seen = set()
        until = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < until:
            seen |= {peer for peer, _, _ in router.poll(100)}
        session = Session.__new__(Session)
        registry = AgentRegistry(2, 10.0)
        for name, capabilities in (("new", [words.TASK_PARTS]), ("old", ["f16"])):
            registry.index_of(name)
            registry.get(name).hello = {"capabilities": capabilities}  # type: ignore[union-attr]
        session.protocol = type("P", (), {"registry": registry})()  # type: ignore[assignment]
        session.transport, session.downlinks = router, DownlinkBodies()
        weights = np.random.default_rng(0).standard_normal(150_000).astype(np.float32)  # 600 KB: incompressible
        model = codec.TensorGroup(dense={"w": weights})
        sizes = {name: session.send_task(name.encode(), task_for(name, model), registry.get(name).index)
                 for name in ("new", "old")}  # type: ignore[union-attr]
        new, old = received(dealers["new"]), received(dealers["old"])
        body = len(old[0]) - len(new[0])
        assert body > 3 * BODY_FRAME and len(new) == 1 + -(-body // BODY_FRAME) and len(old) == 1
        assert max(len(frame) for frame in new[1:]) == BODY_FRAME and session.downlinks.encoded == 1
        assert b"".join(new) == old[0] == codec.encode(task_for("x", model))
        assert sizes["new"] == sizes["old"] == len(old[0])
        decoded = codec.decode(b"".join(new))
        assert isinstance(decoded, codec.Task) and np.array_equal(decoded.groups["model"].dense["w"],
                                                                   model.dense["w"])
    finally:
        for dealer in dealers.values():
            dealer.close(0)
        context.term()
        router.close()


def test_the_agents_transport_joins_a_task_that_comes_in_two_frames() -> None:
    router = RouterTransport("tcp://127.0.0.1:0")
    agent = DealerTransport(router.endpoint, "dev-1")
    try:
        packet = codec.encode(task_for("dev-1", codec.TensorGroup(dense={"w": np.ones(1000, np.float32)})))
        head = codec.encode_header(codec.decode(packet))
        until = time.monotonic() + 10
        while not agent.send(b"hello") and time.monotonic() < until:
            time.sleep(0.05)
        while not list(router.poll(100)) and time.monotonic() < until:
            pass
        assert router.send_parts(b"dev-1", [head, packet[len(head):]])
        frames: list[bytes] = []
        while not frames and time.monotonic() < until:
            frames = agent.poll(100)
        assert frames == [packet] and agent.bytes_in == len(packet)
        assert agent.received_parts == [(len(head), len(packet) - len(head))]  # the meter counts both frames
    finally:
        agent.close()
        router.close()


def test_under_curvezmq_body_frames_are_small_and_never_copied_per_peer() -> None:
    """Each connection holds one body frame's ciphertext under CurveZMQ, so its frames are the smaller ones; and the
    router hands frames of that size to libzmq without copying them (a copy per peer would hold the body once for
    every agent)."""
    from fedge.coordinator.downlinks import CURVE_BODY_FRAME

    router = RouterTransport("tcp://127.0.0.1:0")
    try:
        assert router.socket.copy_threshold <= CURVE_BODY_FRAME < BODY_FRAME
    finally:
        router.close()
    weights = np.random.default_rng(1).standard_normal(40_000).astype(np.float32)
    parts = DownlinkBodies(CURVE_BODY_FRAME).parts(task_for("x", codec.TensorGroup(dense={"w": weights})))
    assert max(len(part) for part in parts[1:]) == CURVE_BODY_FRAME and len(parts) > 5
    assert b"".join(parts) == codec.encode(task_for("x", codec.TensorGroup(dense={"w": weights})))
