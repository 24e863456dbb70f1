"""Wire form of a `SparseSection`: the msgpack map of section 5 of docs/wire-format.md.

`encode_section` turns a section into msgpack-ready data; `decode_section` checks a decoded map
against the format and the receiver's limits (tensor and element counts are accounted before
anything of that size is allocated) and rebuilds the section.

This module must not import torch, zmq or any other Fedge package.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedge.codec.errors import ChecksumError, Limits, Malformed
from fedge.codec.indexcode import decode_segment, encode_segment
from fedge.codec.masks import mask_crc
from fedge.codec.schema import (
    Budget,
    check_name,
    check_shape,
    exact_map,
    get_bytes,
    get_int,
    get_list,
    is_int,
)
from fedge.codec.sparse import SPARSE_KINDS, SparseSection, offsets_of
from fedge.codec.values import decode_values, encode_values

SECTION_KEYS = ("kind", "names", "shapes", "cnt", "crc", "sel", "ix", "val", "vs")


def _segments(section: SparseSection) -> list[list[Any]]:
    if section.kind == "masked-values":
        return []
    offsets = offsets_of(section.shapes)
    if section.mask is not None:
        carried = section.mask
    else:
        assert section.indices is not None
        carried = np.zeros(offsets[-1], dtype=np.bool_)
        carried[section.indices] = True
        for t in range(len(section.shapes)):
            section.local_positions(t)
    return [encode_segment(carried[lo:hi], section.local_cache.get(t))
            for t, (lo, hi) in enumerate(zip(offsets[:-1], offsets[1:], strict=True))]


def encode_section(section: SparseSection, encoding: str) -> dict[str, Any]:
    """The msgpack-ready map of one section, its values in `encoding`."""
    payload, scales = encode_values(section.values, encoding, section.counts)
    return {
        "kind": SPARSE_KINDS.index(section.kind),
        "names": list(section.names),
        "shapes": [list(s) for s in section.shapes],
        "cnt": list(section.counts),
        "crc": section.mask_crc,
        "sel": section.select,
        "ix": _segments(section),
        "val": payload,
        "vs": scales,
    }


def decode_section(obj: Any, encoding: str, budget: Budget, limits: Limits, where: str) -> SparseSection:
    """Check and rebuild a section map; `encoding` is its group's value encoding."""
    sec = exact_map(obj, SECTION_KEYS, where)
    kind_code = get_int(sec, "kind", where, 0, len(SPARSE_KINDS) - 1)
    kind = SPARSE_KINDS[kind_code]
    names = get_list(sec, "names", where)
    shapes_raw = get_list(sec, "shapes", where)
    counts_raw = get_list(sec, "cnt", where)
    segments = get_list(sec, "ix", where)
    if not len(names) == len(shapes_raw) == len(counts_raw):
        raise Malformed(f"{where}: names, shapes and cnt must have one entry per tensor")
    names_t = tuple(check_name(n, f"{where}.names") for n in names)
    if len(set(names_t)) != len(names_t):
        raise Malformed(f"{where}: tensor names repeat")
    shapes = []
    for name, shape in zip(names_t, shapes_raw, strict=True):
        if not isinstance(shape, list):
            raise Malformed(f"{where}: shape of {name!r} must be an array")
        shapes.append(check_shape(shape, f"{where} tensor {name!r}"))
        budget.take(shapes[-1], f"{where} tensor {name!r}")
    offsets = offsets_of(shapes)
    counts = tuple(counts_raw)
    for name, count, lo, hi in zip(names_t, counts, offsets[:-1], offsets[1:], strict=True):
        if not is_int(count) or not 0 <= count <= hi - lo:
            raise Malformed(f"{where}: carried count {count!r:.40} of {name!r} is not in [0, {hi - lo}]")
    crc = get_int(sec, "crc", where, 0, 0xFFFFFFFF)
    select = sec["sel"]
    if not isinstance(select, bool) or (kind != "masked-values" and not select):
        raise Malformed(f"{where}: sel must be a boolean, and true unless the kind is masked-values")
    want_segments = 0 if kind == "masked-values" else len(names_t)
    if len(segments) != want_segments:
        raise Malformed(f"{where}: a {kind} section has {want_segments} index segments, got {len(segments)}")
    values = decode_values(get_bytes(sec, "val", where), get_bytes(sec, "vs", where), encoding, counts,
                           allow_nonfinite=limits.allow_nonfinite, where=f"{where} values")
    shapes_t = tuple(shapes)
    if kind == "masked-values":
        return SparseSection(kind, names_t, shapes_t, values, counts, crc, select)
    mask = np.zeros(offsets[-1], dtype=np.bool_)
    local: dict[int, np.ndarray[Any, np.dtype[np.int64]]] = {}
    for t, (name, segment, count, lo, hi) in enumerate(zip(names_t, segments, counts, offsets[:-1], offsets[1:], strict=True)):
        positions, bits = decode_segment(segment, hi - lo, count, f"{where} index of {name!r}")
        if bits is not None:
            mask[lo:hi] = bits
        else:
            assert positions is not None
            mask[lo:hi][positions] = True  # through the tensor's view: no shifted copy of the positions
        if positions is not None:
            local[t] = positions
    if mask_crc(mask) != crc:
        raise ChecksumError(f"{where}: the decoded positions have CRC {mask_crc(mask):08x}, the sender's is "
                            f"{crc:08x}; the index field is corrupt")
    if kind == "mask":
        section = SparseSection(kind, names_t, shapes_t, values, counts, crc, True, mask)
        section.local_cache.update(local)
        return section
    return SparseSection(kind, names_t, shapes_t, values, counts, crc, True, None, np.flatnonzero(mask))
