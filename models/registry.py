"""The model registry: built-in names and plugin factories -> networks, and a hash of a model definition.

A model is named by ``ModelSpec``: a built-in name (``cnn``, ``cnn-bn``, ``mlp``) or a plugin (``package.module:
callable`` or an entry point of the group ``fedge.models``), the per-sample input shape, the number of outputs, the
``[model.options]`` table and the PAN options. The same spec builds the same architecture on the coordinator and on
every device, and ``definition_hash`` lets the hello refuse a mismatch. A plugin factory is called positionally as
``factory(input_shape, num_outputs, options)`` and must return an ``nn.Module``. Deciding whether a device may import
a plugin is the caller's job (``fedge.plugins.check_allowed``) and happens before ``build``. Knows nothing of
algorithms, data or the wire.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedge.models.nets import MLP, PaperCNN
from fedge.models.pan import PanSpec, PositionEncoding
from fedge.plugins import PluginError, PluginRef, describe, load


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to build the same network anywhere. ``num_classes`` is the number of outputs: classes
    for classification, target values for regression or multi-label tasks."""

    name: str = "cnn"
    input_shape: tuple[int, ...] = (1, 28, 28)
    num_classes: int = 10
    pan: str = "off"
    pan_a: float = 0.1
    pan_t: float = 1.0
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def pan_spec(self) -> PanSpec:
        return PanSpec(self.pan, self.pan_a, self.pan_t)

    @property
    def num_outputs(self) -> int:
        return self.num_classes

    @property
    def builtin(self) -> bool:
        return self.name in MODELS

    def plugin(self, *, for_processes: bool = False) -> PluginRef | None:
        """The plugin this spec names (resolved from metadata, not imported), or None for a built-in."""
        return None if self.builtin else describe("model", self.name, for_processes=for_processes)

    def as_dict(self) -> dict[str, Any]:
        """The JSON-ready form the welcome and the device's committed model carry."""
        return {"name": self.name, "input_shape": list(self.input_shape), "num_classes": self.num_classes,
                "pan": self.pan, "pan_a": self.pan_a, "pan_t": self.pan_t, "options": dict(self.options)}

    @classmethod
    def from_dict(cls, meta: Mapping[str, Any]) -> ModelSpec:
        """The inverse of ``as_dict``."""
        return cls(name=str(meta["name"]), input_shape=tuple(int(d) for d in meta["input_shape"]),
                   num_classes=int(meta["num_classes"]), pan=str(meta["pan"]), pan_a=float(meta["pan_a"]),
                   pan_t=float(meta["pan_t"]), options=dict(meta.get("options", {})))


Builder = Callable[[tuple[int, int, int], int, PanSpec], nn.Module]

MODELS: dict[str, Builder] = {
    "cnn": lambda shape, classes, pan: PaperCNN(shape, classes, pan, batch_norm=False),
    "cnn-bn": lambda shape, classes, pan: PaperCNN(shape, classes, pan, batch_norm=True),
    "mlp": lambda shape, classes, pan: MLP(shape, classes, pan, batch_norm=False),
}

# Input shapes of the image datasets Fedge loads: Fashion-MNIST (1x28x28), CIFAR-10 and SVHN (3x32x32).
SUPPORTED_INPUT_SHAPES: tuple[tuple[int, int, int], ...] = ((1, 28, 28), (3, 32, 32))


def build(spec: ModelSpec, seed: int | None = None) -> nn.Module:
    """Construct the network (initialised from ``seed`` when given, without touching the global RNG); raises
    ValueError naming the problem for an unknown name, a failing factory or bad PAN options."""
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return build(spec)
    if not spec.input_shape or min(spec.input_shape) < 1:
        raise ValueError(f"model input shape must be positive sizes, got {spec.input_shape}")
    if spec.num_classes < 1:
        raise ValueError(f"a model needs at least one output, got {spec.num_classes}")
    pan = spec.pan_spec
    if spec.builtin:
        if len(spec.input_shape) != 3:
            raise ValueError(f"the built-in model {spec.name!r} takes images (C, H, W), not {spec.input_shape}: "
                             "name a plugin model for other data (docs/api.md)")
        if spec.options:
            raise ValueError(f"the built-in model {spec.name!r} takes no [model.options]")
        model = MODELS[spec.name](tuple(spec.input_shape), spec.num_classes, pan)  # type: ignore[arg-type]
    else:
        model = _build_plugin(spec)
    encodings = [m for m in model.modules() if isinstance(m, PositionEncoding)]
    if pan.active and not encodings:
        raise ValueError(f"model.pan = {pan.mode!r}, but model {spec.name!r} has no position-encoding layers "
                         "(fedge.models.PositionEncoding): it cannot use PANs")
    for layer in encodings:
        layer.configure(pan)
    return model


def _build_plugin(spec: ModelSpec) -> nn.Module:
    ref = describe("model", spec.name)
    factory = load(ref)
    try:
        model = factory(tuple(spec.input_shape), spec.num_classes, dict(spec.options))
    except Exception as exc:
        raise PluginError(f"model {spec.name!r} raised {type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise PluginError(f"model {spec.name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def definition_hash(spec: ModelSpec) -> str:
    """A short stable hash of the model definition (name, shape, outputs, options, PAN options, tensor layout)."""
    model = build(spec)
    layout = [(name, list(t.shape), str(t.dtype)) for name, t in model.state_dict().items()]
    blob = json.dumps({"spec": spec.as_dict(), "layout": layout}, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def describe_models() -> list[dict[str, object]]:
    """One entry per (model, supported input shape), as `coordinator models --json` prints it."""
    from fedge.models.state import prunable_names

    rows: list[dict[str, object]] = []
    for name in MODELS:
        for shape in SUPPORTED_INPUT_SHAPES:
            model = build(ModelSpec(name=name, input_shape=shape))
            params = dict(model.named_parameters())
            rows.append({
                "name": name,
                "input_shape": list(shape),
                "params": parameter_count(model),
                "prunable": sum(params[n].numel() for n in prunable_names(model)),
                "options": {"pan": ["off", "add", "mul"], "pan_a": "float >= 0", "pan_t": "float > 0"},
            })
    return rows
