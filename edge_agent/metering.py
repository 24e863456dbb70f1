"""What the agent hands its meter beyond sizes: the algorithm's mask figures and the coordinator's TCP peer.

Small helpers of ``edge_agent.agent``; they know no algorithm by name (a client half that trains a masked subset
offers ``trainable_masks()``) and open no socket.
"""

from __future__ import annotations

import socket

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


def tcp_peer(endpoint: str) -> tuple[str, int] | None:
    """(IP address, port) of a tcp:// endpoint, for the kernel's per-connection byte counters."""
    if not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint[len("tcp://"):].rpartition(":")
    try:
        return socket.gethostbyname(host.strip("[]")), int(port)
    except (OSError, ValueError):
        return None
