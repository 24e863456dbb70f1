"""The streamed body writer emits exactly the bytes msgpack.packb gives for the same structure."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedge.codec.frames import decompress
from fedge.codec.stream import BodyWriter
from fedge.codec.values import Shuffled, shuffle

leaves = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False),
                   st.text(max_size=40), st.binary(max_size=40), st.integers(0, 70_000).map(lambda n: b"\x07" * n))
bodies = st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=20),
                                                      st.dictionaries(st.text(max_size=8), inner, max_size=20)),
                      max_leaves=40)


def plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [plain(v) for v in obj]
    if isinstance(obj, Shuffled):
        return obj.tobytes()
    return obj


def written(obj: Any) -> bytes:
    writer = BodyWriter()
    writer.add(obj)
    packet = writer.compress(b"PREFIX!!", 1)
    assert packet[:8] == b"PREFIX!!"
    return decompress(packet[8:], max_size=1 << 26, where="test", need_checksum=True)


@settings(max_examples=100, deadline=None)
@given(body=bodies)
def test_body_bytes_equal_msgpack(body: Any) -> None:
    assert written(body) == msgpack.packb(body, use_bin_type=True)


def test_shuffled_blocks_and_long_containers() -> None:
    values = np.random.default_rng(0).standard_normal(30_000).astype(np.float32)
    block = Shuffled(values.view(np.uint8).reshape(-1, 4))
    body = {"val": block, "big": list(range(70_000)), "map": {str(i): i for i in range(17)}, "mv": memoryview(b"x" * 9000)}
    assert written(body) == msgpack.packb(plain(body), use_bin_type=True)
    assert block.tobytes() == shuffle(values.view(np.uint8).reshape(-1, 4)).tobytes()
