"""`TensorGroup`: named dense tensors plus an optional sparse section, and its wire form.

A message can carry several groups (e.g. SCAFFOLD's "model" and "control"). Dense float tensors
travel as float32 encoded by the group's `value_dtype`; integer and bool tensors travel raw
(little-endian) and are always lossless. Decoded float tensors are float32 with their shapes.

This module must not import torch, zmq or any other Fedge package.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from fedge.codec.errors import Limits, Malformed
from fedge.codec.schema import Budget, check_name, check_shape, exact_map, get_bytes, get_list, get_str
from fedge.codec.sparse import SparseSection
from fedge.codec.sparsewire import decode_section, encode_section
from fedge.codec.values import VALUE_ENCODINGS, decode_values, encode_values, received_values

DENSE_DTYPES: dict[str, np.dtype[Any]] = {
    "f32": np.dtype("<f4"), "i8": np.dtype("i1"), "i16": np.dtype("<i2"), "i32": np.dtype("<i4"),
    "i64": np.dtype("<i8"), "u8": np.dtype("u1"), "u16": np.dtype("<u2"), "u32": np.dtype("<u4"),
    "u64": np.dtype("<u8"), "bool": np.dtype("?"),
}
GROUP_KEYS = ("e", "t", "f", "fs", "i", "sp")


@dataclass(frozen=True, eq=False)
class TensorGroup:
    """Dense tensors by name, an optional `SparseSection`, and the float value encoding."""

    dense: Mapping[str, npt.NDArray[Any]] = field(default_factory=dict)
    sparse: SparseSection | None = None
    value_dtype: str = "f32"

    def __post_init__(self) -> None:
        if self.value_dtype not in VALUE_ENCODINGS:
            raise Malformed(f"value_dtype must be one of {', '.join(VALUE_ENCODINGS)}, got {self.value_dtype!r}")
        if not isinstance(self.dense, Mapping):
            raise Malformed(f"TensorGroup.dense must be a mapping of name to array, got {type(self.dense).__name__}")
        if self.sparse is not None and not isinstance(self.sparse, SparseSection):
            raise Malformed(f"TensorGroup.sparse must be a SparseSection or None, got {type(self.sparse).__name__}")
        if self.sparse is not None and set(self.dense) & set(self.sparse.names):
            raise Malformed(f"tensor names appear both dense and sparse: {sorted(set(self.dense) & set(self.sparse.names))}")

    def names(self) -> list[str]:
        """All tensor names of the group: dense first, then sparse."""
        return list(self.dense) + (list(self.sparse.names) if self.sparse is not None else [])


def wire_dtype(arr: npt.NDArray[Any], name: str) -> str:
    """The table's dtype code for a dense array: floats become "f32"."""
    if arr.dtype.kind == "f":
        return "f32"
    for code, dtype in DENSE_DTYPES.items():
        if code != "f32" and arr.dtype.kind == dtype.kind and arr.dtype.itemsize == dtype.itemsize:
            return code
    raise Malformed(f"tensor {name!r} has dtype {arr.dtype}; the format carries float, int8-64, uint8-64 and bool")


def encode_group(group: TensorGroup) -> dict[str, Any]:
    """The msgpack-ready map of one group."""
    table: list[list[Any]] = []
    floats: list[npt.NDArray[np.float32]] = []
    raw: list[bytes] = []
    for name, value in group.dense.items():
        check_name(name, "dense tensor name")
        arr = np.asarray(value)
        code = wire_dtype(arr, name)
        table.append([name, code, list(check_shape(arr.shape, f"tensor {name!r}"))])
        if code == "f32":
            floats.append(arr.astype(np.float32, copy=False).reshape(-1))
        else:
            raw.append(np.ascontiguousarray(arr, dtype=DENSE_DTYPES[code]).tobytes())
    flat = np.concatenate(floats) if floats else np.zeros(0, dtype=np.float32)
    payload, scales = encode_values(flat, group.value_dtype, [f.size for f in floats])
    sparse = encode_section(group.sparse, group.value_dtype) if group.sparse is not None else None
    return {"e": group.value_dtype, "t": table, "f": payload, "fs": scales, "i": b"".join(raw), "sp": sparse}


