"""Every message kind round-trips with its typed fields; versions, kinds, header/prefix disagreements, damaged
headers and fields of the wrong type are rejected; the Welcome's settings are checked; an Update's body encoded
once gives the same packet; an older agent gets a refusal it can read."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import msgpack
import numpy as np
import pytest

from fedge.codec import (
    PROTOCOL_VERSION,
    Bye,
    Cancel,
    ChecksumError,
    Commit,
    ErrorMessage,
    Grant,
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
    encode_body,
    read_header,
    version2_error,
    version3_error,
    vocabulary,
)
from fedge.codec.frames import decompress
from tests.packets import head, parts, rebuild

MODEL = {"name": "cnn", "input_shape": [1, 28, 28], "num_classes": 10, "pan": "none", "pan_a": 1.0, "pan_t": 1.0,
         "options": {}}
TRAIN = {"epochs": 1, "batch_size": 64, "lr": 0.001, "optimizer": "adam", "momentum": 0.0, "weight_decay": 0.0,
         "loss": "cross_entropy", "class_weights": [1.0, 2.0]}


def welcome(**changes: Any) -> Welcome:
    fields: dict[str, Any] = dict(client_index=2, num_clients=10, seed=7, model_hash="sha256:ab12", model=MODEL,
                                  algorithm="dssa-fedavg", algorithm_options={"keep": 0.2}, train=TRAIN,
                                  heartbeat_s=5.0, liveness_s=30.0, train_limit=0,
                                  plugins={"model": {"name": "acme:net", "distribution": "acme", "version": "1.0"}},
                                  normalization={"mean": [0.5], "std": [0.25]})
    fields.update(changes)
    return Welcome("run-1", 0, "coordinator", **fields)


MESSAGES = [
    Hello("run-1", 0, "agent-07", "0.1.0", (PROTOCOL_VERSION,), "2.3.1", "sha256:ab12", ("sparse", "int8"), 6000,
          "cuda", (1, 28, 28), 10, ("run-1", 4)),
    welcome(),
    Task("run-1", 4, "coordinator", {}, {"lr": 0.01}, committed_round=3, last_accepted_round=2, deadline_s=30.0,
         personal_eval=True, evaluate=False, paced=True, norm_bounds={"update": 2.5, "*": 1}),
    Update("run-1", 4, "agent-07", {}, {"ef_base": 3}, num_samples=600, steps=10, train_loss=0.42, train_s=1.5,
           evaluation={"accuracy": 0.9, "loss": None}, eval_samples=100, personal_accuracy=0.91,
           record={"cpu_s": 1.25, "energy_source": "rapl"}),
    Commit("run-1", 4, "coordinator"),
    Heartbeat("run-1", 4, "agent-07", steps=12, ready=True),
    ErrorMessage("run-1", 4, "coordinator", vocabulary.INVALID_UPDATE, "the update's mask CRC is not this round's"),
    Bye("run-1", 50, "coordinator", vocabulary.BYE_FINISHED, "session finished"),
    Cancel("run-1", 4, "coordinator", "the round closed without your update"),
    Grant("run-1", 4, "coordinator"),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_kind_round_trips(message: Any) -> None:
    packet = encode(message)
    back = decode(packet)
    assert type(back) is type(message) and back == message
    assert back.version == PROTOCOL_VERSION and packet[4] == PROTOCOL_VERSION and packet[5] == back.kind_code


def test_kind_codes_are_distinct_and_stable() -> None:
    codes = {type(m).kind: type(m).kind_code for m in MESSAGES}
    assert codes == {"hello": 1, "welcome": 2, "task": 3, "update": 4, "commit": 5, "heartbeat": 6, "error": 7,
                     "bye": 8, "cancel": 9, "grant": 10}


def test_only_tasks_and_updates_have_a_body() -> None:
    for message in MESSAGES:
        packet = encode(message)
        rest = len(packet) - read_header(packet).body_at
        assert (rest > 0) == isinstance(message, (Task, Update))
    with pytest.raises(Malformed, match="no body"):
        decode(encode(Commit("r", 1, "c")) + b"\x00")


def test_the_runtime_fields_travel_in_the_header_and_meta_in_the_body() -> None:
    update = MESSAGES[3]
    tree = parts(encode(update))
    assert tree["header"]["n"] == 600 and tree["header"]["rec"] == {"cpu_s": 1.25, "energy_source": "rapl"}
    assert set(tree["body"]) == {"g", "m"} and msgpack.unpackb(tree["body"]["m"]) == {"ef_base": 3}


def test_a_body_encoded_once_gives_the_same_packet() -> None:
    group = {"model": TensorGroup({"w": np.arange(12, dtype=np.float32).reshape(3, 4)})}
    body = encode_body(group, {"phase": "x"})
    first = Update("r", 1, "a", group, {"phase": "x"}, num_samples=3)
    later = Update("r", 1, "a", group, {"phase": "x"}, num_samples=3, record={"bytes_body_up": len(body)})
    assert encode(first, body=body) == encode(first)
    back = decode(encode(later, body=body))
    assert isinstance(back, Update) and back.record == {"bytes_body_up": len(body)} and back.meta == {"phase": "x"}
    assert np.array_equal(back.groups["model"].dense["w"], group["model"].dense["w"])
    with pytest.raises(Malformed, match="no body"):
        encode(Commit("r", 1, "c"), body=body)


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


def test_a_damaged_header_fails_its_crc() -> None:
    packet = bytearray(encode(Heartbeat("r", 1, "a", steps=3)))
    packet[20] ^= 0x04
    with pytest.raises(ChecksumError, match="CRC"):
        decode(bytes(packet))
    with pytest.raises(Malformed, match="ends inside"):
        decode(bytes(packet[:-6]))


def test_header_must_agree_with_the_prefix() -> None:
    packet = encode(Commit("r", 1, "c"))
    # A flipped kind byte (CRC made valid again) must not turn a Commit into a Grant (their headers look alike).
    tree = parts(packet)
    as_grant = head(10, msgpack.packb(tree["header"]))
    with pytest.raises(Malformed, match="disagrees"):
        decode(as_grant)
    tree["header"]["extra"] = 1
    with pytest.raises(Malformed, match="unexpected"):
        decode(rebuild(packet, tree))


@pytest.mark.parametrize("key, value", [("n", -1), ("n", 1.5), ("tl", "low"), ("rec", [1]), ("rec", {"a": [1]}),
                                        ("pa", "x"), ("ev", 3), ("cs", 1.5), ("cs", -0.1), ("cs", "all")])
def test_typed_update_fields_are_checked_on_decode(key: str, value: Any) -> None:
    packet = encode(MESSAGES[3])
    tree = parts(packet)
    tree["header"][key] = value
    with pytest.raises(Malformed):
        decode(rebuild(packet, tree))


def test_a_frame_without_content_checksum_is_rejected() -> None:
    from fedge.codec.frames import compress

    packet = encode(Task("r", 1, "c"))
    at = read_header(packet).body_at
    body = decompress(packet[at:], max_size=1 << 20, where="t", need_checksum=True)
    with pytest.raises(Malformed, match="checksum"):
        decode(packet[:at] + compress(body, checksum=False))
    with pytest.raises(Malformed, match="needs its body"):
        decode(packet[:at])


@pytest.mark.parametrize("build", [
    lambda: Heartbeat("r", -1, "a"),
    lambda: Heartbeat("r", True, "a"),  # type: ignore[arg-type]
    lambda: Heartbeat(7, 1, "a"),  # type: ignore[arg-type]
    lambda: Hello("r", 0, "a", "v", (3,), "t", "h", "not-a-tuple-of-str", 5),
    lambda: Hello("r", 0, "a", "v", 3, "t", "h", (), 5),  # type: ignore[arg-type]
    lambda: Hello("r", 0, "a", "v", (3,), "t", "h", (), 5, holds=("r",)),  # type: ignore[arg-type]
    lambda: Task("r", 0, "c", {"model": {"w": np.zeros(3)}}),  # type: ignore[dict-item]
    lambda: Task("r", 0, "c", {"": TensorGroup()}),
    lambda: Task("r", 0, "c", paced=1),  # type: ignore[arg-type]
    lambda: ErrorMessage("r", 0, "c", "Not A Code", "why"),
    lambda: Bye("r", 0, "c", "", "why"),
    lambda: TensorGroup(value_dtype="f64"),
])
def test_invalid_messages_are_refused_at_construction(build: Any) -> None:
    with pytest.raises(Malformed):
        build()


@pytest.mark.parametrize("changes, match", [
    ({"model": {**MODEL, "num_classes": "ten"}}, "num_classes"),
    ({"model": {k: v for k, v in MODEL.items() if k != "pan"}}, "missing"),
    ({"train": {**TRAIN, "optimizer": 3}}, "optimizer"),
    ({"train": {**TRAIN, "extra": 1}}, "unexpected"),
    ({"algorithm": ""}, "algorithm"),
    ({"client_index": 10}, "client_index"),
    ({"normalization": {"mean": [0.5], "std": []}}, "normalization"),
    ({"heartbeat_s": "5"}, "heartbeat_s"),
    ({"algorithm_options": {"keep": b"x"}}, "not a msgpack-native"),
])
def test_the_welcome_settings_are_typed_and_checked(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(Malformed, match=match):
        welcome(**changes)
    packet = encode(welcome())  # the same rule on decode: a welcome built elsewhere is checked here too
    tree = parts(packet)
    key = {"model": "mod", "train": "tr", "algorithm": "alg", "client_index": "ci", "normalization": "nrm",
           "heartbeat_s": "hb", "algorithm_options": "ao"}[next(iter(changes))]
    tree["header"][key] = next(iter(changes.values()))
    if key != "ao":  # bytes cannot be in a header at all (msgpack bin is refused before the field is read)
        with pytest.raises(Malformed, match=match):
            decode(rebuild(packet, tree))


@pytest.mark.parametrize("meta", [{1: "int key"}, {"a": b"bytes"}, {"a": object()}, {"a": {"b": 1 << 70}}])
def test_meta_must_be_msgpack_native(meta: dict[Any, Any]) -> None:
    with pytest.raises(Malformed):
        encode(Task("r", 0, "c", {}, meta))


def test_meta_depth_is_bounded() -> None:
    deep: Any = 1
    for _ in range(40):
        deep = [deep]
    with pytest.raises(Malformed, match="deeper"):
        Task("r", 0, "c", {}, {"d": deep})


def test_tuples_in_meta_travel_as_lists() -> None:
    back = decode(encode(Task("r", 0, "c", {}, {"pair": (1, 2)})))
    assert back.meta == {"pair": [1, 2]}


def test_an_older_agent_gets_a_version_2_refusal() -> None:
    packet = version2_error("run-1", "coordinator", vocabulary.PROTOCOL_MISMATCH, "upgrade the agent")
    assert packet[:8] == b"FEDG\x02\x07\x00\x00"
    body = msgpack.unpackb(decompress(packet[8:], max_size=1 << 16, where="t", need_checksum=True))
    assert body == {"v": 2, "k": 7, "run": "run-1", "r": 0, "s": "coordinator", "code": "protocol-mismatch",
                    "why": "upgrade the agent"}
    with pytest.raises(UnsupportedVersion):  # and this side reads no version-2 packet
        decode(packet)


def test_a_version_3_agent_gets_a_refusal_in_version_3() -> None:
    packet = version3_error("run-1", "coordinator", vocabulary.PROTOCOL_MISMATCH, "upgrade the agent")
    header = msgpack.unpackb(packet[12:-4])
    assert packet[:6] == b"FEDG\x03\x07" and header["v"] == 3 and header["code"] == "protocol-mismatch"
    assert zlib.crc32(packet[:-4]) == struct.unpack("<I", packet[-4:])[0]
    with pytest.raises(UnsupportedVersion):
        decode(packet)


@pytest.mark.parametrize("bounds", [{"update": -1.0}, {"update": 0.0}, {"update": float("nan")},
                                    {"update": float("inf")}, {"update": "big"}, {"update": True},
                                    {f"g{i}": 1.0 for i in range(65)}])
def test_a_task_norm_bound_that_is_not_a_finite_positive_number_is_malformed(bounds: dict[str, Any]) -> None:
    packet = encode(MESSAGES[2])
    tree = parts(packet)
    tree["header"]["nb"] = bounds
    with pytest.raises(Malformed, match="norm_bounds"):
        decode(rebuild(packet, tree))
    with pytest.raises(Malformed):
        Task("r", 1, "c", norm_bounds=bounds)


def test_codes_in_the_vocabulary_are_well_formed() -> None:
    for code in vocabulary.ERROR_CODES | vocabulary.BYE_CODES:
        assert vocabulary.CODE_PATTERN.fullmatch(code)
    assert vocabulary.JOIN_REFUSALS <= vocabulary.ERROR_CODES and vocabulary.SESSION_REFUSALS <= vocabulary.ERROR_CODES


def test_a_long_header_travels_compressed_and_is_bounded_before_it_is_inflated() -> None:
    from fedge.codec import Limits, TooLarge
    from fedge.codec.frames import compress

    record = {f"bytes_{name}_{i}": i * 1.5 for i, name in enumerate(["up", "down", "zmtp", "payload"] * 20)}
    update = Update("run-1", 4, "agent-07", num_samples=600, record=record)
    packet = encode(update)
    assert packet[6] == 0x01 and decode(packet) == update
    size = int.from_bytes(packet[8:12], "little")
    assert size < len(msgpack.packb(parts_header(update)))  # smaller than the plain map it holds
    assert encode(Heartbeat("r", 1, "a"))[6] == 0x00  # short headers stay readable
    with pytest.raises(TooLarge, match="max_header_bytes"):
        decode(packet, Limits(max_header_bytes=size + 10))  # the declared content size is checked first
    bomb = head(6, compress(b"\x00" * (2 << 20)))
    bomb = bomb[:6] + b"\x01" + bomb[7:]
    with pytest.raises(ChecksumError):  # the CRC no longer matches the changed flag ...
        decode(bomb)
    flagged = head_with_flags(6, compress(b"\x00" * (2 << 20)), 0x01)  # ... and with a valid CRC it is too large
    with pytest.raises(TooLarge, match="max_header_bytes"):
        decode(flagged)
    with pytest.raises(Malformed, match="flags"):
        decode(head_with_flags(6, b"\x80", 0x02))


def parts_header(update: Update) -> dict[str, Any]:
    return parts(encode(update))["header"]


def head_with_flags(kind: int, header: bytes, flags: int) -> bytes:
    import struct
    import zlib

    start = b"FEDG" + bytes((PROTOCOL_VERSION, kind, flags, 0)) + struct.pack("<I", len(header)) + header
    return start + struct.pack("<I", zlib.crc32(start))
