"""What the coordinator checks of an update before any algorithm sees it: its runtime fields (``check_fields``: a
sample count of at least one, none of the coordinator's own meta keys) and its tensors (``check_update``: every name
in the model, every shape the model's, a float tensor where the model's is float and an integer one where it is
not, values bound only to a mask sent this round). Pure: decoded messages in, a reason out.

``Unfoldable`` is the one error a fold raises for what a device sent (``protocol.server_half.Aggregation`` catches
it, and only it: the device's update is refused and the aggregate left as if it had never arrived); any other
exception from a fold is a bug of the coordinator's."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from fedge import codec
from fedge.protocol.payload import SECURE_CONTRIBUTORS

# meta keys only the coordinator sets (on the update it folds for a securely aggregated round): never a device's
RESERVED_META = frozenset({SECURE_CONTRIBUTORS})


class Unfoldable(ValueError):
    """A fold cannot take an update, for what its device sent (its groups, its support, its sizes): the update is
    refused and nothing of it is kept."""


def check_fields(update: codec.Update) -> str:
    """A reason to reject the update's runtime fields (in every mode, masked or not), or ''."""
    if update.num_samples < 1:
        return f"num_samples = {update.num_samples}: an update is trained on at least one sample"
    reserved = sorted(RESERVED_META & set(update.meta))
    if reserved:
        return f"meta.{reserved[0]} is a key only the coordinator sets"
    return ""


def check_update(update: codec.Update, shapes: Mapping[str, tuple[int, ...]], masks_sent: set[int],
                 floats: Collection[str] | None = None) -> str:
    """A reason to reject the update's tensors (unknown names, wrong shapes, an integer tensor where the model's is
    float or the reverse, a foreign mask), or ''. ``floats``: the model's float tensors (None: kinds unchecked)."""
    for group_name, group in update.groups.items():
        for name, array in group.dense.items():
            if name not in shapes:
                return f"group {group_name!r} names an unknown tensor {name!r}"
            if tuple(array.shape) != shapes[name]:
                return f"{group_name}/{name}: shape {tuple(array.shape)}, expected {shapes[name]}"
            if floats is not None and (array.dtype.kind == "f") != (name in floats):
                kind = "float" if name in floats else "integer"
                return f"{group_name}/{name}: {array.dtype} values, the model's tensor is {kind}"
        sparse = group.sparse
        if sparse is None:
            continue
        for name, shape in zip(sparse.names, sparse.shapes, strict=True):
            if shapes.get(name) != tuple(shape):
                return f"{group_name}: sparse tensor {name!r} with shape {tuple(shape)} is not in the model"
        if sparse.kind == "masked-values" and sparse.mask_crc not in masks_sent:
            return f"{group_name}: values are bound to a mask (crc {sparse.mask_crc:#x}) not sent this round"
    return ""
