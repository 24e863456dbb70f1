"""Flat views of named tensors and top-fraction compression with error feedback, shared by DSSA and ef-*.

``FlatLayout`` fixes the flat positions of a set of tensors (row-major, concatenated in the given order), the
positions that ``codec.SparseSection`` uses. ``compress`` sends the top ``keep`` fraction of an update (by
magnitude, ties by flat index, k from ``codec.retained_count``) with indices, and returns what the receiver will
decode and the error-feedback residual; with ``value_dtype = "ternary"`` the sent values are first replaced by
``ternary`` (sign times one magnitude per tensor, travelling in the codec's int8 encoding), and the residual keeps
what that rounding lost too. ``decoded`` tells what a receiver gets from a group, by a real codec
round trip when the value encoding is lossy. Holds no state; must not import a transport.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedge import codec
from fedge.codec import SparseSection, TensorGroup

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class FlatLayout:
    """Names and shapes of tensors laid end to end: position p of the flat vector is one coordinate."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, arrays: Mapping[str, np.ndarray], names: Sequence[str]) -> FlatLayout:
        return cls(tuple(names), tuple(tuple(np.shape(arrays[name])) for name in names))

    @property
    def sizes(self) -> list[int]:
        return [int(np.prod(shape, dtype=np.int64)) for shape in self.shapes]

    @property
    def size(self) -> int:
        return sum(self.sizes)

    def flat(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        """A new float32 vector holding the named tensors end to end."""
        if not self.names:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate([np.asarray(arrays[name], dtype=np.float32).reshape(-1) for name in self.names])

    def split(self, flat: np.ndarray) -> Arrays:
        """Named float32 tensors (copies) from a flat vector."""
        out: Arrays = {}
        start = 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes, strict=True):
            out[name] = np.array(flat[start:start + size], dtype=np.float32).reshape(shape)
            start += size
        return out

    def bounds(self, indices: np.ndarray) -> np.ndarray:
        """Where each tensor's positions start and end in increasing flat ``indices`` (one more than tensors)."""
        return np.searchsorted(indices, np.cumsum([0, *self.sizes]))

    def parts(self, flat: np.ndarray) -> Arrays:
        """Named views (not copies) of a flat vector, e.g. of a mask."""
        out: Arrays = {}
        start = 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes, strict=True):
            out[name] = flat[start:start + size].reshape(shape)
            start += size
        return out


def decoded(group: TensorGroup) -> TensorGroup:
    """What the receiver decodes (``codec.received``): the group itself when its values travel losslessly (f32)."""
    return codec.received(group)


def decoded_values(group: TensorGroup) -> np.ndarray:
    """The float32 values of the group's sparse section as the receiver will decode them."""
    sparse = decoded(group).sparse
    if sparse is None:
        raise ValueError("the group carries no sparse section")
    return np.asarray(sparse.values, dtype=np.float32)


def wire_dtype(value_dtype: str) -> str:
    """The codec's value encoding for a value_dtype: ``ternary`` values travel as int8, the others as named."""
    return "int8" if value_dtype in SIGNED_LEVELS else value_dtype


# value encodings that replace each tensor's sent values by sign * one of a few magnitudes: how many
SIGNED_LEVELS = {"ternary": 1, "quinary": 2}


def ternary(layout: FlatLayout, indices: np.ndarray, values: np.ndarray, levels: int = 1) -> np.ndarray:
    """Each tensor's sent values replaced by sign * (mean |value| of that tensor's sent values); with ``levels``
    = 2 (``quinary``), by sign * the mean |value| of the tensor's sent values at or above their median magnitude,
    or of those below it.

    The ternarisation of sparse ternary compression (Sattler et al., 2019). On the wire it is int8 with one scale
    per tensor: every value becomes +-127 (or 0), two byte values that zstd codes in under 2 bits each (quinary:
    four byte values, about 2 bits).
    """
    bounds = layout.bounds(indices)
    out = np.empty_like(values)
    for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
        part = values[start:stop]
        if part.size and levels == 2:
            size = np.abs(part)
            high = size >= np.median(size)
            out[start:stop] = np.sign(part) * np.where(high, np.float32(size[high].mean()),
                                                       np.float32(size[~high].mean() if (~high).any() else 0))
        elif part.size:
            out[start:stop] = np.sign(part) * np.float32(np.abs(part).mean())
    return out


@dataclass(frozen=True)
class Compressed:
    """One compressed update: the group to send, its positions, the decoded values, the new residual, and the
    factor the values sent were scaled by to fit a clip (1.0: none)."""

    group: TensorGroup
    indices: np.ndarray
    decoded: np.ndarray
    residual: np.ndarray
    scale: float = 1.0


