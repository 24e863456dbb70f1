"""What a client hands its meter beyond sizes: the algorithm's mask figures.

A small helper of the client-round function (``client.round``); it knows no algorithm by name (a client half that
trains a masked subset offers ``trainable_masks()``).
"""

from __future__ import annotations

import numpy as np
import torch

from fedge.algorithms.contract import ClientHalf
from fedge.meter import densities_from_masks, mask_elements


def mask_figures(client: ClientHalf, model: torch.nn.Module) -> tuple[int | None, dict[str, float] | None]:
    """The mask's own claim of updated elements and per-weight trainable densities, when the algorithm's client half
    trains a masked subset (``trainable_masks()``, e.g. DSSA); (None, None) otherwise."""
    masks = client.trainable_masks()
    if not masks:
        return None, None
    tensors = {name: torch.from_numpy(np.ascontiguousarray(mask)) for name, mask in masks.items()}
    return mask_elements(model, tensors), densities_from_masks(tensors)
