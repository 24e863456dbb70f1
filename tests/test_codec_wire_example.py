"""docs/wire-format.md's worked examples are what the codec really produces and accepts, byte for byte."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from fedge.codec import (
    Bye,
    Heartbeat,
    SecAggUnmask,
    SparseSection,
    Task,
    TensorGroup,
    Update,
    decode,
    encode,
    read_header,
    version2_error,
    version3_error,
)
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


MASK = np.zeros(8, bool)
MASK[[1, 6]] = True


def downlink() -> Task:
    w = np.zeros((2, 4), np.float32)
    w.flat[1], w.flat[6] = 1.5, -0.25
    return Task("r1", 3, "c", {"model": TensorGroup({"b": np.array([0.5, -2.0], np.float32)},
                                                    SparseSection.from_dense(["w"], [w], MASK))},
                committed_round=2, last_accepted_round=2, deadline_s=30.0)


def uplink() -> Update:
    return Update("r1", 3, "a7", {"model": TensorGroup(
        {"b": np.array([0.125, 0.0], np.float32)},
        SparseSection.masked_values(["w"], [(2, 4)], MASK, np.array([0.125, -0.5, 1.0, 0.0, 2.0, -1.0], np.float32)))},
        num_samples=600, steps=10, train_loss=0.5, train_s=1.5, record={"cpu_s": 0.25})


def body_hex(packet: bytes) -> str:
    return decompress(packet[read_header(packet).body_at:], max_size=1 << 20, where="test", need_checksum=True).hex()


def test_heartbeat_and_bye_examples_are_byte_exact() -> None:
    for message in (Heartbeat("r1", 3, "a7", steps=12, ready=False),
                    Bye("r1", 50, "coordinator", code="finished", reason="session finished")):
        packet = encode(message).hex()
        assert packet in code_blocks()
        assert decode(bytes.fromhex(packet)) == message


def test_downlink_example_packet_and_body() -> None:
    task = downlink()
    packet = encode(task)
    blocks = code_blocks()
    assert packet.hex() in blocks and body_hex(packet) in blocks
    back = decode(bytes.fromhex(next(b for b in blocks if b == packet.hex())))
    assert isinstance(back, Task) and back.groups["model"].sparse is not None
    assert (back.committed_round, back.last_accepted_round, back.deadline_s) == (2, 2, 30.0)
    assert np.array_equal(back.groups["model"].sparse.mask, MASK)
    assert np.array_equal(back.groups["model"].sparse.to_dense()["w"].reshape(-1), [0, 1.5, 0, 0, 0, 0, -0.25, 0])


def test_uplink_example_header_and_section() -> None:
    update = uplink()
    packet = encode(update)
    blocks = code_blocks()
    assert packet[:read_header(packet).body_at].hex() in blocks
    section = next(b for b in blocks if b.startswith("a27370"))
    assert section in body_hex(packet)
    back = decode(packet)
    assert isinstance(back, Update) and (back.num_samples, back.steps, back.record) == (600, 10, {"cpu_s": 0.25})
    dense = back.groups["model"].sparse.to_dense(MASK)["w"]
    assert np.array_equal(dense.reshape(-1), [0.125, 0, -0.5, 1.0, 0.0, 2.0, 0, -1.0])


def test_the_older_version_refusal_examples() -> None:
    assert version2_error("r1", "coordinator", "protocol-mismatch", "upgrade the agent").hex() in code_blocks()
    version3 = version3_error("r1", "coordinator", "protocol-mismatch", "upgrade the agent")
    assert version3.hex() in code_blocks() and version3[4] == 3 and version3[5] == 7


def test_the_secure_aggregation_example_is_byte_exact() -> None:
    message = SecAggUnmask("r1", 3, "coordinator", attempt=0, survivors=("a7", "b2"), dropped=("c1",))
    packet = encode(message)
    assert packet.hex() in code_blocks()
    assert decode(packet) == message and body_hex(packet) == "82a2737692a26137a26232a2647291a26331"
