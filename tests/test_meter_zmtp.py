"""ZMTP byte arithmetic equals what real pyzmq sockets put on a loopback TCP stream, counted by a relay thread."""

from __future__ import annotations

import selectors
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from fedge.meter import AgentMeter, tcp_counters_to, zmtp

# --- pure arithmetic (docs/meter.md section 4.2) ------------------------------------------------------------------


@pytest.mark.parametrize(("frames", "expected"), [([0], 2), ([100], 102), ([255], 257), ([256], 265),
                                                  ([1_000_000], 1_000_009), ([16, 1000], 1027), ([10, 10, 10], 36)])
def test_message_bytes_match_the_recorded_push_pull_table(frames: list[int], expected: int) -> None:
    assert zmtp.message_bytes(frames) == expected


def test_push_pull_handshake_is_92_bytes_each_way() -> None:
    assert zmtp.connection_handshake("PUSH", "PULL") == (92, 92)


def test_dealer_router_ready_carries_socket_type_and_identity() -> None:
    assert zmtp.ready_bytes("ROUTER") == 43
    assert zmtp.ready_bytes("DEALER", identity=b"agent-7") == 50
    assert zmtp.ready_bytes("DEALER", identity=b"agent-7", metadata={"X-Foo": b"bar"}) == 63
    assert zmtp.ready_bytes("PUSH", identity=b"ignored: PUSH sends no identity") == 28


def test_long_ready_switches_to_a_9_byte_header() -> None:
    short = zmtp.ready_bytes("DEALER", metadata={"X-Pad": b"x" * (255 - 6 - 35 - 10)})
    long = zmtp.ready_bytes("DEALER", metadata={"X-Pad": b"x" * (256 - 6 - 35 - 10)})
    assert (short, long) == (257, 265)


def test_curve_sizes() -> None:
    assert zmtp.frame_bytes(222, "CURVE") == 257 and zmtp.frame_bytes(223, "CURVE") == 265
    assert zmtp.connection_handshake("DEALER", "ROUTER", mechanism="CURVE") == (567, 301)


def test_heartbeat_commands() -> None:
    assert zmtp.ping_bytes() == 9 and zmtp.pong_bytes() == 7 and zmtp.ping_bytes(b"ctx") == 12


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        zmtp.frame_bytes(-1)
    with pytest.raises(ValueError):
        zmtp.ready_bytes("NOPE")
    with pytest.raises(ValueError):
        zmtp.message_bytes([1], "PLAIN")  # type: ignore[arg-type]


# --- a byte-counting relay between a real DEALER and ROUTER -----------------------------------------------------


