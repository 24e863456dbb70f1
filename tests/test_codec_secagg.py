"""Secure aggregation's wire messages (codes 11-16, docs/wire-format.md 3.4): each round-trips, keys and shares
travel in the body, and a receiver refuses a wrong key length, a device named twice in a roster, a list past
4,096 items and a share past 1 KiB before it builds anything."""

from __future__ import annotations

import os

import msgpack
import pytest

from fedge.codec import (
    Malformed,
    SecAggDelivery,
    SecAggKeys,
    SecAggReveal,
    SecAggRoster,
    SecAggShares,
    SecAggUnmask,
    Task,
    decode,
    encode,
    read_header,
)
from fedge.codec.frames import compress


def key() -> bytes:
    return os.urandom(32)


MESSAGES = [
    SecAggKeys("r1", 4, "a1", attempt=1, channel_key=key(), masking_key=key(), seed_digest=key()),
    SecAggRoster("r1", 4, "coordinator", attempt=1, keys=(("a1", key(), key()), ("a2", key(), key()))),
    SecAggShares("r1", 4, "a1", attempt=1, shares=(("a2", os.urandom(124)), ("a3", os.urandom(124)))),
    SecAggDelivery("r1", 4, "coordinator", attempt=1, shares=(("a2", os.urandom(124)),)),
    SecAggUnmask("r1", 4, "coordinator", attempt=1, survivors=("a1", "a2", "a3"), dropped=()),
    SecAggReveal("r1", 4, "a1", attempt=1, seeds=(("a2", os.urandom(48)),), secrets=(("a9", os.urandom(48)),)),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m.kind)
def test_each_secure_aggregation_message_round_trips_with_its_bytes_in_the_body(message: object) -> None:
    packet = encode(message)  # type: ignore[arg-type]
    assert decode(packet) == message
    header = read_header(packet)
    assert header.fields == {"attempt": 1} and header.body_at < len(packet)  # keys and shares: in the body


def test_a_task_carries_the_rounds_settings_or_nil() -> None:
    settings = {"bits": 16, "levels": 1000, "clip": (0.05, 0.01), "threshold": 0.6, "neighbours": 50,
                "seed": 17, "attempt": 0}
    assert decode(encode(Task("r1", 2, "c", secagg=settings))).secagg == settings  # type: ignore[union-attr]
    assert decode(encode(Task("r1", 2, "c"))).secagg is None  # type: ignore[union-attr]
    with pytest.raises(Malformed, match="missing"):
        Task("r1", 2, "c", secagg={"bits": 16})


def test_malformed_bodies_are_refused_with_their_reason() -> None:
    with pytest.raises(Malformed, match="32 bytes"):
        SecAggKeys("r1", 1, "a", channel_key=b"short", masking_key=key(), seed_digest=key())
    with pytest.raises(Malformed, match="names a device twice"):
        SecAggRoster("r1", 1, "c", keys=(("a", key(), key()), ("a", key(), key())))
    with pytest.raises(Malformed, match="at most 4096"):
        SecAggUnmask("r1", 1, "c", survivors=tuple(f"d{i}" for i in range(4097)))
    with pytest.raises(Malformed, match="1 to 1024 bytes"):
        SecAggShares("r1", 1, "a", shares=(("b", os.urandom(1025)),))
    # on the wire: a hand-made packet whose body names a device twice is refused at decode
    good = encode(SecAggRoster("r1", 1, "c", keys=(("a", key(), key()),)))
    at = read_header(good).body_at
    entry = ["a", key(), key()]
    forged = good[:at] + compress(msgpack.packb({"keys": [entry, entry]}, use_bin_type=True), level=1, checksum=True)
    with pytest.raises(Malformed, match="names a device twice"):
        decode(forged)
    with pytest.raises(Malformed, match="keys differ"):
        decode(good[:at] + compress(msgpack.packb({"keys": [], "x": 1}, use_bin_type=True), level=1, checksum=True))
    with pytest.raises(Malformed, match="needs its body"):
        decode(good[:at])
