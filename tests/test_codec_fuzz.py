"""Decoding hostile bytes: only CodecError subclasses escape, quickly, and nothing is allocated past the limits.

Mutations are applied both to raw packets (where the zstd checksum catches most of them) and to
the msgpack body re-wrapped in a valid frame (which reaches every structural check).
"""

from __future__ import annotations

import copy
import struct
import time
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fedge.codec import (
    PROTOCOL_VERSION,
    Bye,
    CodecError,
    ErrorMessage,
    Hello,
    Limits,
    Malformed,
    SparseSection,
    Task,
    TensorGroup,
    TooLarge,
    Update,
    Welcome,
    decode,
    encode,
)
from fedge.codec.frames import compress, decompress

HEARTBEAT_PREFIX = b"FEDG" + bytes((PROTOCOL_VERSION, 6, 0, 0))

MAX_SECONDS = 2.0
DEFAULT_LIMITS = Limits()


def corpus() -> list[bytes]:
    rng = np.random.default_rng(7)
    shapes = [(3, 4), (0,), (9,), (2, 3, 5), (), (40, 40)]
    names = [f"t{i}" for i in range(len(shapes))]
    n = sum(int(np.prod(s)) for s in shapes)
    packets = []
    for encoding, density in [("f32", 0.03), ("f32", 0.3), ("f16", 0.5), ("bf16", 0.9), ("int8", 0.15)]:
        mask = rng.random(n) < density
        values = rng.standard_normal(int(mask.sum())).astype(np.float32)
        for section in (SparseSection.with_mask(names, shapes, mask, values),
                        SparseSection.with_indices(names, shapes, np.flatnonzero(mask), values),
                        SparseSection.masked_values(names, shapes, ~mask, values, select=False)):
            dense = {"x": rng.standard_normal((2, 2)).astype(np.float32), "steps": np.array(5, np.int64),
                     "flags": np.array([True, False])}
            packets.append(encode(Update("run", 1, "agent", {"g": TensorGroup(dense, section, encoding),
                                                              "empty": TensorGroup()}, {"a": [1, {"b": None}]})))
    packets += [encode(m) for m in (Hello("r", 0, "a", "0.1", 1, "2.3", "abc", ("sparse",), 10),
                                    Welcome("r", 0, "c", {"k": 1.5}), ErrorMessage("r", 1, "c", "E", "bad"),
                                    Bye("r", 1, "a", "done"), Task("r", 2, "c"))]
    return packets


CORPUS = corpus()


def assert_rejects_cleanly(data: bytes, limits: Limits = DEFAULT_LIMITS) -> None:
    start = time.perf_counter()
    try:
        decode(data, limits)
    except CodecError as exc:
        assert str(exc), "every rejection carries a reason"
    assert time.perf_counter() - start < MAX_SECONDS


def body_of(packet: bytes) -> Any:
    return msgpack.unpackb(decompress(packet[8:], max_size=1 << 24, where="test", need_checksum=True), raw=False)


def rewrap(packet: bytes, body: Any) -> bytes:
    return packet[:8] + compress(msgpack.packb(body, use_bin_type=True))


@settings(max_examples=150, deadline=None)
@given(index=st.integers(0, len(CORPUS) - 1), cut=st.floats(0, 1))
def test_truncated_packets(index: int, cut: float) -> None:
    packet = CORPUS[index]
    assert_rejects_cleanly(packet[: int(cut * (len(packet) - 1))])


@settings(max_examples=150, deadline=None)
@given(index=st.integers(0, len(CORPUS) - 1), flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 7)),
                                                              min_size=1, max_size=4))
def test_bit_flips_in_packets(index: int, flips: list[tuple[float, int]]) -> None:
    data = bytearray(CORPUS[index])
    for where, bit in flips:
        data[int(where * (len(data) - 1))] ^= 1 << bit
    assert_rejects_cleanly(bytes(data))


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=300), prefixed=st.booleans(), kind=st.integers(0, 9))
def test_random_bytes(data: bytes, prefixed: bool, kind: int) -> None:
    assert_rejects_cleanly((b"FEDG" + bytes([1, kind, 0, 0]) + data) if prefixed else data)
    assert_rejects_cleanly(b"FEDG" + bytes([1, kind, 0, 0]) + compress(data))


LEAVES: list[Any] = [None, True, False, 0, -1, 1, 2, 3, 31, 255, 2**32, 2**63 - 1, -(2**63), 2**64 - 1, 0.5,
                     float("nan"), "", "x", "f32", "int8", "bool", b"", b"\x00" * 7, b"\xff" * 64, [], [1], [[1, 2]],
                     {}, {"a": 1}, [0, 0, b"", b""], [1, 3, b"\xff", b"\x00"], [2, 30, b"\x01", b""], [[2**40, 2**40]]]


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += paths(value, prefix + (i,))
    return found


