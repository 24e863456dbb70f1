"""Packets put together at byte level, for the hostile mutations (tests/hostile.py) the codec refuses to build: a
negative count, an index list that is not a sorted set of positions in range, a NaN in a lossy value block.

The honest packet is taken apart at the msgpack level (prefix, header map, body map: docs/wire-format.md), one field
is changed, and the packet is put together again with its CRC-32 and one zstd body frame, as a device's own encoder
could write it. Pure: bytes in, bytes out.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import numpy as np

from fedge import codec
from fedge.codec import frames as zstd_frames
from fedge.codec.indexcode import MAX_RICE_PARAM, RICE
from fedge.codec.masks import mask_crc
from fedge.codec.sparse import SparseSection, offsets_of

PREFIX = struct.Struct("<4sBBBBI")


def split_packet(frame: bytes) -> tuple[int, dict[str, Any], bytes]:
    """(kind code, the header map, the body frame's bytes) of a packet, without the codec's checks."""
    _magic, _version, kind, flags, _pad, size = PREFIX.unpack_from(frame)
    packed = frame[PREFIX.size:PREFIX.size + size]
    if flags & 1:
        packed = zstd_frames.decompress(packed, max_size=1 << 24, where="header", need_checksum=True)
    return kind, msgpack.unpackb(packed, raw=False), frame[PREFIX.size + size + 4:]


def join_packet(kind: int, header: dict[str, Any], body: bytes) -> bytes:
    packed = msgpack.packb(header, use_bin_type=True)
    head = PREFIX.pack(b"FEDG", codec.PROTOCOL_VERSION, kind, 0, 0, len(packed)) + packed
    return head + struct.pack("<I", zlib.crc32(head)) + body


def body_map(body: bytes) -> dict[str, Any]:
    raw = zstd_frames.decompress(body, max_size=1 << 28, where="body", need_checksum=True)
    found: dict[str, Any] = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    return found


def with_body(frame: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    """The packet with its body map changed in place by ``change`` (the header is kept as it was)."""
    kind, header, body = split_packet(frame)
    found = body_map(body)
    change(found)
    return join_packet(kind, header, zstd_frames.compress(msgpack.packb(found, use_bin_type=True), level=1))


NONFINITE_BITS = {"f16": lambda v: np.array([v], "<f2").view("<u2")[0],
                  "bf16": lambda v: np.array([v], "<f4").view("<u4")[0] >> 16}


def nonfinite_bytes(frame: bytes, value: float) -> bytes:
    """``value`` as the first value of the first non-empty value block of a lossy-encoded group (its byte planes:
    byte k of value 0 is at k x n); an int8 block gets it as its first scale."""
    def change(body: dict[str, Any]) -> None:
        for name in sorted(body["g"]):
            group = body["g"][name]
            for block, scales, where in ((group, "fs", "f"), (group["sp"] or {}, "vs", "val")):
                payload = block.get(where) or b""
                if not payload:
                    continue
                encoding = group["e"]
                if encoding == "int8":
                    block[scales] = np.array([value], "<f4").tobytes() + bytes(block[scales][4:])
                    return
                width = 4 if encoding == "f32" else 2
                n = len(payload) // width
                bits = int(NONFINITE_BITS[encoding](value)) if encoding != "f32" else \
                    int(np.array([value], "<f4").view("<u4")[0])
                if encoding == "f32":
                    bits = ((bits << 1) | (bits >> 31)) & 0xFFFFFFFF  # f32 words travel rotated left by one
                out = bytearray(payload)
                for k in range(width):
                    out[k * n] = (bits >> (8 * k)) & 0xFF
                block[where] = bytes(out)
                return
        raise AssertionError("an update with no values")
    return with_body(frame, change)


def rice_segment(local: np.ndarray, n: int) -> list[Any]:
    """A Rice segment of ``local`` positions as a device's encoder writes it whatever they are: the gaps between
    consecutive positions, a negative gap written with no unary quotient (the format has none for it)."""
    if local.size == 0:
        return [RICE, 0, b"", b""]
    gaps = np.diff(local.astype(np.int64), prepend=-1) - 1
    mean = max((n - local.size) / local.size, 1.0)
    r = min(MAX_RICE_PARAM, max(0, int(np.floor(np.log2(mean * 0.69 + 1.0)))))
    quotients = np.maximum(gaps >> r, 0)
    ends = np.cumsum(quotients + 1) - 1
    unary = np.zeros(int(ends[-1]) + 1, np.uint8)
    unary[ends] = 1
    lo = b""
    if r:
        bits = ((gaps & ((1 << r) - 1))[:, None] >> np.arange(r - 1, -1, -1)) & 1
        lo = np.packbits(bits.astype(np.uint8).reshape(-1)).tobytes()
    return [RICE, r, np.packbits(unary).tobytes(), lo]


def raw_index_section(group: codec.TensorGroup, names: Sequence[str], shapes: Sequence[tuple[int, ...]],
                      positions: np.ndarray, values: np.ndarray) -> Callable[[codec.Update, str], bytes]:
    """A frame maker: the update with group ``name``'s section replaced by an index section carrying ``positions``
    (flat, as given: duplicate, unsorted, negative or out of range) and ``values``. Each position counts in the
    tensor its value falls in (below 0: the first, past the end: the last); the CRC is of the positions in range.
    The codec encodes a placeholder section of the same counts; its index field and CRC are then replaced."""
    offsets = offsets_of([tuple(s) for s in shapes])
    owner = np.clip(np.searchsorted(offsets, positions, side="right") - 1, 0, len(shapes) - 1)
    counts = [int((owner == t).sum()) for t in range(len(shapes))]
    segments = [rice_segment(positions[owner == t] - offsets[t], offsets[t + 1] - offsets[t])
                for t in range(len(shapes))]
    inside = positions[(positions >= 0) & (positions < offsets[-1])]
    implied = np.zeros(offsets[-1], np.bool_)
    implied[inside] = True
    placeholder_idx = np.concatenate([offsets[t] + np.arange(min(c, offsets[t + 1] - offsets[t]))
                                      for t, c in enumerate(counts)]).astype(np.int64)
    order = np.argsort(owner, kind="stable")
    placeholder = SparseSection.with_indices(names, shapes, placeholder_idx,
                                             np.asarray(values, np.float32)[order][:placeholder_idx.size])

    def make(update: codec.Update, name: str) -> bytes:
        groups = {**update.groups, name: dataclasses.replace(group, sparse=placeholder)}
        frame = codec.encode(dataclasses.replace(update, groups=groups))

        def change(body: dict[str, Any]) -> None:
            section = body["g"][name]["sp"]
            section["ix"], section["cnt"], section["crc"] = segments, counts, mask_crc(implied)
        return with_body(frame, change)
    return make
