"""The agent's ZeroMQ transport: one DEALER socket to the coordinator, with reconnect, backoff and CurveZMQ.

ZeroMQ reconnects by itself with an exponential backoff (RECONNECT_IVL doubling up to RECONNECT_IVL_MAX), so a
coordinator restart needs nothing from the caller but to say hello again. A socket monitor turns handshake failures
into a readable reason (for example, the coordinator refused this agent's key). ZeroMQ does not reconnect after the
coordinator refused the key, so the transport does, after 5 s doubling to 5 min: a device joins once an operator
has added its key to the allow-list, without a restart. Nor does ZeroMQ notice a connection that died without a
word (a dropped NAT entry, a cable pulled while idle): ``reconnect`` closes the socket and opens a new one, which the
agent asks for when it has heard nothing for the session's liveness. With CurveZMQ on the socket sets no routing id
(the coordinator knows the agent by its key); with it off, the routing id is the client id. Another thread can end a
poll at once (``wake``). It moves bytes; it knows nothing of the codec, algorithms, models or torch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from fedge.plumbing.keys import AGENT_KEY

log = logging.getLogger("fedge.agent.transport")

REFUSED_RETRY_S = (5.0, 300.0)  # after the coordinator refused the key: the first wait, and the longest



@dataclass(frozen=True)
class CurveClientKeys:
    """This agent's key pair and the coordinator's public key."""

    public: bytes
    secret: bytes
    server_public: bytes

    @classmethod
    def load(cls, keys_dir: str | Path, coordinator_public_key: str | Path) -> CurveClientKeys:
        secret_file = Path(keys_dir) / f"{AGENT_KEY}.key_secret"
        if not secret_file.exists():
            raise FileNotFoundError(f"no agent key pair in {keys_dir}: run `edge-agent keygen --keys-dir {keys_dir}`")
        public, secret = zmq.auth.load_certificate(secret_file)
        server_public, _ = zmq.auth.load_certificate(coordinator_public_key)
        if secret is None:
            raise ValueError(f"{secret_file} holds no secret key")
        return cls(public=public, secret=secret, server_public=server_public)


HANDSHAKE_FAILURES: dict[int, str] = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "the coordinator refused this agent's CurveZMQ key (not in its allow-list)",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "the handshake failed: protocol mismatch (CurveZMQ on one side only?)",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "the handshake failed (CurveZMQ on one side only, or a wrong key?)",
}


class DealerTransport:
    """A DEALER socket connected to the coordinator: by its key with CurveZMQ on, by the client id as its routing
    id with CurveZMQ off."""

    def __init__(self, endpoint: str, identity: str, curve: CurveClientKeys | None = None,
                 max_frame_bytes: int = 256 << 20) -> None:
        self.context = zmq.Context()
        self.received_parts: list[tuple[int, ...]] = []  # set by each poll
        self.routing_id = b"" if curve is not None else identity.encode()  # what the handshake announces
        self.keys = curve
        self.max_frame_bytes = max_frame_bytes
        # ``wake`` (any thread) ends a poll at once: the training thread's finished update goes out when it is
        # ready, not when the poll's timeout comes round (up to 100 ms later, every round).
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_read, False)
        os.set_blocking(self.wake_write, False)
        self.poller = zmq.Poller()
        self.poller.register(self.wake_read, zmq.POLLIN)
        self.endpoint = endpoint
        self.socket, self.monitor = self._open()
        self.last_failure = ""
        self.connected = False
        self.curve = curve is not None
        self.handshakes = 0
        self.reconnects = 0
        self.retry_s = REFUSED_RETRY_S[0]
        self.retry_at: float | None = None  # when to connect again after a refused key
        self.bytes_in = 0
        self.bytes_out = 0

    def _open(self) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
        """A new DEALER socket, connecting, with its monitor, registered with the poller."""
        sock: zmq.Socket[bytes] = self.context.socket(zmq.DEALER)
        if self.routing_id:
            sock.setsockopt(zmq.IDENTITY, self.routing_id)
        sock.setsockopt(zmq.RECONNECT_IVL, 200)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_frame_bytes)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing while disconnected: no burst of stale hellos
        if self.keys is not None:
            sock.curve_secretkey = self.keys.secret
            sock.curve_publickey = self.keys.public
            sock.curve_serverkey = self.keys.server_public
        monitor = sock.get_monitor_socket()
        self.poller.register(sock, zmq.POLLIN)
        sock.connect(self.endpoint)
        return sock, monitor

    def _shut(self, linger_ms: int) -> None:
        self.poller.unregister(self.socket)
        self.socket.disable_monitor()
        self.monitor.close()
        self.socket.close(linger=linger_ms)

    def reconnect(self) -> None:
        """Close the socket, dropping what it still queues, and open a new one: a new connection, whatever became
        of the old one. Its handshake counts in ``handshakes`` as any other."""
        self._shut(0)
        self.socket, self.monitor = self._open()
        self.connected, self.retry_at = False, None
        self.reconnects += 1
        log.warning("reconnecting to %s with a new socket", self.endpoint)

    def _drain_monitor(self) -> None:
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)
            kind = int(event["event"])
            reason = HANDSHAKE_FAILURES.get(kind)
            if reason is not None:
                if reason != self.last_failure:
                    log.error("%s: %s", self.endpoint, reason)
                self.last_failure = reason
                self.connected = False
                if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:  # ZeroMQ stops here: connect again later ourselves
                    self.retry_at = time.monotonic() + self.retry_s
                    log.warning("trying %s again in %.0f s", self.endpoint, self.retry_s)
                    self.retry_s = min(2 * self.retry_s, REFUSED_RETRY_S[1])
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.last_failure = ""
                self.retry_s = REFUSED_RETRY_S[0]
                self.connected = True
                self.handshakes += 1
                log.info("connected to %s", self.endpoint)
            elif kind == zmq.EVENT_DISCONNECTED:
                self.connected = False
                log.warning("disconnected from %s; reconnecting with backoff", self.endpoint)

    def poll(self, timeout_ms: int) -> list[bytes]:
        self._drain_monitor()
        if self.retry_at is not None and time.monotonic() >= self.retry_at:
            self.retry_at = None
            self.socket.disconnect(self.endpoint)
            self.socket.connect(self.endpoint)
        frames: list[bytes] = []
        self.received_parts = []  # the ZeroMQ frame sizes of each packet returned, in order
        ready = dict(self.poller.poll(timeout_ms))
        if self.wake_read in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(self.wake_read, 4096):
                    pass
        if self.socket not in ready:
            self._drain_monitor()
            return frames
        while True:
            try:
                parts = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return frames
            self.bytes_in += sum(len(p) for p in parts)
            frames.append(parts[0] if len(parts) == 1 else b"".join(parts))  # a Task in parts: header, body frames
            self.received_parts.append(tuple(len(p) for p in parts))

    def send(self, frame: bytes) -> bool:
        try:
            self.socket.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            log.debug("not connected (or queue full): %d bytes not sent", len(frame))
            return False
        self.bytes_out += len(frame)
        return True

    def wake(self) -> None:
        """End the current (or next) poll now; safe from any thread."""
        with contextlib.suppress(BlockingIOError, OSError):  # full (a wake is pending anyway), or closed
            os.write(self.wake_write, b"\0")

    def close(self) -> None:
        for fd in (self.wake_read, self.wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._shut(1000)
        self.context.term()


def tcp_peer(endpoint: str) -> tuple[str, int] | None:
    """(IP address, port) of a tcp:// endpoint, for the kernel's per-connection byte counters."""
    if not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint[len("tcp://"):].rpartition(":")
    try:
        return socket.gethostbyname(host.strip("[]")), int(port)
    except (OSError, ValueError):
        return None
