"""docs/wire-format.md's worked examples are what the codec really produces and accepts."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from fedge.codec import PROTOCOL_VERSION, Heartbeat, SparseSection, Task, TensorGroup, Update, decode, encode
from fedge.codec.frames import decompress

DOC = (Path(__file__).resolve().parents[1] / "docs" / "wire-format.md").read_text()


def code_blocks() -> list[str]:
    """Every fenced block of the doc that is only hex digits, with the whitespace removed."""
    blocks, current = [], None
    for line in DOC.splitlines():
        if line.startswith("```"):
            if current is not None:
                blocks.append("".join(current))
            current = [] if current is None else None
        elif current is not None:
            current.append(line)
    return [re.sub(r"\s+", "", b) for b in blocks if re.fullmatch(r"[0-9a-f\s]+", b)]


def example_messages() -> tuple[Heartbeat, Task, Update, np.ndarray]:
    mask = np.zeros(8, bool)
    mask[[1, 6]] = True
    w = np.zeros((2, 4), np.float32)
    w.flat[1], w.flat[6] = 1.5, -0.25
    task = Task("r1", 3, "c", {"model": TensorGroup({"b": np.array([0.5, -2.0], np.float32)},
                                                    SparseSection.from_dense(["w"], [w], mask))})
    update = Update("r1", 3, "a7", {"model": TensorGroup(
        {"b": np.array([0.125, 0.0], np.float32)},
        SparseSection.masked_values(["w"], [(2, 4)], mask, np.array([0.125, -0.5, 1.0, 0.0, 2.0, -1.0], np.float32)))})
    return Heartbeat("r1", 3, "a7", {"step": 12}), task, update, mask


def body_hex(packet: bytes) -> str:
    return decompress(packet[8:], max_size=1 << 20, where="test", need_checksum=True).hex()


def test_heartbeat_example_is_byte_exact() -> None:
    beat = example_messages()[0]
    packet = encode(beat).hex()
    assert packet in code_blocks()
    assert decode(bytes.fromhex(packet)) == beat


def test_downlink_example_body_and_packet() -> None:
    _, task, _, mask = example_messages()
    blocks = code_blocks()
    assert body_hex(encode(task)) in blocks
    packet = next(b for b in blocks if b.startswith("46454447" + f"{PROTOCOL_VERSION:02x}" + "030000"))
    back = decode(bytes.fromhex(packet))
    assert isinstance(back, Task) and back.groups["model"].sparse is not None
    assert np.array_equal(back.groups["model"].sparse.mask, mask)
    assert np.array_equal(back.groups["model"].sparse.to_dense()["w"].reshape(-1), [0, 1.5, 0, 0, 0, 0, -0.25, 0])


def test_uplink_example_section() -> None:
    _, _, update, mask = example_messages()
    body = body_hex(encode(update))
    section = next(b for b in code_blocks() if b.startswith("a27370"))
    assert section in body
    dense = decode(encode(update)).groups["model"].sparse.to_dense(mask)["w"]
    assert np.array_equal(dense.reshape(-1), [0.125, 0, -0.5, 1.0, 0.0, 2.0, 0, -1.0])
