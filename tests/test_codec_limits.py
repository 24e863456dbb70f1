"""Limits and rejection policies: sizes, counts, non-finite values, shape and mask mismatches, lossy range."""

from __future__ import annotations

import numpy as np
import pytest

from fedge.codec import (
    ChecksumError,
    CodecError,
    Limits,
    MaskMismatch,
    NonFinite,
    OutOfRange,
    ShapeMismatch,
    SparseSection,
    Task,
    TensorGroup,
    TooLarge,
    Update,
    decode,
    encode,
)


def model_task(n_tensors: int = 3, size: int = 100) -> bytes:
    dense = {f"t{i}": np.arange(size, dtype=np.float32) for i in range(n_tensors)}
    return encode(Task("r", 1, "c", {"model": TensorGroup(dense)}))


def test_packet_size_limit_is_checked_first() -> None:
    packet = model_task()
    with pytest.raises(TooLarge, match="max_packet_bytes"):
        decode(packet, Limits(max_packet_bytes=len(packet) - 1))
    decode(packet, Limits(max_packet_bytes=len(packet)))


def test_decompressed_size_limit() -> None:
    packet = model_task()
    with pytest.raises(TooLarge, match="max_decompressed_bytes"):
        decode(packet, Limits(max_decompressed_bytes=100))


def test_tensor_and_element_limits_cover_all_groups() -> None:
    mask = np.zeros(50, dtype=bool)
    section = SparseSection.with_mask(["s"], [(5, 10)], mask, np.zeros(0, np.float32))
    packet = encode(Task("r", 1, "c", {"a": TensorGroup({"x": np.zeros(10, np.float32)}),
                                       "b": TensorGroup({"y": np.zeros(10, np.float32)}, section)}))
    decode(packet, Limits(max_tensors=3, max_elements=70))
    with pytest.raises(TooLarge, match="max_tensors"):
        decode(packet, Limits(max_tensors=2))
    with pytest.raises(TooLarge, match="max_elements"):
        decode(packet, Limits(max_elements=69))


def test_meta_and_header_size_limits() -> None:
    packet = encode(Task("r", 0, "c", {}, {"blob": "x" * 5000}))
    with pytest.raises(TooLarge, match="max_meta_bytes"):
        decode(packet, Limits(max_meta_bytes=4000))
    packet = encode(Update("r", 0, "a", record={"blob": "x" * 5000}))
    with pytest.raises(TooLarge, match="max_header_bytes"):
        decode(packet, Limits(max_header_bytes=4000))
    with pytest.raises(TooLarge, match="max_header_bytes"):  # an encoder refuses what no default decoder reads
        encode(Update("r", 0, "a", record={f"k{i}": "x" * 60000 for i in range(20)}))


def test_non_finite_values_are_rejected_by_default() -> None:
    for values in (np.array([1.0, np.nan], np.float32), np.array([np.inf], np.float32)):
        packet = encode(Task("r", 0, "c", {"m": TensorGroup({"x": values})}))
        with pytest.raises(NonFinite, match="NaN or infinite"):
            decode(packet)
        assert np.array_equal(decode(packet, Limits(allow_nonfinite=True)).groups["m"].dense["x"], values,
                              equal_nan=True)
    mask = np.array([True, False, True])
    packet = encode(Update("r", 0, "a", {"m": TensorGroup({}, SparseSection.with_mask(
        ["w"], [(3,)], mask, np.array([1.0, np.nan], np.float32)))}))
    with pytest.raises(NonFinite):
        decode(packet)


@pytest.mark.parametrize("encoding", ["f16", "bf16", "int8"])
def test_lossy_encodings_refuse_non_finite_input(encoding: str) -> None:
    with pytest.raises(NonFinite):
        encode(Task("r", 0, "c", {"m": TensorGroup({"x": np.array([np.nan], np.float32)}, None, encoding)}))


def test_values_beyond_a_lossy_range_are_refused() -> None:
    with pytest.raises(OutOfRange):
        encode(Task("r", 0, "c", {"m": TensorGroup({"x": np.array([70000.0], np.float32)}, None, "f16")}))
    with pytest.raises(OutOfRange):
        encode(Task("r", 0, "c", {"m": TensorGroup({"x": np.array([3.4028235e38], np.float32)}, None, "bf16")}))
    encode(Task("r", 0, "c", {"m": TensorGroup({"x": np.array([65504.0], np.float32)}, None, "f16")}))


def test_section_constructors_check_shapes() -> None:
    with pytest.raises(ShapeMismatch):
        SparseSection.with_mask(["w"], [(2, 3)], np.ones(5, bool), np.ones(5, np.float32))
    with pytest.raises(ShapeMismatch):
        SparseSection.with_mask(["w"], [(2, 3)], np.ones(6, bool), np.ones(5, np.float32))
    with pytest.raises(ShapeMismatch):
        SparseSection.with_indices(["w"], [(4,)], np.array([2, 1]), np.ones(2, np.float32))
    with pytest.raises(ShapeMismatch):
        SparseSection.with_indices(["w"], [(4,)], np.array([1, 4]), np.ones(2, np.float32))
    with pytest.raises(ShapeMismatch):
        SparseSection.masked_values(["w"], [(4,)], np.ones(4, np.uint8), np.ones(4, np.float32))
    with pytest.raises(ShapeMismatch):
        SparseSection.with_mask(["a", "b"], [(2,)], np.ones(2, bool), np.ones(2, np.float32))


def uplink_for(mask: np.ndarray) -> SparseSection:
    values = np.arange(int((~mask).sum()), dtype=np.float32)
    packet = encode(Update("r", 3, "a", {"m": TensorGroup({}, SparseSection.masked_values(["w"], [mask.shape], mask,
                                                                                          values))}))
    section = decode(packet).groups["m"].sparse
    assert section is not None and section.mask is None and section.indices is None
    return section


def test_values_only_sections_need_their_own_mask() -> None:
    mask = np.zeros(20, dtype=bool)
    mask[[2, 3, 11]] = True
    section = uplink_for(mask)
    dense = section.to_dense(mask)["w"]
    assert np.array_equal(dense[~mask], np.arange(17)) and not dense[mask].any()
    with pytest.raises(MaskMismatch, match="reference_mask"):
        section.to_dense()
    other = mask.copy()
    other[[3, 4]] = [False, True]  # same count, other positions
    with pytest.raises(MaskMismatch, match="CRC"):
        section.to_dense(other)
    with pytest.raises(ShapeMismatch):
        section.to_dense(np.zeros(21, dtype=bool))


def test_corrupt_index_field_fails_its_crc() -> None:
    from tests.packets import parts, rebuild

    mask = np.zeros(64, dtype=bool)
    mask[[1, 9, 40]] = True
    packet = encode(Task("r", 0, "c", {"m": TensorGroup({}, SparseSection.with_mask(["w"], [(64,)], mask,
                                                                                      np.ones(3, np.float32)))}))
    tree = parts(packet)
    tree["body"]["g"]["m"]["sp"]["crc"] ^= 1
    with pytest.raises(ChecksumError):
        decode(rebuild(packet, tree))


def test_every_error_is_a_codec_error_with_a_reason() -> None:
    for cls in (TooLarge, NonFinite, OutOfRange, ShapeMismatch, MaskMismatch, ChecksumError):
        assert issubclass(cls, CodecError)
    with pytest.raises(CodecError) as info:
        decode(b"not a packet")
    assert "FEDG" in str(info.value)
    with pytest.raises(CodecError):
        decode("text, not bytes")  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        encode(Task("r", 0, "a", {}, {"x": {1, 2}}))  # type: ignore[dict-item]
