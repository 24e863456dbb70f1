"""What the coordinator checks of an update's tensors before any algorithm sees it: every name in the model, every
shape the model's, values bound only to a mask sent this round. Pure: decoded messages in, a reason out.

``Unfoldable`` is the one error a fold raises for what a device sent (``protocol.server_half.Aggregation`` catches
it, and only it: the device's update is refused and the aggregate left as if it had never arrived); any other
exception from a fold is a bug of the coordinator's."""

from __future__ import annotations

from collections.abc import Mapping

from fedge import codec


class Unfoldable(ValueError):
    """A fold cannot take an update, for what its device sent (its groups, its support, its sizes): the update is
    refused and nothing of it is kept."""


def check_update(update: codec.Update, shapes: Mapping[str, tuple[int, ...]], masks_sent: set[int]) -> str:
    """A reason to reject the update's tensors (unknown names, wrong shapes, foreign mask), or ''."""
    for group_name, group in update.groups.items():
        for name, array in group.dense.items():
            if name not in shapes:
                return f"group {group_name!r} names an unknown tensor {name!r}"
            if tuple(array.shape) != shapes[name]:
                return f"{group_name}/{name}: shape {tuple(array.shape)}, expected {shapes[name]}"
        sparse = group.sparse
        if sparse is None:
            continue
        for name, shape in zip(sparse.names, sparse.shapes, strict=True):
            if shapes.get(name) != tuple(shape):
                return f"{group_name}: sparse tensor {name!r} with shape {tuple(shape)} is not in the model"
        if sparse.kind == "masked-values" and sparse.mask_crc not in masks_sent:
            return f"{group_name}: values are bound to a mask (crc {sparse.mask_crc:#x}) not sent this round"
    return ""
