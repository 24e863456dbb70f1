"""Position-aware neurons and the shuffle test (docs/algorithms.md 5.3-5.4, checks 1-6), on small MLPs and CNNs."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedge import codec
from fedge.algorithms import registry
from fedge.models import ModelSpec, PanSpec, build, state_to_arrays
from fedge.models.shuffle import (
    HiddenLayer,
    hidden_layers,
    permute_hidden,
    random_permutations,
    shuffle_error,
    shuffle_mlp,
    shuffle_permutation,
)
from fedge.simulation.inprocess import through_codec
from tests.benchmark_scripts import run_script

AMPLITUDES = (0.01, 0.05, 0.1, 0.25, 0.5)
SEEDS = (0, 1, 2)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def inputs(seed: int, dtype: torch.dtype = torch.float32, shape: tuple[int, ...] = (256, 64)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(1000 + seed), dtype=dtype)


def max_difference(model: torch.nn.Module, perms: dict[str, np.ndarray], x: torch.Tensor) -> float:
    shuffled = copy.deepcopy(model)
    permute_hidden(shuffled, perms)
    model.eval()
    shuffled.eval()
    with torch.no_grad():
        return float((model(x) - shuffled(x)).abs().max())


def on_grid(x: torch.Tensor) -> torch.Tensor:
    """x rounded to multiples of 1/64, so that float64 sums of products of such values are exact in any order."""
    return torch.round(x * 64) / 64


def weights_on_grid(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(on_grid(parameter))


def randomise_batch_norm(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.startswith("bn") and tensor.is_floating_point():
                tensor.copy_(torch.rand(tensor.shape, generator=generator) + 0.5)


def errors(mode: str, seed: int) -> list[float]:
    x = inputs(seed)
    perms = random_permutations(shuffle_mlp(PanSpec(), seed), np.random.default_rng(seed))
    return [shuffle_error(shuffle_mlp(PanSpec(mode, a, 1.0), seed), perms, x) for a in AMPLITUDES]


def test_the_official_generator() -> None:
    rng = np.random.default_rng(0)
    for width in (1, 2, 7, 64):
        perm = shuffle_permutation(width, rng)
        assert sorted(perm.tolist()) == list(range(width))
    assert np.array_equal(shuffle_permutation(64, rng, ratio=0.0), np.arange(64))
    assert np.array_equal(shuffle_permutation(64, rng, prob=0.0), np.arange(64))
    partial = [np.mean(shuffle_permutation(64, rng, ratio=0.1, prob=0.1) != np.arange(64)) for _ in range(200)]
    full = [np.mean(shuffle_permutation(64, rng) != np.arange(64)) for _ in range(200)]
    assert 0 < np.mean(partial) < 0.3 and np.mean(full) > 0.95
    fixed = np.mean([shuffle_permutation(8, rng)[3] for _ in range(4000)])
    assert abs(fixed - 3.5) < 0.15
    with pytest.raises(ValueError):
        shuffle_permutation(8, rng, ratio=1.5)


def test_hidden_layers_of_the_shipped_networks() -> None:
    cnn = build(ModelSpec(name="cnn-bn", input_shape=(3, 16, 16), num_classes=10))
    assert hidden_layers(cnn) == [
        HiddenLayer("conv1", "bn1", "conv2", 32, 1), HiddenLayer("conv2", "bn2", "conv3", 64, 1),
        HiddenLayer("conv3", "bn3", "fc1", 128, 4), HiddenLayer("fc1", "bn4", "fc2", 512, 1)]
    mlp = build(ModelSpec(name="mlp", input_shape=(1, 8, 8)))
    assert [(h.affine, h.norm, h.consumer) for h in hidden_layers(mlp)] == [("fc1", None, "fc2"),
                                                                           ("fc2", None, "fc3")]


@pytest.mark.parametrize("mode", ["off", "add", "mul"])
def test_a_zero_leaves_every_hidden_permutation_invisible(mode: str) -> None:
    for seed in SEEDS:
        model = shuffle_mlp(PanSpec(mode, 0.0, 1.0), seed)
        perms = random_permutations(model, np.random.default_rng(seed))
        assert max_difference(model, perms, inputs(seed)) < 1e-5
        wide = shuffle_mlp(PanSpec(mode, 0.0, 1.0), seed, dtype=torch.float64)
        assert max_difference(wide, perms, inputs(seed, torch.float64)) < 1e-12
        weights_on_grid(wide)
        assert max_difference(wide, perms, on_grid(inputs(seed, torch.float64))) == 0.0
    for name in ("cnn-bn", "cnn", "mlp"):
        torch.manual_seed(3)
        net = build(ModelSpec(name=name, input_shape=(3, 16, 16), num_classes=10, pan=mode, pan_a=0.0))
        randomise_batch_norm(net, 3)
        perms = random_permutations(net, np.random.default_rng(3))
        assert max_difference(net, perms, inputs(3, shape=(8, 3, 16, 16))) < 1e-5
        assert all(not np.array_equal(p, np.arange(len(p))) for p in perms.values())


def test_a_positive_breaks_invariance_monotonically() -> None:
    for mode in ("add", "mul"):
        for seed in SEEDS:
            curve = errors(mode, seed)
            assert curve[0] > 1e-4
            assert all(a < b for a, b in zip(curve, curve[1:], strict=False)), (mode, seed, curve)
    plus = np.mean([errors("add", seed) for seed in SEEDS], axis=0)
    assert 0.02 < plus[AMPLITUDES.index(0.1)] < 0.15


def test_multiplicative_pans_are_more_sensitive_and_increasingly_so() -> None:
    plus = np.mean([errors("add", seed) for seed in SEEDS], axis=0)
    times = np.mean([errors("mul", seed) for seed in SEEDS], axis=0)
    for seed in SEEDS:
        per_seed_plus, per_seed_times = errors("add", seed), errors("mul", seed)
        for amplitude in (0.05, 0.1, 0.25):
            column = AMPLITUDES.index(amplitude)
            assert per_seed_times[column] > per_seed_plus[column]
    ratio = [times[AMPLITUDES.index(a)] / plus[AMPLITUDES.index(a)] for a in (0.05, 0.1, 0.25, 0.5)]
    assert all(a < b for a, b in zip(ratio, ratio[1:], strict=False)), ratio


@pytest.mark.parametrize("mode", ["add", "mul"])
def test_encoding_preserving_permutations_stay_invisible(mode: str) -> None:
    model = shuffle_mlp(PanSpec(mode, 0.25, 1.0), seed=4)
    mirror = {layer.affine: (layer.width // 2 - np.arange(layer.width)) % layer.width
              for layer in hidden_layers(model)}
    for layer in model.encodings:
        assert torch.allclose(layer.encoding, layer.encoding[torch.as_tensor(mirror["hidden.0"])], atol=1e-6)
    assert max_difference(model, mirror, inputs(4)) < 1e-5
    generic = random_permutations(model, np.random.default_rng(4))
    assert max_difference(model, generic, inputs(4)) > 1e-3


def test_the_encoding_is_not_state() -> None:
    spec = ModelSpec(name="cnn-bn", input_shape=(1, 8, 8), num_classes=4, pan="mul", pan_a=0.3)
    torch.manual_seed(1)
    first = build(spec)
    torch.manual_seed(2)
    second = build(spec)
    encodings = {n: b for n, b in first.named_buffers() if n.endswith("encoding")}
    assert len(encodings) == 4
    assert not any(n.endswith("encoding") for n in first.state_dict())
    assert not any(n.endswith("encoding") for n in state_to_arrays(first))
    for name, buffer in second.named_buffers():
        if name.endswith("encoding"):
            assert torch.equal(buffer, encodings[name])
    assert not torch.equal(first.conv1.weight, second.conv1.weight)
    server = registry.make_server("fedavg", {}, state_to_arrays(first), _context(first))
    payload = server.downlink(1, 0)
    if hasattr(codec, "encode"):
        payload = through_codec(payload, "task", 1)[0]
    names = {n for group in payload.groups.values() for n in group.dense}
    assert names == set(first.state_dict()) and not any("encoding" in n for n in names)
    before = {n: b.clone() for n, b in first.named_buffers() if n.endswith("encoding")}
    permute_hidden(first, random_permutations(first, np.random.default_rng(0)))
    assert all(torch.equal(b, before[n]) for n, b in first.named_buffers() if n.endswith("encoding"))


def _context(model: torch.nn.Module):  # type: ignore[no-untyped-def]
    from fedge.algorithms.base import ModelLayout, ServerContext

    return ServerContext(num_clients=1, layout=ModelLayout.of(model))


def test_the_encoding_multiplies_the_post_batch_norm_activation() -> None:
    spec = ModelSpec(name="cnn-bn", input_shape=(1, 8, 8), num_classes=4, pan="mul", pan_a=0.5)
    torch.manual_seed(5)
    model = build(spec)
    randomise_batch_norm(model, 5)
    model.eval()
    x = inputs(5, shape=(6, 1, 8, 8))

    def by_hand(after_norm: bool) -> torch.Tensor:
        h = x
        blocks = [("conv1", "bn1", "pe1"), ("conv2", "bn2", "pe2"), ("conv3", "bn3", "pe3"), ("fc1", "bn4", "pe4")]
        for affine, norm, encoding in blocks:
            layer, bn = getattr(model, affine), getattr(model, norm)
            if affine == "fc1":
                h = torch.flatten(h, 1)
            z = F.conv2d(h, layer.weight, layer.bias, padding=1) if affine.startswith("conv") else \
                h @ layer.weight.T + layer.bias
            shape = (1, -1) + (1,) * (z.dim() - 2)
            e = getattr(model, encoding).encoding.view(shape)
            expected_e = (1 + 0.5 * torch.sin(2 * math.pi * torch.arange(z.shape[1]) / z.shape[1])).view(shape)
            assert torch.allclose(e, expected_e)
            z = z if after_norm else z * e
            y = (z - bn.running_mean.view(shape)) / torch.sqrt(bn.running_var.view(shape) + bn.eps)
            y = y * bn.weight.view(shape) + bn.bias.view(shape)
            h = torch.relu(y * e if after_norm else y)
            if affine.startswith("conv"):
                h = F.max_pool2d(h, 2)
        return h @ model.fc2.weight.T + model.fc2.bias

    with torch.no_grad():
        output = model(x)
        assert torch.allclose(output, by_hand(after_norm=True), atol=1e-5)
        assert not torch.allclose(output, by_hand(after_norm=False), atol=1e-3)


def test_the_shuffle_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_script("pan_shuffle", "--out", str(tmp_path), "--seeds", "1", "--amplitudes", "0,0.1") == 0
    printed = capsys.readouterr().out
    assert "PAN+" in printed and "PAN∘" in printed
    assert (tmp_path / "pan_shuffle.png").stat().st_size > 1000
    assert (tmp_path / "pan_shuffle.json").exists()
