"""The coordinator's ZeroMQ transport: one ROUTER socket that moves opaque frames to and from agents.

It binds, resolves the real endpoint (so an ephemeral port can be published), switches on CurveZMQ with an allow-list
of agent public keys when asked, and says in the log why a peer was refused. It moves bytes and counts them; it
knows nothing of the codec, algorithms, models or torch.

A peer is named by bytes: the client id frames come from and go to. With CurveZMQ on, that is the id its
connection's key is allowed as (one id per key, the name of its file: ``allowed/CLIENT_ID.key``), never a routing
id the peer chose: libzmq gives each connection a routing id of its own (agents set none), frames for a client go
to the connection on which its key spoke last (its newest: a rebooted device takes its place by saying hello), and
``ROUTER_HANDOVER`` is off, so no connection can take over a routing id in use. With CurveZMQ off, the peer is the
routing id the peer chose, and any peer may choose any id.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from fedge.plumbing.keys import COORDINATOR_KEY, generate_keys

log = logging.getLogger("fedge.coordinator.transport")

__all__ = ["COORDINATOR_KEY", "AllowList", "BindingAuthenticator", "CurveServerKeys", "RouterTransport", "generate_keys"]

ALLOWED_DIR = "allowed"
# Frames of this many bytes and more are handed to libzmq without a copy (pyzmq copies smaller ones; its default
# threshold, 64 KiB, would copy every 16 KiB body frame of a Task sent under CurveZMQ to each of its peers).
ZERO_COPY_FROM = 8 * 1024


@dataclass(frozen=True)
class CurveServerKeys:
    """The coordinator's key pair and the directory of allowed agent public keys."""

    public: bytes
    secret: bytes
    allowed_dir: Path

    @classmethod
    def load(cls, keys_dir: str | Path) -> CurveServerKeys:
        keys_dir = Path(keys_dir)
        secret_file = keys_dir / f"{COORDINATOR_KEY}.key_secret"
        if not secret_file.exists():
            raise FileNotFoundError(
                f"no coordinator key pair in {keys_dir}: run `coordinator keygen --keys-dir {keys_dir}`")
        public, secret = zmq.auth.load_certificate(secret_file)
        if secret is None:
            raise ValueError(f"{secret_file} holds no secret key")
        return cls(public=public, secret=secret, allowed_dir=keys_dir / ALLOWED_DIR)


class AllowList:
    """ZAP credentials callback: a peer is allowed when its public key is in a *.key file of the allow-list dir,
    and it is allowed as the client id the file is named after (``allowed/pi-07.key``: client ``pi-07``). A key
    found in two files is bound to no id and refused (a warning names the files): one device, one id.

    The keys are cached and read again when the directory changes (a key file added, removed or replaced moves the
    directory's modification time), so a thousand handshakes read it once, and adding or removing an agent's key
    needs no restart. The directory's time does not always move, though: a file's content written after it was
    created (``cp`` creates, then writes), or a change in the same tick of the file system's coarse clock as the
    last read. So the cache is trusted for good only once it read every file and the directory had not changed for
    ``SETTLE_S`` before the read; until then it is read again at most every ``RECHECK_S``.
    """

    SETTLE_S = 2.0
    RECHECK_S = 0.25

    def __init__(self, allowed_dir: Path, now_ns: Callable[[], int] = time.time_ns) -> None:
        self.allowed_dir = allowed_dir
        self.now_ns = now_ns  # wall-clock nanoseconds, as the directory's modification time is
        self.refused: deque[str] = deque(maxlen=100)  # the public keys refused last (z85), for the console
        self.refused_count = 0
        self.cached: dict[bytes, str] = {}  # z85 public key -> the client id it is allowed as
        self.cached_at: tuple[int, int] | None = None  # (mtime_ns, link count) of the directory when it was read
        self.read_at = 0  # when it was read (ns)
        self.settled = False  # whether that read can be trusted until the directory's stamp moves
        self.reads = 0

    def allowed_keys(self) -> dict[bytes, str]:
        try:
            stat = self.allowed_dir.stat()
            stamp: tuple[int, int] | None = (stat.st_mtime_ns, stat.st_nlink)
        except OSError:
            stamp = None
        now = self.now_ns()
        if stamp is not None and stamp == self.cached_at and (
                self.settled or now - self.read_at < self.RECHECK_S * 1e9):
            return self.cached
        self.cached, complete = self.read_keys()
        self.cached_at, self.read_at = stamp, now
        self.settled = complete and stamp is not None and now - stamp[0] >= self.SETTLE_S * 1e9
        return self.cached

    def read_keys(self) -> tuple[dict[bytes, str], bool]:
        """The keys allowed, and whether every key file could be read."""
        self.reads += 1
        files: dict[bytes, list[Path]] = {}
        complete = True
        if self.allowed_dir.is_dir():
            for path in sorted(self.allowed_dir.glob("*.key")):
                try:
                    public, _ = zmq.auth.load_certificate(path)
                except (OSError, ValueError) as exc:
                    log.warning("ignoring unreadable key file %s: %s", path, exc)
                    complete = False
                    continue
                files.setdefault(public, []).append(path)
        keys: dict[bytes, str] = {}
        for public, paths in files.items():
            if len(paths) > 1:
                log.warning("refusing the key in %s: one key may be allowed as one client id only",
                            ", ".join(str(p) for p in paths))
                continue
            keys[public] = paths[0].name[:-len(".key")]
        return keys, complete

    def client_id(self, key: bytes) -> str | None:
        """The client id a (z85) public key is allowed as; None when it is not allowed."""
        return self.allowed_keys().get(key)

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.allowed_keys():
            return True
        log.warning("refused a peer: its CurveZMQ public key %s is not in the allow-list %s",
                    key.decode(errors="replace"), self.allowed_dir)
        self.refused.append(key.decode(errors="replace"))
        self.refused_count += 1
        return False


