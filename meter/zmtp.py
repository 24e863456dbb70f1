"""ZMTP 3.x byte arithmetic: what a ZeroMQ TCP connection puts on the stream for given frames and a handshake.

Pure functions, no I/O, no pyzmq import (the tests check them against real pyzmq sockets through a byte-counting
relay). Figures are exact for libzmq 4.3 with the NULL and CURVE mechanisms (RFC 23 ZMTP 3.1, RFC 25 CURVE, and
libzmq's ``mechanism_t::add_basic_properties``); heartbeats (PING/PONG) are NULL-mechanism sizes. Subscriptions,
PLAIN and GSSAPI are not modelled. Must not import Fedge's transports, codec or algorithms.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

Mechanism = Literal["NULL", "CURVE"]
MECHANISMS: tuple[str, ...] = ("NULL", "CURVE")

GREETING_BYTES = 64
"""Signature (10) + version (2) + mechanism name (20) + as-server (1) + filler (31)."""
SHORT_FRAME_MAX = 255
"""A frame body of at most 255 bytes has a 2-byte header (flags + 1-byte size); longer ones 9 (flags + 8-byte size)."""

SOCKET_TYPES: tuple[str, ...] = ("PAIR", "PUB", "SUB", "REQ", "REP", "DEALER", "ROUTER", "PULL", "PUSH",
                                 "XPUB", "XSUB", "STREAM")
_SENDS_IDENTITY = ("REQ", "DEALER", "ROUTER")
"""libzmq adds an ``Identity`` property (possibly empty) to the handshake of these socket types only."""

# CURVE (RFC 26 / libzmq curve_client.cpp, curve_server.cpp), body sizes in bytes:
CURVE_HELLO_BODY = 200       # "\x05HELLO" 6 + version 2 + padding 72 + client key 32 + nonce 8 + box 80
CURVE_WELCOME_BODY = 168     # "\x07WELCOME" 8 + nonce 16 + box 144
CURVE_INITIATE_FIXED = 257   # "\x08INITIATE" 9 + cookie 96 + nonce 8 + box (16 + key 32 + nonce 16 + vouch 80)
CURVE_READY_FIXED = 30       # "\x05READY" 6 + nonce 8 + box MAC 16; the properties follow inside the box
CURVE_MESSAGE_FIXED = 33     # "\x07MESSAGE" 8 + nonce 8 + box MAC 16 + flags 1; the frame body follows


def header_bytes(body: int) -> int:
    """Header length of one ZMTP frame or command with a body of ``body`` bytes."""
    if body < 0:
        raise ValueError(f"frame size must be >= 0, got {body}")
    return 2 if body <= SHORT_FRAME_MAX else 9


def frame_bytes(size: int, mechanism: Mechanism = "NULL") -> int:
    """Stream bytes of one message frame carrying ``size`` bytes of payload."""
    body = size if _mechanism(mechanism) == "NULL" else size + CURVE_MESSAGE_FIXED
    return header_bytes(body) + body


def message_bytes(frames: Iterable[int], mechanism: Mechanism = "NULL") -> int:
    """Stream bytes of one multipart message whose wire frames have the given sizes.

    ``frames`` are the frames that travel: a DEALER's frames as sent; a ROUTER's frames without the routing-id frame
    it strips or prepends (that frame never crosses the wire)."""
    return sum(frame_bytes(size, mechanism) for size in frames)


def properties_bytes(socket_type: str, identity: bytes = b"", metadata: Mapping[str, bytes] | None = None) -> int:
    """Encoded size of the metadata properties a libzmq socket announces in its READY (or CURVE INITIATE/READY).

    Each property is name-length (1) + name + value-length (4) + value. ``Socket-Type`` always; ``Identity`` for
    REQ, DEALER and ROUTER (empty when no routing id is set); then each ``ZMQ_METADATA`` entry (names start X-)."""
    kind = socket_type.upper()
    if kind not in SOCKET_TYPES:
        raise ValueError(f"unknown socket type {socket_type!r}; expected one of {SOCKET_TYPES}")
    total = _property("Socket-Type", kind.encode())
    if kind in _SENDS_IDENTITY:
        total += _property("Identity", identity)
    for name, value in (metadata or {}).items():
        total += _property(name, value)
    return total


def ready_bytes(socket_type: str, identity: bytes = b"", metadata: Mapping[str, bytes] | None = None) -> int:
    """Stream bytes of a NULL-mechanism READY command: header + "\\x05READY" + properties."""
    body = 6 + properties_bytes(socket_type, identity, metadata)
    return header_bytes(body) + body


def handshake_bytes(socket_type: str, *, identity: bytes = b"", metadata: Mapping[str, bytes] | None = None,
                    mechanism: Mechanism = "NULL", curve_server: bool = False) -> int:
    """Bytes one side of a connection sends before its first message.

    NULL: greeting + READY. CURVE client: greeting + HELLO + INITIATE (properties inside); CURVE server: greeting +
    WELCOME + READY (properties inside). ``curve_server`` says which CURVE role this side plays."""
    props = properties_bytes(socket_type, identity, metadata)
    if _mechanism(mechanism) == "NULL":
        return GREETING_BYTES + ready_bytes(socket_type, identity, metadata)
    if curve_server:
        ready = CURVE_READY_FIXED + props
        return (GREETING_BYTES + header_bytes(CURVE_WELCOME_BODY) + CURVE_WELCOME_BODY
                + header_bytes(ready) + ready)
    initiate = CURVE_INITIATE_FIXED + props
    return GREETING_BYTES + header_bytes(CURVE_HELLO_BODY) + CURVE_HELLO_BODY + header_bytes(initiate) + initiate


def connection_handshake(client_type: str, server_type: str, *, client_identity: bytes = b"",
                         server_identity: bytes = b"", client_metadata: Mapping[str, bytes] | None = None,
                         server_metadata: Mapping[str, bytes] | None = None,
                         mechanism: Mechanism = "NULL") -> tuple[int, int]:
    """Handshake bytes of one connection as (client to server, server to client).

    "Client" is the CURVE client (the side that knows the server key), usually the connecting agent's DEALER;
    for NULL the roles only name the two sides."""
    up = handshake_bytes(client_type, identity=client_identity, metadata=client_metadata, mechanism=mechanism)
    down = handshake_bytes(server_type, identity=server_identity, metadata=server_metadata, mechanism=mechanism,
                           curve_server=True)
    return up, down


def ping_bytes(context: bytes = b"") -> int:
    """A ZMTP 3.1 PING command (NULL mechanism): "\\x04PING" + TTL (2) + context."""
    body = 5 + 2 + len(context)
    return header_bytes(body) + body


def pong_bytes(context: bytes = b"") -> int:
    """A ZMTP 3.1 PONG command (NULL mechanism): "\\x04PONG" + the PING's context."""
    body = 5 + len(context)
    return header_bytes(body) + body


def _property(name: str, value: bytes) -> int:
    encoded = name.encode("ascii")
    if not 0 < len(encoded) <= 255:
        raise ValueError(f"property name must be 1..255 bytes, got {name!r}")
    return 1 + len(encoded) + 4 + len(value)


def _mechanism(mechanism: str) -> str:
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
    return mechanism
