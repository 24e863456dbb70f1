"""Value blocks: how a run of float32 values is laid out on the wire.

A value block holds n float32 values in one of four encodings: "f32" (lossless, rotated and
byte-shuffled), "f16" and "bf16" (lossy, 2 bytes, byte-shuffled) and "int8" (lossy, linear, one
scale per segment; a segment is one tensor). Byte shuffling stores byte 0 of every value, then
byte 1, and so on (as Blosc does), which lets zstd compress the exponent bytes and skip the noisy
low mantissa bytes quickly. "f32" first rotates each value's 32 bits left by one, so the sign
goes to bit 0 and the top byte plane holds exactly the biased exponent (format version 2: one
low-entropy plane instead of sign-and-exponent plus an exponent bit mixed into the mantissa;
measured smaller and faster to compress, docs/wire-format.md section 11). "bf16" is not rotated:
on the benchmark model the same rotation made its top-k downlinks 4.5 % smaller at k/N 0.1 but
2.2 % larger at 0.5, and its uplinks 0.1-2 % smaller, too mixed to change its layout. Decoded values
are always float32.

This module must not import torch, zmq or any other Fedge package.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fedge.codec.errors import Malformed, NonFinite, OutOfRange

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]

VALUE_ENCODINGS: tuple[str, ...] = ("f32", "f16", "bf16", "int8")
WIDTH: dict[str, int] = {"f32": 4, "f16": 2, "bf16": 2, "int8": 1}
INT8_MAX = 127
SHIFT_BLOCK = 1 << 20  # values shifted per block in Shuffled.write_into (a per-thread scratch of at most 4 MiB)
WORD: dict[int, np.dtype[np.unsignedinteger]] = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


def shuffle(planes_in: U8) -> U8:
    """(n, w) bytes of n values -> (w, n): all byte-0s first, then all byte-1s, and so on."""
    n, width = planes_in.shape
    out = np.empty((width, n), dtype=np.uint8)
    for j in range(width):
        out[j] = planes_in[:, j]
    return out


_local = threading.local()


def _shift_scratch(count: int, width: int) -> npt.NDArray[np.unsignedinteger]:
    """This thread's reused native-endian word array of at least `count` words of `width` bytes (its first
    `count`): a fresh multi-MB temporary per packet costs page faults where the allocator returns it each time."""
    key = f"words{width}"
    found: npt.NDArray[np.unsignedinteger] | None = getattr(_local, key, None)
    if found is None or found.size < count:
        found = np.empty(count, dtype=WORD[width].newbyteorder("="))
        setattr(_local, key, found)
    return found[:count]


def rotate_left(rows: U8) -> U8:
    """(n, w) value bytes -> the same values with each w-byte little-endian word rotated left by one bit."""
    words = np.ascontiguousarray(rows).reshape(-1).view(WORD[rows.shape[1]])
    top = 8 * rows.shape[1] - 1
    rotated: U8 = ((words << 1) | (words >> top)).view(np.uint8).reshape(rows.shape)
    return rotated


@dataclass(frozen=True)
class Shuffled:
    """A byte-shuffled payload of n values of w bytes (`rows` is n x w), laid out on demand.

    With `rotate` (f32 values, docs/wire-format.md section 6) each value's word is first rotated left by one bit,
    so the sign moves to bit 0 and the top byte plane holds exactly the exponent. The packet writer has the planes
    written straight into its body buffer (`write_into`), so the shuffled block is never built on its own.
    """

    rows: U8
    rotate: bool = False

    @property
    def nbytes(self) -> int:
        return int(self.rows.size)

    def write_into(self, out: U8) -> None:
        """Write the w planes, one after the other, into the flat uint8 array `out` (nbytes long).

        For w = 2 and 4 the rows are read as little-endian words and plane j is (word >> 8j),
        cast to uint8: contiguous passes, about twice as fast as copying strided byte columns.
        Rotated, plane j >= 1 is (word >> (8j - 1)) and plane 0 is (word << 1) | (word >> (8w - 1)).
        """
        n, width = self.rows.shape
        if width in WORD and self.rows.flags.c_contiguous:
            words = self.rows.reshape(-1).view(WORD[width])
            step = SHIFT_BLOCK
            shifted = _shift_scratch(min(n, step), width)
            for start in range(0, n, step):  # in blocks of at most SHIFT_BLOCK values, through a reused scratch
                block = words[start:start + step]
                part = shifted[:block.size]
                for j in range(width):
                    plane = out[j * n + start:j * n + start + block.size]
                    if not self.rotate:
                        np.right_shift(block, 8 * j, out=part)
                    elif j:
                        np.right_shift(block, 8 * j - 1, out=part)
                    else:
                        np.right_shift(block, 8 * width - 1, out=part)
                        np.copyto(plane, part, casting="unsafe")
                        np.left_shift(block, 1, out=part)
                        np.bitwise_or(plane, part, out=plane, casting="unsafe")
                        continue
                    np.copyto(plane, part, casting="unsafe")
            return
        rows = rotate_left(self.rows) if self.rotate else self.rows
        for j in range(width):
            out[j * n:(j + 1) * n] = rows[:, j]

    def tobytes(self) -> bytes:
        return shuffle(rotate_left(self.rows) if self.rotate else self.rows).tobytes()


def unshuffle(data: bytes | memoryview, n: int, width: int, rotate: bool = False) -> U8:
    """Inverse of `shuffle` (and, with `rotate`, of the rotation): (w * n) shuffled bytes -> (n, w) bytes.

    For w = 2 and 4 each value is assembled as a little-endian word by shifting and OR-ing the
    planes from the most significant down (contiguous passes, faster than strided byte columns).
    """
    planes = np.frombuffer(data, dtype=np.uint8, count=n * width).reshape(width, n)
    if width in WORD:
        words = np.empty(n, dtype=WORD[width])
        np.copyto(words, planes[width - 1])
        for j in range(width - 2, -1, -1):
            words <<= 8
            words |= planes[j]
        if rotate:  # word = (word >> 1) | (word << (8w - 1)), in blocks through this thread's bounded scratch
            scratch = _shift_scratch(min(n, SHIFT_BLOCK), width)
            for start in range(0, n, SHIFT_BLOCK):
                block = words[start:start + SHIFT_BLOCK]
                low = scratch[:block.size]
                np.left_shift(block, 8 * width - 1, out=low)
                block >>= 1
                block |= low
        return words.view(np.uint8).reshape(n, width)
    if rotate:
        raise ValueError(f"only 2- and 4-byte values are rotated, not {width}-byte ones")
    out = np.empty((n, width), dtype=np.uint8)
    for j in range(width):
        out[:, j] = planes[j]
    return out


def _segment_scales(mag: npt.NDArray[np.float64], counts: Sequence[int]) -> npt.NDArray[np.float32]:
    counts_arr = np.asarray(counts, dtype=np.int64)
    scales = np.zeros(len(counts_arr), dtype=np.float32)
    nonempty = np.flatnonzero(counts_arr)
    if nonempty.size:
        starts = (np.cumsum(counts_arr) - counts_arr).take(nonempty)
        peaks = np.maximum.reduceat(mag, starts)
        scales[nonempty] = (peaks / INT8_MAX).astype(np.float32)
    return scales


def _quantize(vals: F32, encoding: str, counts: Sequence[int]) -> tuple[npt.NDArray[Any], npt.NDArray[np.float32]]:
    """The lossy encodings' stored numbers (binary16, bfloat16 bits or int8) and int8's per-segment scales."""
    if not np.isfinite(vals).all():
        raise NonFinite(f"cannot encode NaN or infinity as {encoding}; send these values as f32")
    if encoding == "f16":
        with np.errstate(over="ignore"):
            half = vals.astype("<f2")
        if np.isinf(half).any():
            raise OutOfRange("a value is beyond float16's range (|x| > 65504); use bf16 or f32")
        return half, np.zeros(0, dtype=np.float32)
    if encoding == "bf16":
        bits = vals.view("<u4")
        rounded = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype("<u2")
        if ((rounded & 0x7F80) == 0x7F80).any():
            raise OutOfRange("a value rounds to infinity in bfloat16; send these values as f32")
        return rounded, np.zeros(0, dtype=np.float32)
    wide = vals.astype(np.float64)
    scales = _segment_scales(np.abs(wide), counts)
    per_value = np.repeat(scales.astype(np.float64), counts)
    quotient = np.zeros_like(wide)
    np.divide(wide, per_value, out=quotient, where=per_value > 0)
    return np.clip(np.rint(quotient), -INT8_MAX, INT8_MAX).astype(np.int8), scales


def _dequantize(stored: npt.NDArray[Any], encoding: str, scales: npt.NDArray[np.float32],
                counts: Sequence[int]) -> F32:
    """The float32 values a receiver rebuilds from a lossy encoding's stored numbers."""
    if encoding == "f16":
        return stored.astype(np.float32)
    if encoding == "bf16":
        widened: F32 = (stored.astype(np.uint32) << 16).view(np.float32)
        return widened
    with np.errstate(over="ignore"):
        values: F32 = stored.astype(np.float32) * np.repeat(scales, counts)
    return values


