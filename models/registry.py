"""The model registry: names -> constructors, the supported input shapes, and a hash of a model definition.

A model is named by (name, input shape, classes, PAN options); the same tuple builds the same architecture on the
coordinator and on every device, and ``definition_hash`` lets the hello message refuse a mismatch. Knows nothing of
algorithms, data or the wire.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, cast

import torch
from torch import nn

from fedge.models.nets import MLP, PaperCNN
from fedge.models.pan import PanSpec


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to build the same network anywhere."""

    name: str = "cnn"
    input_shape: tuple[int, int, int] = (1, 28, 28)
    num_classes: int = 10
    pan: str = "off"
    pan_a: float = 0.1
    pan_t: float = 1.0

    @property
    def pan_spec(self) -> PanSpec:
        return PanSpec(self.pan, self.pan_a, self.pan_t)

    def as_dict(self) -> dict[str, Any]:
        """The JSON-ready form the welcome and the device's committed model carry."""
        return {"name": self.name, "input_shape": list(self.input_shape), "num_classes": self.num_classes,
                "pan": self.pan, "pan_a": self.pan_a, "pan_t": self.pan_t}

    @classmethod
    def from_dict(cls, meta: Mapping[str, Any]) -> ModelSpec:
        """The inverse of ``as_dict``."""
        shape = cast("tuple[int, int, int]", tuple(int(d) for d in meta["input_shape"]))
        return cls(name=str(meta["name"]), input_shape=shape, num_classes=int(meta["num_classes"]),
                   pan=str(meta["pan"]), pan_a=float(meta["pan_a"]), pan_t=float(meta["pan_t"]))


Builder = Callable[[tuple[int, int, int], int, PanSpec], nn.Module]

MODELS: dict[str, Builder] = {
    "cnn": lambda shape, classes, pan: PaperCNN(shape, classes, pan, batch_norm=False),
    "cnn-bn": lambda shape, classes, pan: PaperCNN(shape, classes, pan, batch_norm=True),
    "mlp": lambda shape, classes, pan: MLP(shape, classes, pan, batch_norm=False),
}

# Input shapes of the datasets Fedge loads: Fashion-MNIST (1x28x28), CIFAR-10 and SVHN (3x32x32).
SUPPORTED_INPUT_SHAPES: tuple[tuple[int, int, int], ...] = ((1, 28, 28), (3, 32, 32))


def build(spec: ModelSpec, seed: int | None = None) -> nn.Module:
    """Construct the network (initialised from ``seed`` when given, without touching the global RNG); raises
    ValueError naming the problem for an unknown name or bad PAN options."""
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return build(spec)
    if spec.name not in MODELS:
        raise ValueError(f"unknown model {spec.name!r}; known models: {', '.join(sorted(MODELS))}")
    if len(spec.input_shape) != 3 or min(spec.input_shape) < 1:
        raise ValueError(f"input shape must be (C, H, W) with positive sizes, got {spec.input_shape}")
    return MODELS[spec.name](tuple(spec.input_shape), spec.num_classes, spec.pan_spec)  # type: ignore[arg-type]


def definition_hash(spec: ModelSpec) -> str:
    """A short stable hash of the model definition (name, shape, classes, PAN options and parameter layout)."""
    model = build(spec)
    layout = [(name, list(t.shape), str(t.dtype)) for name, t in model.state_dict().items()]
    blob = json.dumps({"spec": asdict(spec), "layout": layout}, sort_keys=True).encode()
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
