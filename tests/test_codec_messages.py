"""Every message kind round-trips with its header fields; versions, kinds and body/prefix disagreements are rejected."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from fedge.codec import (
    PROTOCOL_VERSION,
    Bye,
    Commit,
    ErrorMessage,
    Heartbeat,
    Hello,
    Malformed,
    Task,
    TensorGroup,
    UnknownKind,
    UnsupportedVersion,
    Update,
    Welcome,
    decode,
    encode,
)
from fedge.codec.frames import compress, decompress

MESSAGES = [
    Hello("run-1", 0, "agent-07", "0.1.0", PROTOCOL_VERSION, "2.3.1", "sha256:ab12", ("sparse", "int8"), 6000,
          {"device": "rpi4", "ram_mb": 3900}),
    Welcome("run-1", 0, "coordinator", {"rounds": 50, "value_dtype": "f32", "nested": {"a": [1, 2.5, None, True]}}),
    Task("run-1", 4, "coordinator", {}, {"deadline_s": 30.0}),
    Update("run-1", 4, "agent-07", {}, {"samples": 600, "loss": 0.42}),
    Commit("run-1", 4, "coordinator"),
    Heartbeat("run-1", 4, "agent-07", {"progress": 0.5}),
    ErrorMessage("run-1", 4, "coordinator", "mask-mismatch", "the update's mask CRC is not this round's"),
    Bye("run-1", 50, "agent-07", "run finished"),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_kind_round_trips(message: object) -> None:
    packet = encode(message)  # type: ignore[arg-type]
    back = decode(packet)
    assert type(back) is type(message) and back == message
    assert back.version == PROTOCOL_VERSION and packet[4] == PROTOCOL_VERSION and packet[5] == back.kind_code
    assert back.kind == type(message).__name__.lower().replace("errormessage", "error")


def test_kind_codes_are_distinct_and_stable() -> None:
    codes = {type(m).kind: type(m).kind_code for m in MESSAGES}
    assert codes == {"hello": 1, "welcome": 2, "task": 3, "update": 4, "commit": 5, "heartbeat": 6, "error": 7,
                     "bye": 8}


def test_messages_are_frozen_and_meta_defaults_to_empty() -> None:
    beat = Heartbeat("r", 1, "a")
    assert beat.meta == {}
    with pytest.raises(AttributeError):
        beat.round = 2  # type: ignore[misc]


def test_unknown_version_and_kind_are_rejected() -> None:
    packet = bytearray(encode(Commit("r", 1, "c")))
    for other in (PROTOCOL_VERSION - 1, PROTOCOL_VERSION + 1):  # an older agent's packet, a newer one's
        packet[4] = other
        with pytest.raises(UnsupportedVersion) as info:
            decode(bytes(packet))
        assert info.value.version == other and f"version {other}" in str(info.value) and "upgrade" in str(info.value)
    packet[4], packet[5] = PROTOCOL_VERSION, 42
    with pytest.raises(UnknownKind):
        decode(bytes(packet))
    packet[5], packet[7] = 5, 1
    with pytest.raises(Malformed, match="flags"):
        decode(bytes(packet))


def test_body_must_agree_with_the_prefix() -> None:
    packet = encode(Commit("r", 1, "c"))
    # A flipped kind byte must not turn a Commit into a Heartbeat (their bodies look alike).
    as_heartbeat = packet[:5] + bytes([6]) + packet[6:]
    with pytest.raises(Malformed, match="disagrees"):
        decode(as_heartbeat)
    body = msgpack.unpackb(decompress(packet[8:], max_size=1 << 20, where="t", need_checksum=True))
    body["extra"] = 1
    with pytest.raises(Malformed, match="unexpected"):
        decode(packet[:8] + compress(msgpack.packb(body)))


def test_a_frame_without_content_checksum_is_rejected() -> None:
    packet = encode(Commit("r", 1, "c"))
    body = decompress(packet[8:], max_size=1 << 20, where="t", need_checksum=True)
    with pytest.raises(Malformed, match="checksum"):
        decode(packet[:8] + compress(body, checksum=False))


@pytest.mark.parametrize("build", [
    lambda: Heartbeat("r", -1, "a"),
    lambda: Heartbeat("r", True, "a"),  # type: ignore[arg-type]
    lambda: Heartbeat(7, 1, "a"),  # type: ignore[arg-type]
    lambda: Hello("r", 0, "a", "v", 1, "t", "h", "not-a-tuple-of-str", 5),
    lambda: Task("r", 0, "c", {"model": {"w": np.zeros(3)}}),  # type: ignore[dict-item]
    lambda: Task("r", 0, "c", {"": TensorGroup()}),
    lambda: TensorGroup(value_dtype="f64"),
])
def test_invalid_messages_are_refused_at_construction(build: object) -> None:
    with pytest.raises(Malformed):
        build()  # type: ignore[operator]


@pytest.mark.parametrize("meta", [{1: "int key"}, {"a": b"bytes"}, {"a": object()}, {"a": {"b": 1 << 70}}])
def test_meta_must_be_msgpack_native(meta: dict[object, object]) -> None:
    with pytest.raises(Malformed):
        encode(Welcome("r", 0, "c", meta))  # type: ignore[arg-type]


def test_meta_depth_is_bounded() -> None:
    deep: object = 1
    for _ in range(40):
        deep = [deep]
    with pytest.raises(Malformed, match="deeper"):
        encode(Welcome("r", 0, "c", {"d": deep}))


def test_tuples_in_meta_travel_as_lists() -> None:
    back = decode(encode(Welcome("r", 0, "c", {"pair": (1, 2)})))
    assert back.meta == {"pair": [1, 2]}