def encode_values(values: F32, encoding: str, counts: Sequence[int]) -> tuple[Shuffled | memoryview, bytes]:
    """Encode 1-D float32 `values`; returns (payload, int8 scales or b"").

    `counts` splits the values into segments (one per tensor) for int8's per-tensor scales.
    Lossy encodings refuse NaN/Inf (`NonFinite`) and values they would turn into infinity
    (`OutOfRange`); "f32" carries every bit pattern unchanged.
    """
    if encoding not in WIDTH:
        raise Malformed(f"unknown value encoding {encoding!r}; use one of {', '.join(VALUE_ENCODINGS)}")
    vals = np.ascontiguousarray(values, dtype="<f4").reshape(-1)
    if encoding == "f32":
        return Shuffled(vals.view(np.uint8).reshape(-1, 4), rotate=True), b""
    stored, scales = _quantize(vals, encoding, counts)
    if encoding == "int8":
        return stored.view(np.uint8).data, scales.astype("<f4").tobytes()
    return Shuffled(stored.view(np.uint8).reshape(-1, 2)), b""


def received_values(values: F32, encoding: str, counts: Sequence[int]) -> F32:
    """The float32 values a receiver decodes when `values` travel in `encoding` (`counts`: the segments of int8's
    scales): the packet's quantisation, without a packet. The same errors as `encode_values`."""
    if encoding not in WIDTH:
        raise Malformed(f"unknown value encoding {encoding!r}; use one of {', '.join(VALUE_ENCODINGS)}")
    vals = np.ascontiguousarray(values, dtype="<f4").reshape(-1)
    if encoding == "f32":
        return vals.astype(np.float32, copy=True)
    stored, scales = _quantize(vals, encoding, counts)
    return _dequantize(stored, encoding, scales, counts)


