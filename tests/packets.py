"""Test helpers that take a packet apart and put it back together with a valid header CRC and body frame, so that
tests reach the structural checks behind the checksums."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import msgpack

from fedge.codec import PROTOCOL_VERSION
from fedge.codec.frames import compress, decompress
from fedge.codec.packet import read_header


def head(kind: int, header: bytes, version: int = PROTOCOL_VERSION) -> bytes:
    """The prefix, `header` bytes and their CRC, for a packet of `kind`."""
    start = b"FEDG" + bytes((version, kind, 0, 0)) + struct.pack("<I", len(header)) + header
    return start + struct.pack("<I", zlib.crc32(start))


def parts(packet: bytes) -> dict[str, Any]:
    """{"header": the header map, "body": the body map or None}."""
    size = struct.unpack_from("<I", packet, 8)[0]
    raw = packet[12:12 + size]
    if packet[6] & 1:
        raw = decompress(raw, max_size=1 << 24, where="test", need_checksum=True)
    header = msgpack.unpackb(raw, raw=False)
    rest = packet[read_header(packet).body_at:]
    body = msgpack.unpackb(decompress(rest, max_size=1 << 24, where="test", need_checksum=True), raw=False) \
        if rest else None
    return {"header": header, "body": body}


def rebuild(packet: bytes, tree: dict[str, Any]) -> bytes:
    """`packet` with the header and body of `tree` (as `parts` gives them), the CRC and frame made valid again."""
    out = head(packet[5], msgpack.packb(tree.get("header"), use_bin_type=True), packet[4])
    if tree.get("body") is not None:
        out += compress(msgpack.packb(tree["body"], use_bin_type=True))
    return out
