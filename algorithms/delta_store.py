"""How a checkpoint keeps ef's public deltas (keyframe deltas and the catch-up), exactly and compactly.

A checkpoint is written every round, and before this the deltas were most of it (2.75 MB a delta of the paper CNN
at keep 0.3, eight of them kept). ``compact`` keeps a delta's positions as a bit mask over the flat model and, when
each tensor's values share one magnitude (ternary values do), its values as sign bits and one float32 magnitude a
tensor (0.19 MB a delta); it checks that form bit for bit against the values and otherwise keeps them as float32.
Positions that are not strictly increasing are kept as they are. ``expand`` reads any of these forms, including a
checkpoint's of before (positions and values as arrays). Pure numpy over a ``FlatLayout``: no codec, no torch, no
state.
"""

from __future__ import annotations

import numpy as np

from fedge.algorithms.sparse import Arrays, FlatLayout


def compact(layout: FlatLayout, indices: np.ndarray, values: np.ndarray) -> Arrays:
    """The arrays a checkpoint keeps for a delta at ``indices`` with float32 ``values``."""
    if np.any(np.diff(indices) <= 0):  # a mask keeps positions in increasing order only
        return {"indices": indices, "values": values}
    mask = np.zeros(layout.size, dtype=bool)
    mask[indices] = True
    counts = np.diff(layout.bounds(indices))
    magnitudes = np.array([np.abs(part).max() if part.size else 0.0
                           for part in np.split(values, np.cumsum(counts)[:-1])], dtype=np.float32)
    signs = np.packbits(np.signbit(values))
    if np.array_equal(signed(signs, magnitudes, counts).view(np.uint32), values.view(np.uint32)):
        return {"mask": np.packbits(mask), "signs": signs, "magnitudes": magnitudes}
    return {"mask": np.packbits(mask), "values": values}


def expand(layout: FlatLayout, arrays: Arrays, at: str) -> tuple[np.ndarray, np.ndarray]:
    """The positions and values of the delta whose arrays ``compact`` wrote under the key prefix ``at``."""
    if f"{at}indices" in arrays:
        return arrays[f"{at}indices"].copy(), arrays[f"{at}values"].copy()
    mask = np.unpackbits(arrays[f"{at}mask"], count=layout.size).astype(bool)
    indices = np.flatnonzero(mask).astype(np.int32 if layout.size < 2**31 else np.int64)
    if f"{at}signs" in arrays:
        return indices, signed(arrays[f"{at}signs"], arrays[f"{at}magnitudes"], np.diff(layout.bounds(indices)))
    return indices, arrays[f"{at}values"].copy()


def signed(signs: np.ndarray, magnitudes: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Values from their sign bits and one magnitude per tensor (``counts`` values each)."""
    values = np.repeat(magnitudes, counts)
    negative = np.unpackbits(signs, count=values.size).astype(bool)
    return np.where(negative, -values, values).astype(np.float32)
