"""Writing a packet body: msgpack bytes laid out in one buffer and compressed into one zstd frame.

The body is laid out as msgpack (the same bytes `msgpack.packb` would give). Small pieces are
merged as they come; large payloads are written once, straight into one body buffer (shuffled
value blocks a byte plane at a time), which is then compressed in one call: in an interleaved A/B
run one zstd call was 2-7 % faster than streaming the pieces through a compression object. The
body buffer is kept per thread and reused (up to REUSE_BYTES), which costs one body of memory
between packets and saves the page faults of a fresh multi-MB buffer per packet.

This module must not import torch, zmq or any other Fedge package.
"""

from __future__ import annotations

import struct
import threading
from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

from fedge.codec import frames
from fedge.codec.errors import TooLarge
from fedge.codec.values import Shuffled

INLINE_BYTES = 4096  # binary fields up to this size are copied into the small-piece buffer
REUSE_BYTES = 64 << 20  # bodies up to this size are laid out in a per-thread buffer that is kept between packets
_local = threading.local()
Piece = bytes | memoryview | Shuffled


def _header(count: int, fix: int, fix_limit: int, code16: int, code32: int) -> bytes:
    if count < fix_limit:
        return bytes((fix | count,))
    if count < 1 << 16:
        return struct.pack(">BH", code16, count)
    if count < 1 << 32:
        return struct.pack(">BI", code32, count)
    raise TooLarge(f"a msgpack field of {count} items or bytes is over the format's 2**32 - 1")


def _bin_header(size: int) -> bytes:
    if size < 256:
        return bytes((0xC4, size))
    return _header(size, 0, 0, 0xC5, 0xC6)


def body_buffer(size: int) -> npt.NDArray[np.uint8]:
    """A uint8 array of `size` bytes to lay a body out in: this thread's reused buffer up to REUSE_BYTES (a fresh
    multi-MB buffer per packet costs thousands of page faults where the allocator hands it back to the system
    each time), a new one beyond."""
    if size > REUSE_BYTES:
        return np.empty(size, dtype=np.uint8)
    buffer: npt.NDArray[np.uint8] | None = getattr(_local, "body", None)
    if buffer is None or buffer.size < size:
        buffer = np.empty(max(size, 1 << 16), dtype=np.uint8)
        _local.body = buffer
    return buffer[:size]


class BodyWriter:
    """Collects the msgpack pieces of one value; small pieces are merged into one buffer."""

    def __init__(self) -> None:
        self.pieces: list[Piece] = []
        self.small = bytearray()
        self.size = 0

    def _inline(self, data: bytes | memoryview) -> None:
        self.small += data
        self.size += len(data) if isinstance(data, bytes) else data.nbytes

    def _large(self, piece: Piece) -> None:
        if self.small:
            self.pieces.append(bytes(self.small))
            self.small = bytearray()
        self.pieces.append(piece)
        self.size += piece.nbytes if not isinstance(piece, bytes) else len(piece)

    def add(self, obj: Any) -> None:
        """Append the msgpack form of `obj` (maps with str keys, lists of small items, binary data, scalars)."""
        if isinstance(obj, dict):
            self._inline(_header(len(obj), 0x80, 16, 0xDE, 0xDF))
            for key, value in obj.items():
                self._inline(msgpack.packb(key))
                self.add(value)
        elif isinstance(obj, list):  # tables, shapes, index segments: msgpack packs them in one C call
            self._inline(msgpack.packb(obj, use_bin_type=True))
        elif isinstance(obj, Shuffled):
            self._inline(_bin_header(obj.nbytes))
            self._large(obj)
        elif isinstance(obj, (bytes, memoryview)):
            size = len(obj) if isinstance(obj, bytes) else obj.nbytes
            self._inline(_bin_header(size))
            if size <= INLINE_BYTES:
                self._inline(obj)
            else:
                self._large(obj)
        else:
            self._inline(msgpack.packb(obj, use_bin_type=True))

    def compress(self, prefix: bytes, level: int) -> bytes:
        """`prefix` followed by one zstd frame (content size and checksum on) of the body."""
        if self.small:
            self.pieces.append(bytes(self.small))
            self.small = bytearray()
        flat = body_buffer(self.size)
        at = 0
        for piece in self.pieces:
            size = len(piece) if isinstance(piece, bytes) else piece.nbytes
            if isinstance(piece, Shuffled):
                piece.write_into(flat[at:at + size])
            else:
                flat[at:at + size] = np.frombuffer(piece, dtype=np.uint8)
            at += size
        if at != self.size:
            raise AssertionError(f"packet body: wrote {at} bytes, announced {self.size}")
        return prefix + frames.compressor(level, True).compress(flat.data)
