"""Conversion between a torch model's state and named numpy arrays, and the tensor classes algorithms select on.

Names are the state-dict keys. ``prunable_names`` are the weights of Conv/Linear layers (dim >= 2) in registration
order, the DSSA prunable set; ``batch_norm_names`` are every tensor of a BatchNorm module (FedBN's local set);
``layer_groups`` groups tensors by owning module (pFedLA's layers). The wire format never sees torch: this is the
only place where tensors become arrays. Knows nothing of algorithms or the wire.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def state_to_arrays(model: nn.Module) -> dict[str, np.ndarray]:
    """Every persistent tensor (parameters and buffers) as a contiguous numpy copy, keyed by state-dict name."""
    return {name: t.detach().cpu().numpy().copy() for name, t in model.state_dict().items()}


def arrays_to_state(model: nn.Module, arrays: dict[str, np.ndarray], strict: bool = True) -> None:
    """Load named arrays into the model in place (a subset when strict is False); shapes must match."""
    state = model.state_dict()
    unknown = set(arrays) - set(state)
    if unknown:
        raise KeyError(f"arrays name tensors the model does not have: {sorted(unknown)[:5]}")
    missing = set(state) - set(arrays)
    if strict and missing:
        raise KeyError(f"arrays lack tensors of the model: {sorted(missing)[:5]}")
    with torch.no_grad():
        for name, value in arrays.items():
            target = state[name]
            if tuple(target.shape) != tuple(value.shape):
                raise ValueError(f"{name}: shape {tuple(value.shape)} does not match {tuple(target.shape)}")
            target.copy_(torch.as_tensor(np.array(value, copy=True)).to(target.dtype))


def prunable_names(model: nn.Module) -> list[str]:
    """The ``weight`` of every Linear and Conv{1,2,3}d module, in registration order, except modules that set
    ``fedge_prunable = False``."""
    names = []
    for module_name, module in model.named_modules():
        if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)) and \
                getattr(module, "fedge_prunable", True) is not False:
            names.append(f"{module_name}.weight" if module_name else "weight")
    return names


def batch_norm_names(model: nn.Module) -> list[str]:
    """Every state tensor owned by a BatchNorm module (weight, bias, running stats, num_batches_tracked)."""
    names: list[str] = []
    for module_name, module in model.named_modules():
        if isinstance(module, _BatchNorm):
            prefix = f"{module_name}." if module_name else ""
            names.extend(f"{prefix}{key}" for key in module.state_dict() if "." not in key)
    return names


def layer_groups(model: nn.Module) -> dict[str, list[str]]:
    """State tensors grouped by the module that owns them (a 'layer' for layer-wise aggregation): one group per
    module with parameters of its own, holding its parameters and its own buffers. A buffer of a module without
    parameters belongs to no layer."""
    groups: dict[str, list[str]] = {}
    for module_name, module in model.named_modules():
        if not any(True for _ in module.parameters(recurse=False)):
            continue
        prefix = f"{module_name}." if module_name else ""
        own = [f"{prefix}{key}" for key in module.state_dict(keep_vars=True) if "." not in key]
        if own:
            groups[module_name] = own
    return groups