def received(group: TensorGroup) -> TensorGroup:
    """The group as a receiver decodes it: its float values through the group's value encoding (dense floats as
    float32, one int8 scale per tensor; sparse values per tensor), integer tensors unchanged. Equal to encoding the
    group in a packet and decoding it, without either (for ``f32``, float32 views of the group's own arrays)."""
    if group.value_dtype == "f32":
        if all(np.asarray(v).dtype.kind != "f" or np.asarray(v).dtype == np.float32 for v in group.dense.values()):
            return group
        return TensorGroup({n: np.asarray(v).astype(np.float32) if np.asarray(v).dtype.kind == "f" else v
                            for n, v in group.dense.items()}, group.sparse, group.value_dtype)
    dense: dict[str, npt.NDArray[Any]] = {}
    floats = [(name, np.asarray(value)) for name, value in group.dense.items() if np.asarray(value).dtype.kind == "f"]
    if floats:
        flat = np.concatenate([a.astype(np.float32, copy=False).reshape(-1) for _, a in floats])
        values = received_values(flat, group.value_dtype, [a.size for _, a in floats])
        start = 0
        for name, array in floats:
            dense[name] = values[start:start + array.size].reshape(array.shape)
            start += array.size
    dense = {name: dense.get(name, value) for name, value in group.dense.items()}
    sparse = group.sparse
    if sparse is not None:
        sparse = dataclasses.replace(sparse, values=received_values(sparse.values, group.value_dtype, sparse.counts),
                                     local_cache={})
    return TensorGroup(dense, sparse, group.value_dtype)


def decode_group(obj: Any, budget: Budget, limits: Limits, where: str) -> TensorGroup:
    """Check a group map against the format and the limits, then rebuild the group."""
    grp = exact_map(obj, GROUP_KEYS, where)
    encoding = get_str(grp, "e", where)
    if encoding not in VALUE_ENCODINGS:
        raise Malformed(f"{where}: unknown value encoding {encoding!r}")
    entries: list[tuple[str, str, tuple[int, ...], int]] = []
    for i, entry in enumerate(get_list(grp, "t", where)):
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[2], list)):
            raise Malformed(f"{where}.t[{i}]: a table entry is [name, dtype, shape]")
        name = check_name(entry[0], f"{where}.t[{i}]")
        if not isinstance(entry[1], str) or entry[1] not in DENSE_DTYPES:
            raise Malformed(f"{where}: tensor {name!r} has unknown dtype {entry[1]!r:.40}")
        shape = check_shape(entry[2], f"{where} tensor {name!r}")
        entries.append((name, entry[1], shape, budget.take(shape, f"{where} tensor {name!r}")))
    if len({e[0] for e in entries}) != len(entries):
        raise Malformed(f"{where}: dense tensor names repeat")
    float_counts = [count for _, code, _, count in entries if code == "f32"]
    values = decode_values(get_bytes(grp, "f", where), get_bytes(grp, "fs", where), encoding, float_counts,
                           allow_nonfinite=limits.allow_nonfinite, where=f"{where} dense values")
    raw = get_bytes(grp, "i", where)
    want = sum(count * DENSE_DTYPES[code].itemsize for _, code, _, count in entries if code != "f32")
    if len(raw) != want:
        raise Malformed(f"{where}: integer payload holds {len(raw)} bytes, the table implies {want}")
    dense: dict[str, npt.NDArray[Any]] = {}
    fpos = ipos = 0
    for name, code, shape, count in entries:
        if code == "f32":
            dense[name] = values[fpos:fpos + count].reshape(shape)
            fpos += count
            continue
        dtype = DENSE_DTYPES[code]
        arr = np.frombuffer(raw, dtype=dtype, count=count, offset=ipos).copy()
        ipos += count * dtype.itemsize
        if code == "bool" and (arr.view(np.uint8) > 1).any():
            raise Malformed(f"{where}: bool tensor {name!r} holds bytes other than 0 and 1")
        dense[name] = arr.astype(dtype.newbyteorder("="), copy=False).reshape(shape)
    sparse = None
    if grp["sp"] is not None:
        sparse = decode_section(grp["sp"], encoding, budget, limits, f"{where}.sp")
        if set(dense) & set(sparse.names):
            raise Malformed(f"{where}: tensor names appear both dense and sparse")
    return TensorGroup(dense, sparse, encoding)