def mutated(value: Any, choice: int, amount: int) -> Any:
    if isinstance(value, bytes) and value and choice < 3:
        cut = amount % len(value)
        return [value[:cut], value + bytes([amount % 256]) * (1 + choice), bytes([value[0] ^ (1 << (amount % 8))]) + value[1:]][choice]
    if isinstance(value, int) and not isinstance(value, bool) and choice < 3:
        return [value + 1, value - 1, value + amount][choice]
    if isinstance(value, list) and value and choice < 2:
        return value[1:] if choice == 0 else value + value[:1]
    if isinstance(value, dict) and value and choice == 0:
        return {k: v for i, (k, v) in enumerate(value.items()) if i != amount % len(value)}
    return copy.deepcopy(LEAVES[amount % len(LEAVES)])


@settings(max_examples=400, deadline=None)
@given(index=st.integers(0, len(CORPUS) - 1), edits=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 4),
                                                                        st.integers(0, 2**16)), min_size=1, max_size=3))
def test_structural_mutations_of_the_body(index: int, edits: list[tuple[float, int, int]]) -> None:
    body = body_of(CORPUS[index])
    for where, choice, amount in edits:
        targets = paths(body)
        path = targets[int(where * (len(targets) - 1))]
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        if path:
            parent[path[-1]] = mutated(parent[path[-1]], choice, amount)
        else:
            body = mutated(body, choice, amount)
    try:
        packet = rewrap(CORPUS[index], body)
    except (OverflowError, ValueError):  # e.g. an integer msgpack cannot hold: no packet to test
        assume(False)
    assert_rejects_cleanly(packet)


def frame_declaring(size: int) -> bytes:
    """A zstd frame header claiming `size` bytes of content, then one tiny RLE block (a bomb)."""
    descriptor = 0b11100100  # 8-byte Frame_Content_Size, single segment, checksum flag
    block = struct.pack("<I", (1 << 3) | (1 << 1) | 1)[:3]  # last block, RLE, 1 byte of content
    return b"\x28\xb5\x2f\xfd" + bytes([descriptor]) + struct.pack("<Q", size) + block + b"\x00" + b"\x00" * 4


def test_decompression_bombs_are_refused_from_the_header() -> None:
    for size in (1 << 40, 300 << 20):
        with pytest.raises(TooLarge):
            decode(HEARTBEAT_PREFIX + frame_declaring(size))
    zeros = compress(b"\x00" * (2 << 20))
    with pytest.raises(TooLarge):
        decode(HEARTBEAT_PREFIX + zeros, Limits(max_decompressed_bytes=1 << 20))


def test_a_huge_declared_tensor_is_refused_before_allocation() -> None:
    body = body_of(CORPUS[0])
    section = body["g"]["g"]["sp"]
    section["shapes"][5] = [1 << 30, 1 << 30]
    with pytest.raises(TooLarge):
        decode(rewrap(CORPUS[0], body))
    body["g"]["g"]["t"] = [[f"n{i}", "f32", [0]] for i in range(5000)]
    with pytest.raises((TooLarge, Malformed)):
        decode(rewrap(CORPUS[0], body))


def test_inner_bitmap_and_rice_bombs_are_refused() -> None:
    names, shapes = ["w"], [(1000,)]
    mask = np.zeros(1000, dtype=bool)
    mask[::3] = True
    packet = encode(Task("r", 0, "c", {"m": TensorGroup({}, SparseSection.with_mask(names, shapes, mask,
                                                                                      np.ones(334, np.float32)))}))
    body = body_of(packet)
    segment = body["g"]["m"]["sp"]["ix"][0]
    assert segment[0] == 0  # a bitmap at density 1/3
    segment[2] = frame_declaring(1 << 40)
    with pytest.raises(Malformed):
        decode(rewrap(packet, body))
    body["g"]["m"]["sp"]["ix"][0] = [1, 0, b"\x00" * 100_000 + b"\x01", b""]  # a quotient stream far too long
    with pytest.raises(Malformed):
        decode(rewrap(packet, body))


def test_msgpack_headers_claiming_huge_lengths() -> None:
    for body in (b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff", b"\x91" * 5000 + b"\x00"):
        with pytest.raises(Malformed):
            decode(HEARTBEAT_PREFIX + compress(body))
