"""Where a round's held updates wait when there are too many to keep in memory: ``Spill``.

A round that must hold its updates until it closes (``protocol.server_half.Aggregation``: the bounds of round 1, or
of a phase's first round, are known only when the round closes) keeps the first ``budget`` bytes of their arrays in
memory; the arrays of every update beyond that are written to one file per update under the run directory's
``spill/`` and replaced by read-only memory maps of it, so a thousand held 4.6 MB updates cost disk, not memory:
the close folds them one at a time, in client order, each map dropped once folded. The values are stored as they
arrived (the same dtype and bytes), so a spilled update folds bit for bit as a kept one. The files live only while
their round is open: ``clear`` removes them at the round's end, and a session removes what an interrupted round
left when it starts. Knows nothing of sockets, algorithms or the round's rules; numpy and the file system only.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import BinaryIO

import numpy as np

from fedge.codec import TensorGroup
from fedge.protocol.payload import ClientUpdate, Payload

HELD_IN_MEMORY_BYTES = 64 * 1024 * 1024  # a held round's arrays kept in memory before the rest is spilled


class Spill:
    """The held updates of one round: kept while their arrays total at most ``budget`` bytes, spilled to
    ``directory`` beyond it (``spilled`` counts the updates written there, ``spilled_bytes`` their bytes)."""

    def __init__(self, directory: Path, budget: int | None = None) -> None:
        self.directory = directory
        self.budget = HELD_IN_MEMORY_BYTES if budget is None else budget
        self.kept_bytes = 0
        self.spilled = 0
        self.spilled_bytes = 0

    def keep(self, update: ClientUpdate) -> ClientUpdate:
        """The update as the round holds it: itself, or with its arrays mapped from a file."""
        size = sum(held_bytes(group) for group in update.payload.groups.values())
        if self.kept_bytes + size <= self.budget:
            self.kept_bytes += size
            return update
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{self.spilled}.bin"
        with open(path, "wb") as handle:
            groups = {name: spill_group(group, handle, path) for name, group in update.payload.groups.items()}
        self.spilled += 1
        self.spilled_bytes += size
        return dataclasses.replace(update, payload=Payload(groups=groups, meta=update.payload.meta))

    def clear(self) -> None:
        """Remove the round's files (their maps stay readable until dropped: the files are only unlinked)."""
        shutil.rmtree(self.directory, ignore_errors=True)
        self.kept_bytes = self.spilled = self.spilled_bytes = 0


def spill_group(group: TensorGroup, handle: BinaryIO, path: Path) -> TensorGroup:
    """The group with each array (its dense tensors, and the sparse section's values, positions and mask)
    appended to ``handle`` (the file at ``path``) and replaced by a read-only map of its bytes there; the sparse
    section's cache of positions is dropped (it is rebuilt when needed)."""

    def mapped(array: np.ndarray) -> np.ndarray:
        if not array.size:
            return array
        array = np.ascontiguousarray(array)
        offset = handle.tell()
        handle.write(array.tobytes())
        handle.flush()
        return np.memmap(path, dtype=array.dtype, mode="r", offset=offset, shape=array.shape)

    sparse = group.sparse
    if sparse is not None:
        sparse = dataclasses.replace(sparse, values=mapped(sparse.values), local_cache={},
                                     indices=None if sparse.indices is None else mapped(sparse.indices),
                                     mask=None if sparse.mask is None else mapped(sparse.mask))
    return dataclasses.replace(group, dense={name: mapped(array) for name, array in group.dense.items()},
                               sparse=sparse)


def held_bytes(group: TensorGroup) -> int:
    """The bytes of a group's arrays (the sparse section's positions and mask included)."""
    sparse = group.sparse
    extra = 0 if sparse is None else sparse.values.nbytes + sum(
        array.nbytes for array in (sparse.indices, sparse.mask, *sparse.local_cache.values()) if array is not None)
    return sum(array.nbytes for array in group.dense.values()) + extra
