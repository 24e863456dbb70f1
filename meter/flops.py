"""Training FLOPs: forward+backward counted once per shape, optimizer FLOPs from a per-element table, masks.

* ``FlopCounter`` runs ``torch.utils.flop_counter.FlopCounterMode`` on a CPU copy of the model once per (model
  structure, input shape, batch size, dtype), caches it, and multiplies by the steps taken (the last partial batch
  is its own entry). Counting runs under a forked RNG, so training stays reproducible. FlopCounterMode counts
  matmul/conv kernels (2 FLOPs per multiply-add); elementwise ops, norms, pooling and the loss are not counted.
* ``OPTIMIZER_FLOPS`` / ``optimizer_flops_per_element`` hold docs/meter.md section 3.4 (add, sub, mul, div, sqrt = 1;
  ``add_(x, alpha)`` = 2), which FlopCounterMode does not see (it counts 0 for ``opt.step()``).
* ``ParamSnapshot`` proves which elements an optimizer changed; ``mask_elements`` is the mask's claim.
* ``FlopCounter.theoretical_sparse`` scales each layer's dense count by its weight density: theoretical only, because
  dense kernels do not skip zeros.

Must not import the codec, transports, algorithms or coordinator.
"""

from __future__ import annotations

import copy
import hashlib
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

OPTIMIZER_FLOPS: dict[str, int] = {"sgd": 2, "adam": 13, "adamw": 13}
"""Base FLOPs per updated element; momentum, weight decay, nesterov and amsgrad add to it (see below)."""
MOMENTUM_FLOPS = 2      # buf.mul_(mu) + buf.add_(g), and p.add_(buf) replaces p.add_(g)
L2_DECAY_FLOPS = 2      # g = g.add(p, alpha=wd)
NESTEROV_FLOPS = 2      # g = g.add(buf, alpha=mu)
DECOUPLED_DECAY_FLOPS = 1  # AdamW: p.mul_(1 - lr*wd)
AMSGRAD_FLOPS = 1       # torch.maximum, counted as one comparison per element


def optimizer_flops_per_element(optimizer: str, *, momentum: float = 0.0, weight_decay: float = 0.0,
                                nesterov: bool = False, amsgrad: bool = False) -> int | None:
    """FLOPs of one ``step()`` per parameter element; None (with a warning) for an optimizer not in the table.

    SGD 2, + momentum 2, + L2 weight decay 2, + nesterov 2; Adam 13, + L2 weight decay 2 (15); AdamW 13 + 1 for the
    decoupled decay when weight_decay != 0 (14; PyTorch skips the multiply at 0); amsgrad + 1."""
    name = optimizer.lower()
    if name not in OPTIMIZER_FLOPS:
        warnings.warn(f"no FLOP table entry for optimizer {optimizer!r}; optimizer FLOPs left unknown",
                      stacklevel=2)
        return None
    flops = OPTIMIZER_FLOPS[name]
    if name == "sgd":
        flops += MOMENTUM_FLOPS if momentum else 0
        flops += NESTEROV_FLOPS if nesterov and momentum else 0
        flops += L2_DECAY_FLOPS if weight_decay else 0
        return flops
    if weight_decay:
        flops += DECOUPLED_DECAY_FLOPS if name == "adamw" else L2_DECAY_FLOPS
    return flops + (AMSGRAD_FLOPS if amsgrad else 0)


def optimizer_step_flops(optimizer: torch.optim.Optimizer) -> int | None:
    """FLOPs of one ``step()`` of a live torch optimizer, from its class and each param group's settings, over every
    element in its groups (assuming every parameter has a gradient). None for a class not in the table."""
    total = 0
    for group in optimizer.param_groups:
        name = type(optimizer).__name__.lower()
        if name == "adam" and group.get("decoupled_weight_decay", False):
            name = "adamw"
        per_element = optimizer_flops_per_element(
            name, momentum=float(group.get("momentum", 0.0)), weight_decay=float(group.get("weight_decay", 0.0)),
            nesterov=bool(group.get("nesterov", False)), amsgrad=bool(group.get("amsgrad", False)))
        if per_element is None:
            return None
        total += per_element * sum(p.numel() for p in group["params"])
    return total


@dataclass(frozen=True)
class PassCount:
    """FLOPs of one forward+backward pass at one batch size, in total and per module (module names as in
    ``named_modules``; a parent's count includes its children's). The per-module split comes from FlopCounterMode's
    module tracker: exact for the modules that own weights (conv, linear), while a parameter-free module such as
    ``nn.Identity`` may be credited with backward kernels of its neighbours, so only owners' counts are used."""

    total: int
    per_module: Mapping[str, int]