def decode_values(payload: bytes, scales: bytes, encoding: str, counts: Sequence[int],
                  *, allow_nonfinite: bool, where: str) -> F32:
    """Decode a value block of sum(counts) values; `where` names the block in error messages."""
    if encoding not in WIDTH:
        raise Malformed(f"{where}: unknown value encoding {encoding!r}")
    n = int(sum(counts))
    width = WIDTH[encoding]
    if len(payload) != n * width:
        raise Malformed(f"{where}: value payload holds {len(payload)} bytes, the table implies {n * width}")
    want_scales = 4 * len(counts) if encoding == "int8" else 0
    if len(scales) != want_scales:
        raise Malformed(f"{where}: scale field holds {len(scales)} bytes, expected {want_scales}")
    if encoding == "f32":
        out = unshuffle(payload, n, 4, rotate=True).view("<f4").reshape(-1).astype(np.float32, copy=False)
    elif encoding == "f16":
        out = _dequantize(unshuffle(payload, n, 2).view("<f2").reshape(-1), encoding, np.zeros(0, np.float32), counts)
    elif encoding == "bf16":
        out = _dequantize(unshuffle(payload, n, 2).view("<u2").reshape(-1), encoding, np.zeros(0, np.float32), counts)
    else:
        scale_arr = np.frombuffer(scales, dtype="<f4").astype(np.float32)
        if not allow_nonfinite and not np.isfinite(scale_arr).all():
            raise NonFinite(f"{where}: an int8 scale is NaN or infinite")
        if (scale_arr < 0).any():
            raise Malformed(f"{where}: an int8 scale is negative")
        out = _dequantize(np.frombuffer(payload, dtype=np.int8), encoding, scale_arr, counts)
    if not allow_nonfinite and not np.isfinite(out).all():
        bad = int(out.size - np.count_nonzero(np.isfinite(out)))
        raise NonFinite(f"{where}: {bad} value(s) are NaN or infinite; the sender must not send them "
                        f"(or decode with Limits(allow_nonfinite=True))")
    return out

