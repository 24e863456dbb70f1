"""Small checks for decoded msgpack structures, and the running size budget of one packet.

Every check raises `Malformed` (or `TooLarge` for the budget) with the path of the offending
field, so an error names exactly what was wrong. Encoders use the same rules through
`check_name` and `check_shape`.

This module must not import torch, zmq or any other Fedge package.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from fedge.codec.errors import Limits, Malformed, ShapeMismatch, TooLarge

MAX_NAME_BYTES = 1024
MAX_NDIM = 32
MAX_I64 = (1 << 63) - 1


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def exact_map(obj: Any, keys: Iterable[str], where: str) -> dict[str, Any]:
    """`obj` must be a map with exactly `keys` (the format has no optional fields)."""
    if not isinstance(obj, dict):
        raise Malformed(f"{where}: expected a map, got {type(obj).__name__}")
    want = set(keys)
    got = set(obj)
    if got != want:
        missing = sorted(want - got)
        extra = sorted(str(k) for k in got - want)
        raise Malformed(f"{where}: map keys differ from the format (missing {missing}, unexpected {extra})")
    return obj


def get_int(obj: dict[str, Any], key: str, where: str, lo: int = 0, hi: int = MAX_I64) -> int:
    value = obj[key]
    if not is_int(value) or not lo <= value <= hi:
        raise Malformed(f"{where}.{key}: expected an integer in [{lo}, {hi}], got {value!r:.80}")
    return int(value)


def get_str(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj[key]
    if not isinstance(value, str):
        raise Malformed(f"{where}.{key}: expected a string, got {type(value).__name__}")
    return value


def get_bytes(obj: dict[str, Any], key: str, where: str) -> bytes:
    value = obj[key]
    if not isinstance(value, bytes):
        raise Malformed(f"{where}.{key}: expected binary data, got {type(value).__name__}")
    return value


def get_list(obj: dict[str, Any], key: str, where: str) -> list[Any]:
    value = obj[key]
    if not isinstance(value, list):
        raise Malformed(f"{where}.{key}: expected an array, got {type(value).__name__}")
    return value


def check_name(name: Any, where: str) -> str:
    """Tensor and group names: non-empty strings of at most MAX_NAME_BYTES UTF-8 bytes."""
    if not isinstance(name, str) or not name or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise Malformed(f"{where}: a name must be a non-empty string of at most {MAX_NAME_BYTES} bytes, "
                        f"got {name!r:.80}")
    return name


def check_shape(shape: Any, where: str) -> tuple[int, ...]:
    """A shape: a sequence of at most MAX_NDIM non-negative ints."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__") or len(shape) > MAX_NDIM:
        raise ShapeMismatch(f"{where}: a shape is a list of at most {MAX_NDIM} dimensions, got {shape!r:.80}")
    dims = []
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not 0 <= int(dim) <= MAX_I64:
            raise ShapeMismatch(f"{where}: dimension {dim!r:.40} is not a non-negative integer")
        dims.append(int(dim))
    return tuple(dims)


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


class Budget:
    """Counts the tensors and elements a packet declares, failing as soon as a limit is passed."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.tensors = 0
        self.elements = 0

    def take(self, shape: tuple[int, ...], where: str) -> int:
        """Account for one tensor of `shape`; returns its element count."""
        count = numel(shape)
        self.tensors += 1
        self.elements += count
        if self.tensors > self.limits.max_tensors:
            raise TooLarge(f"{where}: the packet declares more than {self.limits.max_tensors} tensors "
                           f"(Limits.max_tensors)")
        if self.elements > self.limits.max_elements:
            raise TooLarge(f"{where}: the packet declares more than {self.limits.max_elements} tensor "
                           f"elements (Limits.max_elements)")
        return count