class FlopCounter:
    """Counts forward+backward FLOPs once per (model structure, input shape, batch size, dtype) and caches them."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, tuple[int, ...], int, str], PassCount] = {}

    @property
    def cached(self) -> int:
        return len(self._cache)

    def forward_backward(self, model: nn.Module, input_shape: Sequence[int], batch_size: int,
                         input_dtype: torch.dtype | None = None) -> PassCount:
        """One training pass (forward, ``output.sum().backward()``) of ``batch_size`` samples of ``input_shape``."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        dtype = input_dtype or _float_dtype(model)
        key = (model_signature(model), tuple(int(d) for d in input_shape), int(batch_size), str(dtype))
        if key not in self._cache:
            self._cache[key] = _count_pass(model, key[1], batch_size, dtype)
        return self._cache[key]

    def training(self, model: nn.Module, input_shape: Sequence[int], batch_sizes: Iterable[int],
                 input_dtype: torch.dtype | None = None) -> int:
        """Forward+backward FLOPs of the steps whose batch sizes are given (one entry per step)."""
        return sum(self.forward_backward(model, input_shape, size, input_dtype).total * steps
                   for size, steps in Counter(batch_sizes).items())

    def theoretical_sparse(self, model: nn.Module, input_shape: Sequence[int], batch_sizes: Iterable[int],
                           densities: Mapping[str, float], input_dtype: torch.dtype | None = None) -> int:
        """Σ over steps of Σ_layer density_l × dense_l: each module owning a parameter named in ``densities`` (e.g.
        ``{"fc1.weight": 0.3}``) has its own dense count scaled; the rest stays dense. THEORETICAL: not executed."""
        owners = {name.rpartition(".")[0]: float(d) for name, d in densities.items()}
        for owner, density in owners.items():
            if not 0.0 <= density <= 1.0:
                raise ValueError(f"density of {owner!r} must be in [0, 1], got {density}")
        total = 0.0
        for size, steps in Counter(batch_sizes).items():
            count = self.forward_backward(model, input_shape, size, input_dtype)
            saved = sum((1.0 - density) * count.per_module.get(owner, 0) for owner, density in owners.items())
            total += (count.total - saved) * steps
        return round(total)


def model_signature(model: nn.Module) -> str:
    """A key for a model's structure: its repr plus every parameter's name, shape, dtype and requires_grad."""
    digest = hashlib.sha256(repr(model).encode())
    for name, param in model.named_parameters():
        digest.update(f"{name}:{tuple(param.shape)}:{param.dtype}:{param.requires_grad};".encode())
    return digest.hexdigest()


def _float_dtype(model: nn.Module) -> torch.dtype:
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype
    return torch.float32


def _count_pass(model: nn.Module, input_shape: tuple[int, ...], batch_size: int, dtype: torch.dtype) -> PassCount:
    with torch.random.fork_rng(devices=[]):
        clone = copy.deepcopy(model).to("cpu").train()
        inputs = torch.zeros((batch_size, *input_shape), dtype=dtype)
        try:
            counter = _run(clone, inputs)
        except ValueError:  # e.g. training-mode BatchNorm refuses one sample; matmul/conv counts do not change
            counter = _run(clone.eval(), inputs)
    root = type(clone).__name__
    per_module: dict[str, int] = {}
    for name, ops in counter.get_flop_counts().items():
        if name == "Global":
            continue
        key = "" if name == root else name.removeprefix(root + ".")
        per_module[key] = int(sum(ops.values()))
    return PassCount(int(counter.get_total_flops()), per_module)


def _run(model: nn.Module, inputs: torch.Tensor) -> FlopCounterMode:
    counter = FlopCounterMode(display=False)
    with counter:
        output = model(inputs)
        first = output if isinstance(output, torch.Tensor) else next(iter(output))
        first.float().sum().backward()
    return counter


def trainable_elements(model: nn.Module) -> int:
    """Elements of every parameter that requires grad: what a dense optimizer step touches."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def total_elements(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def mask_elements(model: nn.Module, masks: Mapping[str, torch.Tensor]) -> int:
    """The mask's claim of elements updated: Σ nnz(mask) over masked parameters + numel of the unmasked trainable
    ones (biases, norm parameters). Mask names are parameter names; a nonzero entry means "trainable"."""
    params = dict(model.named_parameters())
    unknown = set(masks) - set(params)
    if unknown:
        raise KeyError(f"masks name parameters the model lacks: {sorted(unknown)}")
    claimed = 0
    for name, param in params.items():
        if not param.requires_grad:
            continue
        mask = masks.get(name)
        claimed += param.numel() if mask is None else int(torch.count_nonzero(mask))
    return claimed


def densities_from_masks(masks: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Fraction of nonzero entries of each mask (or weight tensor), keyed as given."""
    return {name: float(torch.count_nonzero(m)) / max(m.numel(), 1) for name, m in masks.items()}


class ParamSnapshot:
    """A copy of a model's parameters, to count the elements that really changed: the verified update count."""

    def __init__(self, model: nn.Module) -> None:
        self._before = {name: p.detach().clone() for name, p in model.named_parameters()}

    def changed_by_name(self, model: nn.Module) -> dict[str, int]:
        """Elements of each parameter whose value differs now (NaN-aware: NaN to NaN is unchanged)."""
        result: dict[str, int] = {}
        for name, param in model.named_parameters():
            before = self._before[name]
            after = param.detach()
            same = (after == before) | (torch.isnan(after) & torch.isnan(before))
            result[name] = int(same.numel() - int(same.sum()))
        return result

    def changed(self, model: nn.Module) -> int:
        return sum(self.changed_by_name(model).values())