class Relay:
    """Accepts one TCP connection on 127.0.0.1 and forwards it to ``target_port``, counting bytes each way."""

    def __init__(self, target_port: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target = target_port
        self.up = 0
        self.down = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sockets: list[socket.socket] = []
        try:
            self.listener.settimeout(5.0)
            client, _ = self.listener.accept()
            server = socket.create_connection(("127.0.0.1", self.target), timeout=5.0)
            sockets = [client, server]
            with selectors.DefaultSelector() as selector:
                selector.register(client, selectors.EVENT_READ, (server, "up"))
                selector.register(server, selectors.EVENT_READ, (client, "down"))
                while not self._stop.is_set():
                    for key, _ in selector.select(0.05):
                        sock: socket.socket = key.fileobj  # type: ignore[assignment]
                        data = sock.recv(65536)
                        if not data:
                            return
                        peer, direction = key.data
                        peer.sendall(data)
                        if direction == "up":
                            self.up += len(data)
                        else:
                            self.down += len(data)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            self.error = error
        finally:
            for sock in sockets:
                sock.close()
            self.listener.close()

    def wait_for(self, up: int, down: int, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while (self.up, self.down) < (up, down) and time.monotonic() < deadline and self.error is None:
            time.sleep(0.005)
        time.sleep(0.05)  # anything extra would show up now

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        assert not self._thread.is_alive()


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


MESSAGES_UP = [[0], [1], [255], [256], [1000], [70_000], [16, 1000], [10, 10, 10], [254, 255, 256]]
REPLIES = [[255], [256, 0], [3]]


def _exchange(context: zmq.Context, mechanism: str,
              meter: AgentMeter | None = None) -> tuple[Relay, int, int, dict[str, Any] | None]:
    router = context.socket(zmq.ROUTER)
    dealer = context.socket(zmq.DEALER)
    for sock in (router, dealer):
        sock.linger = 0
        sock.rcvtimeo = 5000
    dealer.routing_id = b"agent-7"
    if mechanism == "CURVE":
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        router.curve_server = True
        router.curve_secretkey = server_secret
        dealer.curve_serverkey = server_public
        dealer.curve_publickey, dealer.curve_secretkey = client_public, client_secret
    port = router.bind_to_random_port("tcp://127.0.0.1")
    relay = Relay(port)
    if meter is not None:
        meter.watch_tcp(("127.0.0.1", relay.port))
        meter.begin_round(1)
        meter.add_connection("DEALER", "ROUTER", identity=b"agent-7")
    dealer.connect(f"tcp://127.0.0.1:{relay.port}")
    up, down = zmtp.connection_handshake("DEALER", "ROUTER", client_identity=b"agent-7",
                                         mechanism=mechanism)  # type: ignore[arg-type]
    for frames in MESSAGES_UP:
        dealer.send_multipart([b"u" * size for size in frames])
        identity, *received = router.recv_multipart()
        assert [len(f) for f in received] == frames and identity == b"agent-7"
        up += zmtp.message_bytes(frames, mechanism)  # type: ignore[arg-type]
        if meter is not None:
            meter.add_bytes("up", sum(frames), frames)
    for frames in REPLIES:
        router.send_multipart([b"agent-7", *[b"d" * size for size in frames]])
        assert [len(f) for f in dealer.recv_multipart()] == frames
        down += zmtp.message_bytes(frames, mechanism)  # type: ignore[arg-type]
        if meter is not None:
            meter.add_bytes("down", sum(frames), frames)
    relay.wait_for(up, down)
    record = None
    if meter is not None:
        _wait_for_acks(("127.0.0.1", relay.port), up)
        record = meter.end_round()
    dealer.close()
    router.close()
    return relay, up, down, record


def _wait_for_acks(remote: tuple[str, int], sent: int, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        counters = tcp_counters_to(remote)
        if counters is None or sum(c.bytes_acked or 0 for c in counters.values()) >= sent:
            return
        time.sleep(0.01)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("mechanism", ["NULL", "CURVE"])
def test_predicted_zmtp_bytes_equal_the_relay_count(context: zmq.Context, mechanism: str) -> None:
    if mechanism == "CURVE" and not zmq.has("curve"):
        pytest.skip("libzmq built without CURVE")
    relay, up, down, _ = _exchange(context, mechanism)
    try:
        assert relay.error is None
        assert (relay.up, relay.down) == (up, down)
    finally:
        relay.close()


@pytest.mark.timeout(30)
def test_agent_meter_record_matches_relay_and_kernel_counters(context: zmq.Context) -> None:
    meter = AgentMeter(energy="none")
    relay = None
    try:
        relay, up, down, record = _exchange(context, "NULL", meter)
        assert record is not None
        assert (record["bytes_zmtp_up"], record["bytes_zmtp_down"]) == (relay.up, relay.down) == (up, down)
        assert record["bytes_payload_up"] == sum(map(sum, MESSAGES_UP))
        assert record["messages_up"] == len(MESSAGES_UP) and record["frames_down"] == 4
        if sys.platform == "linux":  # the DEALER's own libzmq socket, found by address and read via TCP_INFO
            # kernel counters add 1 for the SYN of a connection this side opened (and 1 for a FIN)
            assert record["bytes_tcp_up"] - up in (0, 1) and record["bytes_tcp_down"] - down in (0, 1)
    finally:
        if relay is not None:
            relay.close()
