"""The PAN shuffle test (docs/algorithms.md 5.3): permute hidden neurons consistently and measure how the output moves.

Holds the official shuffle-permutation generator, ``hidden_layers`` (which hidden layers a sequential network has and
who consumes each), ``permute_hidden`` (applies one permutation per hidden layer in place: rows of W_l and b_l, the
layer's BatchNorm weight, bias and running statistics, the columns of W_{l+1}, and whole H*W column blocks where a conv
output is flattened into a Linear layer), ``shuffle_error`` and ``shuffle_mlp``, the network of the 5.4 dry run.
Position encodings are never permuted: they are tied to positions, which is the point of PANs. Knows nothing of
algorithms, data or the wire.

Decisions where the papers are silent (docs/algorithms.md records them too):
- The generator draws j before the swap coin in every step, both from one ``numpy.random.Generator``; ratio = 1 and
  P_sf = 1 make it a Fisher-Yates shuffle, i.e. the "full random permutation" of the 5.4 checks.
- Hidden layers are found by registration order of Conv/Linear modules (every one but the last is hidden; its
  consumer is the next one; a BatchNorm registered between them belongs to the first). This covers the sequential
  networks Fedge ships; residual networks are out of scope and rejected by the shape checks.
- Err is computed on the network output (the logits, J_L = number of classes) in eval mode: per sample the L2 norm of
  the difference divided by J_L, then the batch mean.
- The dry-run network: input 64, four hidden layers of 64, 10 outputs, He (Kaiming normal, fan-in, ReLU) weights and
  zero biases; its output layer is not encoded.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedge.models.pan import PanSpec, position_encoding

AFFINE = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def shuffle_permutation(width: int, rng: np.random.Generator, ratio: float = 1.0, prob: float = 1.0) -> np.ndarray:
    """The official generator: from the identity, for i = 0..J-1 pick j in [i, min(J, i + floor(r J) + 1)) and
    swap positions i and j with probability P_sf."""
    if width < 1 or not 0 <= ratio <= 1 or not 0 <= prob <= 1:
        raise ValueError(f"need width >= 1 and ratio, prob in [0, 1]; got {width}, {ratio}, {prob}")
    perm = np.arange(width)
    span = math.floor(ratio * width)
    for i in range(width):
        j = int(rng.integers(i, min(width, i + span + 1)))
        if rng.random() < prob:
            perm[i], perm[j] = perm[j], perm[i]
    return perm


@dataclass(frozen=True)
class HiddenLayer:
    """One hidden layer: its affine module, its BatchNorm (if any), the module consuming it and the flatten block."""

    affine: str
    norm: str | None
    consumer: str
    width: int
    block: int


def _width(module: nn.Module) -> int:
    return module.out_features if isinstance(module, nn.Linear) else int(module.out_channels)  # type: ignore[arg-type]


def _fan_in(module: nn.Module) -> int:
    return module.in_features if isinstance(module, nn.Linear) else int(module.in_channels)  # type: ignore[arg-type]


def hidden_layers(model: nn.Module) -> list[HiddenLayer]:
    """The hidden layers of a sequential network, in order (see the module docstring for how they are found)."""
    affine: list[tuple[str, nn.Module]] = []
    norms: dict[str, str] = {}
    for name, module in model.named_modules():
        if isinstance(module, AFFINE):
            affine.append((name, module))
        elif isinstance(module, _BatchNorm) and affine:
            norms.setdefault(affine[-1][0], name)
    layers = []
    for (name, module), (next_name, consumer) in zip(affine, affine[1:], strict=False):
        width, fan_in = _width(module), _fan_in(consumer)
        if fan_in % width or (not isinstance(consumer, nn.Linear) and fan_in != width):
            raise ValueError(f"{next_name} does not consume {name} directly: {fan_in} inputs for width {width}")
        norm = norms.get(name)
        if norm is not None and dict(model.named_modules())[norm].num_features != width:
            raise ValueError(f"{norm} does not normalise {name}")
        layers.append(HiddenLayer(name, norm, next_name, width, fan_in // width))
    return layers


def random_permutations(model: nn.Module, rng: np.random.Generator, ratio: float = 1.0,
                        prob: float = 1.0) -> dict[str, np.ndarray]:
    """One permutation per hidden layer (keyed by the affine module's name) from the official generator."""
    return {layer.affine: shuffle_permutation(layer.width, rng, ratio, prob) for layer in hidden_layers(model)}


@torch.no_grad()
def permute_hidden(model: nn.Module, perms: Mapping[str, np.ndarray]) -> None:
    """Apply the permutations in place: neuron j of a layer becomes its old neuron perms[layer][j]."""
    modules = dict(model.named_modules())
    for layer in hidden_layers(model):
        if layer.affine not in perms:
            continue
        perm = torch.as_tensor(np.asarray(perms[layer.affine]), dtype=torch.long)
        if sorted(perm.tolist()) != list(range(layer.width)):
            raise ValueError(f"the permutation for {layer.affine} is not a permutation of {layer.width}")
        owners = [modules[layer.affine]] + ([modules[layer.norm]] if layer.norm else [])
        for owner in owners:
            for tensor in list(owner.parameters(recurse=False)) + list(owner.buffers(recurse=False)):
                if tensor.dim() >= 1 and tensor.shape[0] == layer.width:
                    tensor.copy_(tensor[perm])
        columns = (perm[:, None] * layer.block + torch.arange(layer.block)[None, :]).reshape(-1)
        weight = modules[layer.consumer].weight
        weight.copy_(weight[:, columns])


@torch.no_grad()
def shuffle_error(model: nn.Module, perms: Mapping[str, np.ndarray], inputs: torch.Tensor) -> float:
    """Err = mean over the batch of ||h_L,sf - h_L|| / J_L, with h_L the network output (eval mode)."""
    shuffled = copy.deepcopy(model)
    permute_hidden(shuffled, perms)
    model.eval()
    shuffled.eval()
    reference, moved = model(inputs), shuffled(inputs)
    return float(((moved - reference).norm(dim=1) / reference.shape[1]).mean())


class ShuffleMLP(nn.Module):
    """Linear -> [position encoding] -> ReLU for each hidden layer, then a plain Linear output."""

    def __init__(self, input_dim: int, widths: Sequence[int], num_classes: int, pan: PanSpec) -> None:
        super().__init__()
        sizes = [input_dim, *widths]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:], strict=False))
        self.encodings = nn.ModuleList(position_encoding(width, pan) for width in widths)
        self.out = nn.Linear(sizes[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for linear, encoding in zip(self.hidden, self.encodings, strict=True):
            x = torch.relu(encoding(linear(x)))
        output: torch.Tensor = self.out(x)
        return output


def shuffle_mlp(pan: PanSpec, seed: int, input_dim: int = 64, widths: Sequence[int] = (64, 64, 64, 64),
                num_classes: int = 10, dtype: torch.dtype = torch.float32) -> ShuffleMLP:
    """The 5.4 dry-run network with He-normal weights and zero biases drawn from ``seed``."""
    model = ShuffleMLP(input_dim, widths, num_classes, pan).to(dtype)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear):
                std = math.sqrt(2.0 / module.in_features)
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator, dtype=dtype) * std)
                module.bias.zero_()
    return model


PAN_MODES = {"add": "PAN+", "mul": "PAN∘"}


def shuffle_errors(amplitudes: Sequence[float], seeds: int, batch: int = 512) -> dict[str, np.ndarray]:
    """The shuffle test's errors, Err[mode][seed, a], for both PAN modes, every seed and amplitude: one network
    and one set of permutations per seed serve every amplitude and mode (docs/algorithms.md 5.4)."""
    errors = {mode: np.zeros((seeds, len(amplitudes))) for mode in PAN_MODES}
    for seed in range(seeds):
        inputs = torch.randn(batch, 64, generator=torch.Generator().manual_seed(10_000 + seed))
        perms = random_permutations(shuffle_mlp(PanSpec(), seed), np.random.default_rng(seed))
        for mode in PAN_MODES:
            for column, amplitude in enumerate(amplitudes):
                model = shuffle_mlp(PanSpec(mode, amplitude, 1.0), seed)
                errors[mode][seed, column] = shuffle_error(model, perms, inputs)
    return errors
