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


def test_the_agents_poll_ends_as_soon_as_another_thread_wakes_it() -> None:
    """The training thread wakes the agent's loop when its update is ready: the poll returns then, not at its
    timeout (which used to delay every round's update by up to the loop's 100 ms)."""
    import threading

    from fedge.edge_agent.transport import DealerTransport

    router = RouterTransport("tcp://127.0.0.1:0")
    agent = DealerTransport(router.endpoint, "dev-1")
    try:
        assert agent.poll(0) == []
        waker = threading.Timer(0.3, agent.wake)
        began = time.monotonic()
        waker.start()
        assert agent.poll(30_000) == []
        assert time.monotonic() - began < 10.0  # woken, not timed out
        agent.wake()
        agent.wake()  # several wakes: the next poll returns at once, the one after waits again
        assert agent.poll(30_000) == []
        began = time.monotonic()
        assert agent.poll(200) == [] and time.monotonic() - began >= 0.15
        waker.join()
    finally:
        agent.close()
        router.close()
