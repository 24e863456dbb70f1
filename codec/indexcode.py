"""The index field: which flat positions of one tensor a sparse section carries.

Each tensor of a sparse section gets one segment `[coding, param, hi, lo]`:

* coding 0, bitmap: `hi` is a zstd frame of the tensor's packed bitmap (MSB first), `lo` empty.
* coding 1, Rice gaps of the carried positions; coding 2, Rice gaps of the positions NOT carried.
  `param` is the Rice parameter r; `hi` holds the unary quotients, `lo` the r-bit remainders.

The encoder picks, per tensor, whichever of the Rice code and the compressed bitmap is smaller
(the bitmap is only tried where it can win); docs/wire-format.md is the normative description.

This module must not import torch, zmq or any other Fedge package.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from fedge.codec import frames
from fedge.codec.errors import Malformed
from fedge.codec.masks import flat_positions
from fedge.codec.schema import is_int

BoolArray = npt.NDArray[np.bool_]
I64 = npt.NDArray[np.int64]

BITMAP, RICE, RICE_COMPLEMENT = 0, 1, 2
MAX_RICE_PARAM = 30
BITMAP_MIN_DENSITY = 0.1  # below this minority density the bitmap is tried only for clustered masks
BITMAP_ONLY_DENSITY = 0.35  # from this minority density on the Rice code cannot win; skip computing it
RAW_BITMAP_DENSITY = 0.45  # from here zstd saves < 1 % on a bitmap: store it in raw blocks, uncompressed
Segment = list[Any]


def _gaps(positions: I64) -> I64:
    """positions[i] - positions[i - 1] - 1, with positions[-1] read as -1 (np.diff with prepend, in one pass)."""
    gaps = np.empty(positions.size, dtype=np.int64)
    if positions.size:
        gaps[0] = positions[0]
        np.subtract(positions[1:], positions[:-1], out=gaps[1:])
        gaps[1:] -= 1
    return gaps


def _rice_cost(gaps: I64, r: int) -> int:
    return int(gaps.size) * (1 + r) + int((gaps >> r).sum())


def _best_rice_param(gaps: I64, n: int) -> tuple[int, int]:
    count = int(gaps.size)
    mean_gap = (n - count) / count
    guess = max(0, int(np.floor(np.log2(mean_gap * 0.69 + 1.0))))
    costs = [(_rice_cost(gaps, r), r) for r in range(max(0, guess - 1), min(MAX_RICE_PARAM, guess + 1) + 1)]
    cost, r = min(costs)
    return r, cost


def _write_fields(values: I64, r: int) -> bytes:
    """`values` as consecutive r-bit big-endian fields (1 <= r <= 30), zero-padded to a byte."""
    count = int(values.size)
    nbytes = (count * r + 7) // 8
    if r <= 8:  # eight fields fill exactly r bytes: build them in one uint64 per group
        fields = np.zeros(-(-count // 8) * 8, dtype=np.uint64)
        fields[:count] = values
        weights = np.uint64(1) << (r * np.arange(7, -1, -1, dtype=np.uint64))
        packed = (fields.reshape(-1, 8) @ weights).astype(">u8").view(np.uint8).reshape(-1, 8)
        out: bytes = packed[:, 8 - r:].tobytes()[:nbytes]
        return out
    width = 16 if r <= 16 else 32
    bits = np.unpackbits(values.astype(f">u{width // 8}").view(np.uint8)).reshape(-1, width)
    return np.packbits(bits[:, width - r:].reshape(-1)).tobytes()


def _read_fields(stream: bytes, count: int, r: int) -> I64:
    """The `count` consecutive r-bit big-endian fields at the start of `stream`, as int64."""
    groups = -(-count // 8)
    if r <= 8:  # eight fields fill exactly r bytes: join each group's r bytes into one word, then split it
        flat = np.zeros(groups * r, dtype=np.uint8)
        flat[: len(stream)] = np.frombuffer(stream, dtype=np.uint8)
        group_bytes = flat.reshape(groups, r)
        words = group_bytes[:, 0].astype(np.uint64)
        for k in range(1, r):
            words <<= np.uint64(8)
            words |= group_bytes[:, k]
        fields = words[:, None] >> (np.uint64(r) * np.arange(7, -1, -1, dtype=np.uint64))
        fields &= np.uint64((1 << r) - 1)
        small: I64 = fields.reshape(-1)[:count].view(np.int64)  # every field < 2**8: the same bits as int64
        return small
    buf = np.zeros(len(stream) + 8, dtype=np.uint8)
    buf[: len(stream)] = np.frombuffer(stream, dtype=np.uint8)
    windows = np.ndarray(shape=(len(buf) - 7,), dtype=">u8", buffer=buf, strides=(1,))
    starts = np.arange(count, dtype=np.int64) * r
    words64 = windows[starts >> 3].astype(np.uint64)
    words64 <<= (starts & 7).astype(np.uint64)
    words64 >>= np.uint64(64 - r)
    result: I64 = words64.astype(np.int64)
    return result


def rice_encode(positions: I64, r: int) -> tuple[bytes, bytes]:
    """Rice-code the gaps between strictly increasing `positions`; returns (hi, lo)."""
    return _rice_streams(_gaps(positions), r)


def _rice_streams(gaps: I64, r: int) -> tuple[bytes, bytes]:
    if gaps.size == 0:
        return b"", b""
    ends = np.cumsum((gaps >> r) + 1) - 1
    unary = np.zeros(int(ends[-1]) + 1, dtype=np.uint8)
    unary[ends] = 1
    hi = np.packbits(unary).tobytes()
    if r == 0:
        return hi, b""
    return hi, _write_fields(gaps & ((1 << r) - 1), r)


def rice_decode(hi: bytes, lo: bytes, count: int, r: int, n: int, where: str) -> I64:
    """Inverse of `rice_encode` for `count` positions in [0, n); rejects any non-canonical stream."""
    if not 0 <= r <= MAX_RICE_PARAM:
        raise Malformed(f"{where}: Rice parameter {r} is outside [0, {MAX_RICE_PARAM}]")
    if len(lo) != (count * r + 7) // 8:
        raise Malformed(f"{where}: Rice remainder stream holds {len(lo)} bytes, expected {(count * r + 7) // 8}")
    if count == 0:
        if hi:
            raise Malformed(f"{where}: Rice quotient stream must be empty when no position is coded")
        return np.zeros(0, dtype=np.int64)
    if len(hi) > (count + ((n - count) >> r) + 7) // 8:
        raise Malformed(f"{where}: Rice quotient stream is longer than {count} positions in {n} allow")
    ends = np.flatnonzero(np.unpackbits(np.frombuffer(hi, dtype=np.uint8)).view(np.bool_))
    if ends.size != count or len(hi) != int(ends[-1]) // 8 + 1:
        raise Malformed(f"{where}: Rice quotient stream codes {ends.size} positions (with its padding), "
                        f"the table says {count}")
    gaps = _gaps(ends)
    if r:
        pad = 8 * len(lo) - count * r
        if pad and lo[-1] & ((1 << pad) - 1):
            raise Malformed(f"{where}: Rice remainder stream has non-zero padding bits")
        gaps <<= r
        gaps |= _read_fields(lo, count, r)
    positions = np.cumsum(gaps + 1) - 1
    if int(positions[-1]) >= n:
        raise Malformed(f"{where}: Rice-coded position {int(positions[-1])} is outside a tensor of {n} elements")
    return positions


def _bitmap_frame(carried: BoolArray, minority_count: int) -> bytes:
    packed = np.packbits(carried).tobytes()
    if minority_count >= RAW_BITMAP_DENSITY * carried.size:
        return frames.raw_frame(packed)
    return frames.compress(packed, level=1, checksum=False)


def encode_segment(carried: BoolArray, positions: I64 | None = None) -> Segment:
    """The cheapest segment for one tensor; `carried` is its bool slice, `positions` its flatnonzero."""
    n = int(carried.size)
    count = int(positions.size) if positions is not None else int(np.count_nonzero(carried))
    complement = 2 * count > n
    minority_count = n - count if complement else count
    if minority_count == 0:
        return [RICE_COMPLEMENT if complement else RICE, 0, b"", b""]
    if minority_count >= BITMAP_ONLY_DENSITY * n:
        return [BITMAP, 0, _bitmap_frame(carried, minority_count), b""]
    if complement:
        minority = flat_positions(~carried)
    else:
        minority = positions if positions is not None else flat_positions(carried)
    gaps = _gaps(minority)
    r, cost_bits = _best_rice_param(gaps, n)
    clustered = 4 * (1 + int(np.count_nonzero(gaps[1:]))) <= minority_count
    if minority_count >= BITMAP_MIN_DENSITY * n or clustered:
        bitmap = _bitmap_frame(carried, minority_count)
        if 8 * len(bitmap) < cost_bits:
            return [BITMAP, 0, bitmap, b""]
    hi, lo = _rice_streams(gaps, r)
    return [RICE_COMPLEMENT if complement else RICE, r, hi, lo]


def decode_segment(segment: Any, n: int, count: int, where: str) -> tuple[I64 | None, BoolArray | None]:
    """Decode one segment of a tensor with n elements and `count` carried positions.

    Returns (positions, bits): the carried positions (sorted, local to the tensor) when the
    coding yields them directly, and the tensor's bool bitmap when it yields that; at least one
    of the two is not None.
    """
    if not (isinstance(segment, list) and len(segment) == 4):
        raise Malformed(f"{where}: an index segment must be a 4-element array [coding, param, hi, lo]")
    coding, param, hi, lo = segment
    if not (is_int(coding) and is_int(param) and isinstance(hi, bytes) and isinstance(lo, bytes)):
        raise Malformed(f"{where}: index segment fields have the wrong types")
    if coding == BITMAP:
        if param != 0 or lo:
            raise Malformed(f"{where}: a bitmap segment has param 0 and an empty second stream")
        nbytes = (n + 7) // 8
        raw = frames.decompress(hi, max_size=nbytes, exact_size=nbytes, where=where, need_checksum=False)
        packed = np.frombuffer(raw, dtype=np.uint8)
        if n % 8 and int(packed[-1]) & ((1 << (8 - n % 8)) - 1):
            raise Malformed(f"{where}: bitmap has non-zero padding bits")
        bits = np.unpackbits(packed, count=n).view(np.bool_)
        marked = int(np.count_nonzero(bits))
        if marked != count:
            raise Malformed(f"{where}: bitmap marks {marked} positions, the table says {count}")
        return None, bits
    if coding == RICE:
        return rice_decode(hi, lo, count, param, n, where), None
    if coding == RICE_COMPLEMENT:
        absent = rice_decode(hi, lo, n - count, param, n, where)
        keep = np.ones(n, dtype=np.bool_)
        keep[absent] = False
        return None, keep
    raise Malformed(f"{where}: unknown index coding {coding} (known: 0 bitmap, 1 Rice, 2 Rice of the complement)")