class BindingAuthenticator(ThreadAuthenticator):
    """pyzmq's authenticator, with a connection's ZAP user id set to the client id its key is allowed as (libzmq
    attaches it to every message of the connection as the ``User-Id`` property)."""

    def __init__(self, context: zmq.Context[Any], allow: AllowList) -> None:
        super().__init__(context, log=logging.getLogger("fedge.zap"))
        self.allow_list = allow

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self.allow_list.client_id(z85.encode(client_public_key)) or ""


def seed_routing_ids() -> None:
    """Make the routing ids libzmq gives connections unpredictable. libzmq numbers them from C's ``rand()``, which
    nothing seeds: every process's first ROUTER hands out ``\\x00k\\x8bEg``, then counts up. A peer may choose
    any routing id, a zero first byte included, and libzmq aborts the process (an assertion) when the id it gives
    a new connection is one a peer chose already: a device that knew the next id could stop the coordinator."""
    try:
        ctypes.CDLL(None).srand(ctypes.c_uint(int.from_bytes(os.urandom(4), "little")))
    except (OSError, AttributeError):  # no C library to load: the ids stay predictable (docs/robustness.md)
        log.warning("could not seed the C library's rand(): libzmq's routing ids are predictable")


class RouterTransport:
    """A bound ROUTER socket: poll for (peer, frame, identity) triples, send a frame to a peer. The peer is the
    client id the connection's CurveZMQ key is allowed as, and the identity that id as a string; with CurveZMQ off,
    the peer is the routing id the peer chose and the identity None."""

    ROUTES_PER_KEY = 4  # the connections remembered per key, newest first: a frame goes to the newest one still there

    def __init__(self, bind: str, curve: CurveServerKeys | None = None, max_frame_bytes: int = 64 << 20) -> None:
        seed_routing_ids()  # before the socket: libzmq draws its first routing id when the socket is made
        self.context = zmq.Context()
        self.authenticator: ThreadAuthenticator | None = None
        self.socket = self.context.socket(zmq.ROUTER)
        # CurveZMQ off: a peer's newest connection takes its routing id (a restarted agent comes back at once).
        # CurveZMQ on: a routing id in use is never handed over; peers are found by key (``routes``).
        self.socket.setsockopt(zmq.ROUTER_HANDOVER, 0 if curve is not None else 1)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # A frame above the limit makes libzmq drop it and the connection; each peer's receive queue holds two
        # messages (then libzmq stops reading that peer's socket until the driver takes one: backpressure), so a
        # thousand peers hold at most two thousand messages, and paced uploads bound how many of them are updates.
        # Not one: with CurveZMQ on, libzmq delivered no message at all from a peer at ZMQ_RCVHWM = 1.
        self.socket.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
        self.socket.setsockopt(zmq.RCVHWM, 2)
        self.socket.setsockopt(zmq.LINGER, 2000)
        self.socket.setsockopt(zmq.SNDHWM, 100)
        self.socket.copy_threshold = ZERO_COPY_FROM
        self.allow_list: AllowList | None = None  # CurveZMQ on: the keys it allowed and refused
        if curve is not None:
            allow = self.allow_list = AllowList(curve.allowed_dir)
            self.authenticator = BindingAuthenticator(self.context, allow)
            self.authenticator.start()
            self.authenticator.configure_curve_callback("*", credentials_provider=allow)
            self.socket.curve_secretkey = curve.secret
            self.socket.curve_publickey = curve.public
            self.socket.curve_server = True
        self.socket.bind(bind)
        self.endpoint: str = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.curve = curve is not None
        self.bytes_in = 0
        self.bytes_out = 0
        self.dropped_multipart = 0
        self.dropped_unbound = 0
        # CurveZMQ on: client id -> the routing ids on which its key spoke, newest first
        self.routes: dict[bytes, deque[bytes]] = {}

    def poll(self, timeout_ms: int, batch: int = 1000) -> Iterator[tuple[bytes, bytes, str | None]]:
        """What arrived within the timeout, at most ``batch`` messages, as (peer, frame, identity), each read only
        once the caller has handled the one before: this side holds one received frame at a time, however many are
        queued (a batch read at once held every granted upload twice over, the batch and the uploads granted while
        it was handled). Messages of more than one frame are dropped (counted; logged at the first and every
        1000th), and so, with CurveZMQ on, are those of a connection whose key is bound to no id."""
        if not self.socket.poll(timeout_ms, zmq.POLLIN):
            return
        for _ in range(batch):
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(frames) != 2:
                self.dropped_multipart += 1
                if self.dropped_multipart % 1000 == 1:
                    log.warning("dropped a message of %d frames from %r (expected one frame; %d so far)",
                                len(frames) - 1, frames[0].bytes if frames else b"?", self.dropped_multipart)
                continue
            frame = frames[1].bytes
            self.bytes_in += len(frame)
            routing_id = frames[0].bytes
            identity: str | None = None
            if self.curve:
                user_id = frames[1].get("User-Id")
                identity = user_id if isinstance(user_id, str) and user_id else None
            del frames  # libzmq's copy goes now, not when the next one is read
            if not self.curve:
                yield routing_id, frame, None
            elif identity is None:  # its key left the allow-list (or went to two files) after its handshake
                self.dropped_unbound += 1
                if self.dropped_unbound % 1000 == 1:
                    log.warning("dropped a message from a connection whose key is allowed as no client id "
                                "(%d so far)", self.dropped_unbound)
            else:
                peer = identity.encode()
                self.route(peer, routing_id)
                yield peer, frame, identity
            del frame

    def route(self, peer: bytes, routing_id: bytes) -> None:
        """Frames for ``peer`` go to ``routing_id`` from now on: the connection on which its key spoke last."""
        routes = self.routes.get(peer)
        if routes is None:
            routes = self.routes[peer] = deque(maxlen=self.ROUTES_PER_KEY)
        elif routes[0] == routing_id:
            return
        else:
            with contextlib.suppress(ValueError):
                routes.remove(routing_id)
            log.info("client %r now speaks on a new connection", peer.decode(errors="replace"))
        routes.appendleft(routing_id)

    def send(self, peer: bytes, frame: bytes) -> bool:
        """Send one frame to a connected peer; False (and a log line) when the peer is gone or its queue is full."""
        return self.send_parts(peer, [frame])

    def send_parts(self, peer: bytes, parts: Sequence[bytes | memoryview]) -> bool:
        """Send one message of several frames (a Task's header and body frames). Frames are sent without a copy
        (``copy=False``: pyzmq hands libzmq the buffer of the immutable ``bytes`` and keeps it alive until every
        queue has written it; frames under ``ZERO_COPY_FROM`` are copied anyway), so a body sent to many peers is
        held once however many queues wait. With pyzmq's default (``copy=True``) every send copies the frame.
        With CurveZMQ on, the message goes to the newest connection of the peer's key that is still there (one
        that has gone is forgotten), and to no other."""
        size = sum(len(part) for part in parts)
        routes = self.routes.get(peer) if self.curve else deque((peer,))
        if not routes:
            log.debug("could not send %d bytes to %r: no connection of its key has spoken", size, peer)
            return False
        while routes:
            try:
                self.socket.send_multipart([routes[0], *parts], zmq.NOBLOCK, copy=False)
            except (zmq.Again, zmq.ZMQError) as exc:
                gone = isinstance(exc, zmq.ZMQError) and exc.errno == zmq.EHOSTUNREACH
                if gone and self.curve and len(routes) > 1:  # that connection closed: try the key's one before
                    routes.popleft()
                    continue
                # A peer that has gone (it left, or its connection closed) is the caller's to handle: not a warning.
                log.log(logging.DEBUG if gone else logging.WARNING, "could not send %d bytes to %r: %s", size, peer,
                        exc)
                return False
            self.bytes_out += size
            return True
        return False

    def close(self) -> None:
        self.socket.close()
        if self.authenticator is not None:
            self.authenticator.stop()
        self.context.term()
