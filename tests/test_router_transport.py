"""The coordinator's ROUTER transport reads one message at a time: the next is read from libzmq only once the one
before has been handled, so that a burst of uploads is never held twice (once read, once still queued). Real sockets
on 127.0.0.1."""

from __future__ import annotations

import time

import zmq

from fedge.coordinator.transport import RouterTransport


def test_poll_reads_the_next_message_only_after_the_one_before_was_handled() -> None:
    router = RouterTransport("tcp://127.0.0.1:0")
    context = zmq.Context()
    dealers = []
    try:
        for i in range(3):
            dealer = context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.IDENTITY, f"dev-{i}".encode())
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(router.endpoint)
            dealer.send(bytes([i]) * 100_000)
            dealers.append(dealer)
        until = time.monotonic() + 10
        while router.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN == 0 and time.monotonic() < until:
            time.sleep(0.02)
        time.sleep(0.2)  # all three queued
        arrivals = router.poll(1000)
        peer, frame, identity = next(arrivals)
        assert len(frame) == 100_000 and identity is None
        assert router.bytes_in == 100_000  # the other two are still libzmq's, not read
        rest = list(arrivals)
        assert sorted([peer, *(p for p, _, _ in rest)]) == [b"dev-0", b"dev-1", b"dev-2"]
        assert router.bytes_in == 300_000
        assert list(router.poll(0)) == []
    finally:
        for dealer in dealers:
            dealer.close()
        context.term()
        router.close()
