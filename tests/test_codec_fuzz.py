"""Decoding hostile bytes: only CodecError subclasses escape, quickly, and nothing is allocated past the limits.

Mutations are applied both to raw packets (where the header CRC and the zstd checksum catch most of them) and to
the msgpack header and body re-wrapped with a valid CRC and frame (which reaches every structural check).
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
    read_header,
)
from fedge.codec.frames import compress
from tests.packets import head, parts, rebuild

MAX_SECONDS = 2.0
DEFAULT_LIMITS = Limits()


def welcome() -> Welcome:
    return Welcome("r", 0, "c", client_index=1, num_clients=3, seed=7, model_hash="h",
                   model={"name": "cnn", "input_shape": [1, 28, 28], "num_classes": 10, "pan": "none", "pan_a": 1.0,
                          "pan_t": 1.0, "options": {}},
                   algorithm="fedavg", algorithm_options={"keep": 0.5},
                   train={"epochs": 1, "batch_size": 64, "lr": 0.001, "optimizer": "adam", "momentum": 0.0,
                          "weight_decay": 0.0, "loss": "cross_entropy", "class_weights": []},
                   heartbeat_s=5.0, liveness_s=30.0, normalization={"mean": [0.5], "std": [0.25]})


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
    packets += [encode(m) for m in (Hello("r", 0, "a", "0.1", (PROTOCOL_VERSION,), "2.3", "abc", ("sparse",), 10,
                                          "cpu", (1, 28, 28), 10, ("r", 2)),
                                    welcome(), ErrorMessage("r", 1, "c", "stale", "bad"),
                                    Bye("r", 1, "a", "finished", "done"), Task("r", 2, "c", deadline_s=3.5),
                                    Update("r", 2, "a", num_samples=5, record={"cpu_s": 0.5},
                                           evaluation={"accuracy": 0.5}, eval_samples=3))]
    return packets


CORPUS = corpus()


def assert_rejects_cleanly(data: bytes, limits: Limits = DEFAULT_LIMITS) -> None:
    start = time.perf_counter()
    try:
        decode(data, limits)
    except CodecError as exc:
        assert str(exc), "every rejection carries a reason"
    assert time.perf_counter() - start < MAX_SECONDS




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
    prefix = b"FEDG" + bytes([PROTOCOL_VERSION, kind, 0, 0])
    assert_rejects_cleanly((prefix + data) if prefixed else data)
    assert_rejects_cleanly(head(kind, data) + compress(data))
    assert_rejects_cleanly(head(kind, msgpack.packb({"v": PROTOCOL_VERSION, "k": kind})) + data)


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
def test_structural_mutations_of_header_and_body(index: int, edits: list[tuple[float, int, int]]) -> None:
    body = parts(CORPUS[index])
    for where, choice, amount in edits:
        targets = paths(body)[1:]  # not the tree itself: its two parts and everything in them
        path = targets[int(where * (len(targets) - 1))]
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        if path:
            parent[path[-1]] = mutated(parent[path[-1]], choice, amount)
        else:
            body = mutated(body, choice, amount)
    try:
        packet = rebuild(CORPUS[index], body)
    except (OverflowError, ValueError):  # e.g. an integer msgpack cannot hold: no packet to test
        assume(False)
    assert_rejects_cleanly(packet)


def frame_declaring(size: int) -> bytes:
    """A zstd frame header claiming `size` bytes of content, then one tiny RLE block (a bomb)."""
    descriptor = 0b11100100  # 8-byte Frame_Content_Size, single segment, checksum flag
    block = struct.pack("<I", (1 << 3) | (1 << 1) | 1)[:3]  # last block, RLE, 1 byte of content
    return b"\x28\xb5\x2f\xfd" + bytes([descriptor]) + struct.pack("<Q", size) + block + b"\x00" + b"\x00" * 4


def test_decompression_bombs_are_refused_from_the_header() -> None:
    task = encode(Task("r", 2, "c"))
    task_head = task[:read_header(task).body_at]
    for size in (1 << 40, 300 << 20):
        with pytest.raises(TooLarge):
            decode(task_head + frame_declaring(size))
    zeros = compress(b"\x00" * (2 << 20))
    with pytest.raises(TooLarge):
        decode(task_head + zeros, Limits(max_decompressed_bytes=1 << 20))
    with pytest.raises(TooLarge, match="header"):
        decode(head(6, b"\x80" * (2 << 20)))


def test_a_huge_declared_tensor_is_refused_before_allocation() -> None:
    tree = parts(CORPUS[0])
    section = tree["body"]["g"]["g"]["sp"]
    section["shapes"][5] = [1 << 30, 1 << 30]
    with pytest.raises(TooLarge):
        decode(rebuild(CORPUS[0], tree))
    tree["body"]["g"]["g"]["t"] = [[f"n{i}", "f32", [0]] for i in range(5000)]
    with pytest.raises((TooLarge, Malformed)):
        decode(rebuild(CORPUS[0], tree))


def test_inner_bitmap_and_rice_bombs_are_refused() -> None:
    names, shapes = ["w"], [(1000,)]
    mask = np.zeros(1000, dtype=bool)
    mask[::3] = True
    packet = encode(Task("r", 0, "c", {"m": TensorGroup({}, SparseSection.with_mask(names, shapes, mask,
                                                                                      np.ones(334, np.float32)))}))
    tree = parts(packet)
    segment = tree["body"]["g"]["m"]["sp"]["ix"][0]
    assert segment[0] == 0  # a bitmap at density 1/3
    segment[2] = frame_declaring(1 << 40)
    with pytest.raises(Malformed):
        decode(rebuild(packet, tree))
    tree["body"]["g"]["m"]["sp"]["ix"][0] = [1, 0, b"\x00" * 100_000 + b"\x01", b""]  # a quotient stream far too long
    with pytest.raises(Malformed):
        decode(rebuild(packet, tree))


def test_msgpack_headers_claiming_huge_lengths() -> None:
    task = encode(Task("r", 2, "c"))
    task_head = task[:read_header(task).body_at]
    for body in (b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff", b"\x91" * 5000 + b"\x00"):
        with pytest.raises(Malformed):
            decode(task_head + compress(body))
        with pytest.raises(Malformed):
            decode(head(6, body))
