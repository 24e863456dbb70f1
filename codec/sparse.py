"""`SparseSection`: the sparse part of a tensor group, in one of three kinds.

The tensors `names` with `shapes`, flattened row-major and concatenated, define flat positions
0..N-1. A section carries float32 values at some of those positions:

* "mask": the bool mask itself and the values where it is True (DSSA downlink);
* "masked-values": only the values where a reference mask equals `select`, plus the mask's CRC;
  the receiver supplies the mask (DSSA uplink, no indices on the wire);
* "indices": strictly increasing positions and the values there (top-fraction uploads).

Values are always in position order. Arrays passed in are not copied. Must not touch torch, zmq
or any other Fedge package.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from fedge.codec.errors import MaskMismatch, ShapeMismatch
from fedge.codec.masks import flat_positions, mask_crc
from fedge.codec.schema import check_name, check_shape, numel

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

SPARSE_KINDS: tuple[str, ...] = ("mask", "masked-values", "indices")
CHUNK = 1 << 16  # positions are found chunk by chunk, so no N-sized index array is ever built
CACHE_DENSITY = 0.35  # below this density a tensor's positions are kept: the Rice coder needs them


def _layout(names: Sequence[str], shapes: Sequence[Sequence[int]]) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
    names_t = tuple(check_name(n, "SparseSection.names") for n in names)
    if len(names_t) != len(shapes) or len(set(names_t)) != len(names_t):
        raise ShapeMismatch("SparseSection needs one shape per name and unique names")
    shapes_t = tuple(check_shape(s, f"SparseSection shape of {n!r}") for n, s in zip(names_t, shapes, strict=True))
    return names_t, shapes_t


def offsets_of(shapes: Sequence[tuple[int, ...]]) -> list[int]:
    """Start offset of every tensor in the flat concatenation, plus the total N at the end."""
    out = [0]
    for shape in shapes:
        out.append(out[-1] + numel(shape))
    return out


def _flat_bool(mask: npt.ArrayLike, n: int, what: str) -> BoolArray:
    arr = np.asarray(mask)
    if arr.dtype != np.bool_:
        raise ShapeMismatch(f"{what} must be a bool array, got dtype {arr.dtype}")
    if arr.size != n:
        raise ShapeMismatch(f"{what} has {arr.size} elements, but the tensors hold {n}")
    return arr.reshape(-1)


def _values(values: npt.ArrayLike, count: int) -> F32:
    arr = np.asarray(values)
    if arr.dtype.kind != "f":
        raise ShapeMismatch(f"sparse values must be floats, got dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
    if arr.size != count:
        raise ShapeMismatch(f"{arr.size} values given for {count} selected positions")
    return arr


def _counts(mask: BoolArray, offsets: list[int], select: bool) -> tuple[int, ...]:
    counts = []
    for start, stop in zip(offsets[:-1], offsets[1:], strict=True):
        ones = int(np.count_nonzero(mask[start:stop]))
        counts.append(ones if select else stop - start - ones)
    return tuple(counts)


def _gather(source: F32, carried: BoolArray, out: F32) -> None:
    """out[:] = source at the True positions of `carried`, in chunks that stay in cache."""
    start = 0
    for lo in range(0, carried.size, CHUNK):
        pos = flat_positions(carried[lo:lo + CHUNK])
        # mode="clip" (positions are in range anyway): with the default mode numpy buffers `out`.
        np.take(source[lo:lo + CHUNK], pos, out=out[start:start + pos.size], mode="clip")
        start += pos.size


def _scatter(values: F32, carried: BoolArray, out: F32) -> None:
    """out at the True positions of `carried` = values, in chunks that stay in cache."""
    start = 0
    for lo in range(0, carried.size, CHUNK):
        pos = flat_positions(carried[lo:lo + CHUNK])
        out[lo:lo + CHUNK][pos] = values[start:start + pos.size]
        start += pos.size


@dataclass(frozen=True, eq=False)
class SparseSection:
    """Build with `with_mask`, `masked_values`, `with_indices` (or the `*_from_dense` helpers)."""

    kind: str
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    values: F32
    counts: tuple[int, ...]
    mask_crc: int
    select: bool = True
    mask: BoolArray | None = None
    indices: I64 | None = None
    local_cache: dict[int, I64] = field(default_factory=dict, repr=False)  # tensor -> local positions

    @property
    def size(self) -> int:
        """N, the number of flat positions the section spans."""
        return sum(numel(s) for s in self.shapes)

    @classmethod
    def with_mask(cls, names: Sequence[str], shapes: Sequence[Sequence[int]], mask: npt.ArrayLike,
                  values: npt.ArrayLike) -> SparseSection:
        """Carry `mask` (length N) and the values where it is True, in position order."""
        names_t, shapes_t = _layout(names, shapes)
        offsets = offsets_of(shapes_t)
        flat = _flat_bool(mask, offsets[-1], "mask")
        counts = _counts(flat, offsets, True)
        return cls("mask", names_t, shapes_t, _values(values, sum(counts)), counts, mask_crc(flat), True, flat)

    @classmethod
    def masked_values(cls, names: Sequence[str], shapes: Sequence[Sequence[int]],
                      reference_mask: npt.ArrayLike, values: npt.ArrayLike, select: bool = False) -> SparseSection:
        """Carry only the values where `reference_mask == select`, bound to the mask by its CRC."""
        names_t, shapes_t = _layout(names, shapes)
        offsets = offsets_of(shapes_t)
        flat = _flat_bool(reference_mask, offsets[-1], "reference_mask")
        counts = _counts(flat, offsets, bool(select))
        return cls("masked-values", names_t, shapes_t, _values(values, sum(counts)), counts, mask_crc(flat),
                   bool(select))

    @classmethod
    def with_indices(cls, names: Sequence[str], shapes: Sequence[Sequence[int]], indices: npt.ArrayLike,
                     values: npt.ArrayLike) -> SparseSection:
        """Carry strictly increasing flat `indices` and the values there."""
        names_t, shapes_t = _layout(names, shapes)
        offsets = offsets_of(shapes_t)
        idx = np.asarray(indices)
        if idx.size == 0:
            idx = idx.astype(np.int64)
        if idx.dtype.kind not in "iu" or idx.ndim != 1:
            raise ShapeMismatch(f"indices must be a 1-D integer array, got {idx.dtype} with shape {idx.shape}")
        idx = idx.astype(np.int64)
        if idx.size and (int(idx[0]) < 0 or int(idx[-1]) >= offsets[-1] or not (np.diff(idx) > 0).all()):
            raise ShapeMismatch(f"indices must be strictly increasing and lie in [0, {offsets[-1]})")
        counts = tuple(int(c) for c in np.diff(np.searchsorted(idx, offsets)))
        implied = np.zeros(offsets[-1], dtype=np.bool_)
        implied[idx] = True
        return cls("indices", names_t, shapes_t, _values(values, idx.size), counts, mask_crc(implied), True,
                   None, idx)

    @classmethod
    def from_dense(cls, names: Sequence[str], arrays: Sequence[npt.ArrayLike], mask: npt.ArrayLike) -> SparseSection:
        """A "mask" section of `arrays` keeping the positions where `mask` is True."""
        parts = [np.asarray(a) for a in arrays]
        shapes = [p.shape for p in parts]
        offsets = offsets_of([tuple(s) for s in shapes])
        flat = _flat_bool(mask, offsets[-1], "mask")
        counts = _counts(flat, offsets, True)
        values = np.empty(sum(counts), dtype=np.float32)
        cache: dict[int, I64] = {}
        start = 0
        for t, (part, lo, hi, count) in enumerate(zip(parts, offsets[:-1], offsets[1:], counts, strict=True)):
            source = part.reshape(-1).astype(np.float32, copy=False)
            if count < CACHE_DENSITY * (hi - lo):
                cache[t] = flat_positions(flat[lo:hi])
                np.take(source, cache[t], out=values[start:start + count], mode="clip")
            else:
                _gather(source, flat[lo:hi], values[start:start + count])
            start += count
        names_t, shapes_t = _layout(names, shapes)
        return cls("mask", names_t, shapes_t, values, counts, mask_crc(flat), True, flat, None, cache)

    @classmethod
    def masked_from_dense(cls, names: Sequence[str], arrays: Sequence[npt.ArrayLike], reference_mask: npt.ArrayLike,
                          select: bool = False) -> SparseSection:
        """A "masked-values" section of `arrays` at the positions where `reference_mask == select`."""
        parts = [np.asarray(a) for a in arrays]
        offsets = offsets_of([tuple(p.shape) for p in parts])
        flat = _flat_bool(reference_mask, offsets[-1], "reference_mask")
        chosen = flat if select else ~flat
        values = np.concatenate([np.compress(chosen[lo:hi], p.reshape(-1)) for p, lo, hi
                                 in zip(parts, offsets[:-1], offsets[1:], strict=True)] or [np.zeros(0, np.float32)])
        return cls.masked_values(names, [p.shape for p in parts], flat, values, select)

    def local_positions(self, t: int, reference_mask: npt.ArrayLike | None = None) -> I64:
        """Positions carried in tensor `t`, relative to that tensor's first element."""
        offsets = offsets_of(self.shapes)
        if self.kind == "masked-values":
            return flat_positions(self._carried(reference_mask)[offsets[t]:offsets[t + 1]])
        found = self.local_cache.get(t)
        if found is None:
            if self.mask is not None:
                found = flat_positions(self.mask[offsets[t]:offsets[t + 1]])
            else:
                assert self.indices is not None
                cuts = np.cumsum((0,) + self.counts)
                found = self.indices[cuts[t]:cuts[t + 1]] - offsets[t]
            self.local_cache[t] = found
        return found

    def _carried(self, reference_mask: npt.ArrayLike | None) -> BoolArray:
        """The bool vector of carried positions: the mask, or the checked reference mask == select."""
        if self.kind != "masked-values":
            if self.mask is None:
                assert self.indices is not None
                implied = np.zeros(self.size, dtype=np.bool_)
                implied[self.indices] = True
                return implied
            return self.mask
        if reference_mask is None:
            raise MaskMismatch("this section carries values only; pass the mask it was encoded against "
                               "(reference_mask=...)")
        offsets = offsets_of(self.shapes)
        flat = _flat_bool(reference_mask, offsets[-1], "reference_mask")
        if mask_crc(flat) != self.mask_crc:
            raise MaskMismatch(f"the reference mask's CRC {mask_crc(flat):08x} differs from the "
                               f"{self.mask_crc:08x} the values were encoded against (wrong round's mask?)")
        if _counts(flat, offsets, self.select) != self.counts:
            raise MaskMismatch("the reference mask selects other per-tensor counts than the values carry")
        return flat if self.select else ~flat

    def positions(self, reference_mask: npt.ArrayLike | None = None) -> I64:
        """Flat int64 positions of the carried values (a "masked-values" section needs the mask)."""
        if self.indices is not None:
            return self.indices
        if self.kind == "masked-values":
            return flat_positions(self._carried(reference_mask))
        offsets = offsets_of(self.shapes)
        out = np.empty(self.values.size, dtype=np.int64)
        start = 0
        for t, lo in enumerate(offsets[:-1]):
            pos = self.local_positions(t)
            np.add(pos, lo, out=out[start:start + pos.size])
            start += pos.size
        return out

    def to_dense(self, reference_mask: npt.ArrayLike | None = None) -> dict[str, F32]:
        """float32 arrays of the given shapes, zero wherever the section carries no value."""
        carried = self._carried(reference_mask) if self.kind != "indices" else None
        offsets = offsets_of(self.shapes)
        out: dict[str, F32] = {}
        start = 0
        for t, (name, shape, count) in enumerate(zip(self.names, self.shapes, self.counts, strict=True)):
            arr = np.zeros(numel(shape), dtype=np.float32)
            values = self.values[start:start + count]
            cached = self.local_cache.get(t) if self.kind != "masked-values" else None
            if carried is None or cached is not None:
                arr[self.local_positions(t) if cached is None else cached] = values
            else:
                _scatter(values, carried[offsets[t]:offsets[t + 1]], arr)
            start += count
            out[name] = arr.reshape(shape)
        return out

    def describe(self) -> Mapping[str, Any]:
        """A small JSON-ready summary (used by `python -m fedge.codec inspect`)."""
        return {"kind": self.kind, "n": self.size, "carried": int(self.values.size), "select": self.select,
                "mask_crc": f"{self.mask_crc:08x}"}