CLIP_TRIES = 4
CLIP_MARGIN = 1 - 2.0 ** -10


@dataclass(frozen=True)
class ValueGrid:
    """The grid a sum puts every value sent on (secure aggregation's, ``ClientHalf.on_value_grid``): each value
    clamped to [-``bound``, ``bound``] (0: not) and rounded to a multiple of ``step`` (0: not), so that the sum's own
    clip and rounding change nothing and error feedback keeps what they would have lost. On a grid the values travel
    as float32 whatever the value encoding (the field's words are what goes on the wire)."""

    bound: float = 0.0
    step: float = 0.0

    def clamped(self, values: np.ndarray) -> np.ndarray:
        return np.clip(values, -np.float32(self.bound), np.float32(self.bound)) if self.bound > 0 else values

    def rounded(self, values: np.ndarray, toward_zero: bool = False) -> np.ndarray:
        """To the nearest step, or toward zero (no value grows: an L2 bound met before rounding is met after)."""
        if self.step <= 0:
            return values
        steps = values.astype(np.float64) / self.step
        return ((np.trunc(steps) if toward_zero else np.rint(steps)) * self.step).astype(np.float32)

    def encoding(self, value_dtype: str) -> str:
        return "f32" if self.step > 0 else value_dtype


NO_GRID = ValueGrid()


def compress(layout: FlatLayout, update: np.ndarray, keep: float | str, value_dtype: str,
             dense: Mapping[str, np.ndarray] | None = None, candidates: np.ndarray | None = None,
             clip: float = 0.0, grid: ValueGrid = NO_GRID) -> Compressed:
    """Send the top ``keep`` fraction (by |value|) of ``update`` among ``candidates`` (default: all positions).

    ``update`` is the full flat vector (already including the old residual). The new residual is ``update``
    everywhere except at the sent positions, where it is what the receiver misses: update - decoded (zero when the
    values travel as f32). ``clip`` (0: none): the values sent are scaled so that their decoded L2 norm is at most
    ``clip``, and the residual keeps the rest; ``grid``: each value sent is first clamped to its bound and put on
    its step, and the residual keeps what that moved.
    """
    pool = update if candidates is None else update[candidates]
    count = codec.retained_count(int(pool.size), keep=keep)
    chosen = np.flatnonzero(codec.topk_mask([pool], count))
    indices = (chosen if candidates is None else candidates[chosen]).astype(np.int64)
    values = np.ascontiguousarray(update[indices], dtype=np.float32)
    group, received, scale = fitted(layout, indices, values, value_dtype, dense, clip,
                                    lambda wire: SparseSection.with_indices(layout.names, layout.shapes, indices, wire),
                                    grid)
    residual = np.array(update, dtype=np.float32)
    residual[indices] = values - received
    return Compressed(group=group, indices=indices, decoded=received, residual=residual, scale=scale)


def fitted(layout: FlatLayout, indices: np.ndarray, values: np.ndarray, value_dtype: str,
           dense: Mapping[str, np.ndarray] | None, clip: float,
           section: Callable[[np.ndarray], SparseSection], grid: ValueGrid = NO_GRID
           ) -> tuple[TensorGroup, np.ndarray, float]:
    """The values sent at ``indices`` as a group (``section`` places them: with indices, or bound to a mask) in
    ``value_dtype``, each clamped to the grid's bound, scaled so that their decoded L2 norm is at most ``clip`` (0:
    none) and put on the grid's step (in float32, toward zero under a norm bound); with the values the receiver
    decodes and the scale."""
    values = grid.clamped(values)
    value_dtype = grid.encoding(value_dtype)
    scale = 1.0
    for _ in range(CLIP_TRIES):
        scaled = grid.rounded(values if scale == 1.0 else (values * np.float32(scale)).astype(np.float32),
                              toward_zero=clip > 0)
        wire_values = ternary(layout, indices, scaled, SIGNED_LEVELS[value_dtype]) \
            if value_dtype in SIGNED_LEVELS else scaled
        group = TensorGroup(dense=dict(dense or {}), sparse=section(wire_values), value_dtype=wire_dtype(value_dtype))
        received = decoded_values(group)
        if clip <= 0:
            break
        norm = float(np.linalg.norm(received.astype(np.float64)))
        if norm <= clip:
            break
        scale *= clip / norm * CLIP_MARGIN  # below the bound after the value encoding's rounding
    else:
        raise ValueError(f"could not scale the update under its norm bound {clip} in {CLIP_TRIES} tries")
    return group, received, scale
