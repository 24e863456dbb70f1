"""Round trips: decode(encode(m)) gives back m, bit-exact for f32 and within the spec's bounds for lossy encodings."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedge.codec import Limits, SparseSection, Task, TensorGroup, Update, decode, encode

SETTINGS = settings(max_examples=60, deadline=None)
shapes_st = st.lists(st.lists(st.integers(0, 6), min_size=0, max_size=3).map(tuple), min_size=1, max_size=4)
INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_]


def floats(rng: np.random.Generator, n: int, encoding: str) -> np.ndarray:
    """Values spanning many binades, with zeros, -0.0 and (for f32/bf16/int8) subnormals."""
    top = {"f16": 14, "bf16": 100, "int8": 100, "f32": 120}[encoding]
    vals = rng.standard_normal(n) * np.exp2(rng.integers(-30, top, n).astype(np.float64))
    vals = vals.astype(np.float32)
    if n:
        vals[rng.random(n) < 0.1] = 0.0
        vals[rng.random(n) < 0.05] = -0.0
        if encoding != "f16":
            vals[rng.random(n) < 0.05] = np.float32(1e-40)
    return vals


def assert_close(encoding: str, sent: np.ndarray, got: np.ndarray, peak: float) -> None:
    """The error bounds of docs/wire-format.md section 6 (peak = max |x| of the int8 segment)."""
    assert got.dtype == np.float32 and got.shape == sent.shape
    x, y = sent.astype(np.float64), got.astype(np.float64)
    if encoding == "f32":
        assert np.array_equal(sent.view(np.uint32), got.view(np.uint32))
    elif encoding == "f16":
        assert (np.abs(y - x) <= np.maximum(2.0**-11 * np.abs(x), 2.0**-25)).all()
    elif encoding == "bf16":
        assert (np.abs(y - x) <= np.maximum(2.0**-8 * np.abs(x), 2.0**-134)).all()
    else:
        scale = peak / 127 * (1 + 2.0**-23)
        assert (np.abs(y - x) <= scale * (0.5 + 2.0**-17) + 2.0**-142).all()


@SETTINGS
@given(shapes=shapes_st, encoding=st.sampled_from(["f32", "f16", "bf16", "int8"]), seed=st.integers(0, 2**32 - 1),
       int_dtype=st.sampled_from(INT_DTYPES))
def test_dense_tensors_round_trip(shapes: list[tuple[int, ...]], encoding: str, seed: int, int_dtype: type) -> None:
    rng = np.random.default_rng(seed)
    dense = {f"t{i}": floats(rng, int(np.prod(s)), encoding).reshape(s) for i, s in enumerate(shapes)}
    info = np.iinfo(int_dtype) if int_dtype is not np.bool_ else None
    ints = (rng.integers(info.min, info.max, size=(3, 2), dtype=int_dtype, endpoint=True) if info is not None
            else rng.random((3, 2)) < 0.5)
    dense["counter"] = ints
    msg = Task("run", 1, "coordinator", {"model": TensorGroup(dense, None, encoding)}, {"lr": 0.01})
    back = decode(encode(msg))
    assert isinstance(back, Task) and back.meta == {"lr": 0.01}
    group = back.groups["model"]
    assert list(group.dense) == list(dense) and group.value_dtype == encoding
    assert group.dense["counter"].dtype == ints.dtype and np.array_equal(group.dense["counter"], ints)
    for name, arr in dense.items():
        if name != "counter":
            assert_close(encoding, arr, group.dense[name], float(np.abs(arr).max(initial=0.0)))


def make_section(kind: str, shapes: list[tuple[int, ...]], mask: np.ndarray, values: np.ndarray,
                 select: bool) -> SparseSection:
    names = [f"w{i}" for i in range(len(shapes))]
    if kind == "mask":
        return SparseSection.with_mask(names, shapes, mask, values)
    if kind == "indices":
        return SparseSection.with_indices(names, shapes, np.flatnonzero(mask), values)
    return SparseSection.masked_values(names, shapes, mask if select else ~mask, values, select=select)


@SETTINGS
@given(shapes=shapes_st, kind=st.sampled_from(["mask", "masked-values", "indices"]),
       density=st.sampled_from([0.0, 0.01, 0.1, 0.3, 0.5, 0.8, 0.97, 1.0]), clustered=st.booleans(),
       encoding=st.sampled_from(["f32", "f16", "bf16", "int8"]), select=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_sparse_sections_round_trip(shapes: list[tuple[int, ...]], kind: str, density: float, clustered: bool,
                                    encoding: str, select: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = sum(int(np.prod(s)) for s in shapes)
    mask = rng.random(n) < density
    if clustered:
        mask = np.repeat(rng.random(n // 5 + 1) < density, 5)[:n]
    values = floats(rng, int(mask.sum()), encoding)
    section = make_section(kind, shapes, mask, values, select)
    back = decode(encode(Update("run", 9, "agent-3", {"g": TensorGroup({}, section, encoding)}))).groups["g"].sparse
    assert back is not None and back.kind == kind and back.names == section.names and back.shapes == section.shapes
    reference = (mask if select else ~mask) if kind == "masked-values" else None
    assert np.array_equal(back.positions(reference), np.flatnonzero(mask))
    if kind == "mask":
        assert back.mask is not None and np.array_equal(back.mask, mask)
    if kind == "indices":
        assert back.indices is not None and np.array_equal(back.indices, np.flatnonzero(mask))
    start = 0
    for count in back.counts:
        seg = slice(start, start + count)
        assert_close(encoding, values[seg], back.values[seg], float(np.abs(values[seg]).max(initial=0.0)))
        start += count
    dense = back.to_dense(reference)
    expect = section.to_dense(reference)
    flat_mask = np.split(mask, np.cumsum([int(np.prod(s)) for s in shapes])[:-1])
    for name, carried in zip(section.names, flat_mask, strict=True):
        assert dense[name].dtype == np.float32 and dense[name].shape == expect[name].shape
        assert not dense[name].reshape(-1)[~carried].any()
        if encoding == "f32":
            assert np.array_equal(dense[name].view(np.uint32), expect[name].view(np.uint32))


@pytest.mark.parametrize("bits", [0x7FC00001, 0xFFC12345, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001])
def test_f32_keeps_every_bit_pattern_when_allowed(bits: int) -> None:
    values = np.array([bits, 0x3F800000], dtype=np.uint32).view(np.float32)
    msg = Task("r", 0, "c", {"m": TensorGroup({"x": values})})
    back = decode(encode(msg), Limits(allow_nonfinite=True)).groups["m"].dense["x"]
    assert np.array_equal(back.view(np.uint32), values.view(np.uint32))


def test_float64_and_float16_inputs_decode_as_float32() -> None:
    dense = {"a": np.array([[1.5, -2.25]], dtype=np.float64), "b": np.array([0.5], dtype=np.float16)}
    back = decode(encode(Task("r", 0, "c", {"m": TensorGroup(dense)}))).groups["m"].dense
    assert back["a"].dtype == np.float32 and np.array_equal(back["a"], [[1.5, -2.25]])
    assert back["b"].dtype == np.float32 and np.array_equal(back["b"], [0.5])


def test_several_groups_travel_independently() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    mask = np.abs(w).reshape(-1) > 0.5
    model = TensorGroup({"bias": np.ones(8, np.float32)}, SparseSection.from_dense(["w"], [w], mask))
    control = TensorGroup({"c_bias": np.zeros(8, np.float32)}, SparseSection.from_dense(["c_w"], [w * 2], mask), "bf16")
    back = decode(encode(Task("r", 2, "c", {"model": model, "control": control})))
    assert set(back.groups) == {"model", "control"}
    assert np.array_equal(back.groups["model"].sparse.to_dense()["w"], np.where(mask.reshape(8, 8), w, 0))
    assert back.groups["control"].value_dtype == "bf16"


@pytest.mark.parametrize("encoding", ["f32", "f16", "bf16", "int8"])
def test_received_is_what_a_packet_decodes_to_bit_for_bit(encoding: str) -> None:
    from fedge.codec import received

    rng = np.random.default_rng(11)
    shapes = [(3, 4), (7,), (2, 2, 2)]
    names = ["a", "b", "c"]
    mask = rng.random(sum(int(np.prod(s)) for s in shapes)) < 0.4
    values = (rng.standard_normal(int(mask.sum())) * 3).astype(np.float32)
    dense = {"w": rng.standard_normal((5, 3)).astype(np.float32), "steps": np.array([4, 2], np.int64),
             "v": (rng.standard_normal(6) * 100).astype(np.float64)}
    for section in (SparseSection.with_mask(names, shapes, mask, values),
                    SparseSection.with_indices(names, shapes, np.flatnonzero(mask), values),
                    SparseSection.masked_values(names, shapes, ~mask, values, select=False)):
        group = TensorGroup(dense, section, encoding)
        packet = decode(encode(Update("r", 1, "a", {"g": group}))).groups["g"]  # type: ignore[union-attr]
        mine = received(group)
        for name in dense:
            ours = np.asarray(mine.dense[name])
            assert ours.dtype == packet.dense[name].dtype and ours.tobytes() == packet.dense[name].tobytes(), name
        assert mine.sparse is not None and packet.sparse is not None
        assert mine.sparse.values.tobytes() == packet.sparse.values.tobytes()
