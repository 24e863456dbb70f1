"""FLOP accounting: FlopCounterMode counted once and cached, the optimizer table checked against a dispatch trace,
verified update counts from parameter diffs, and the theoretical sparse figure."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from fedge.meter import (
    FlopCounter,
    ParamSnapshot,
    mask_elements,
    optimizer_flops_per_element,
    optimizer_step_flops,
)
from fedge.meter.flops import densities_from_masks, total_elements, trainable_elements

REFERENCE_FWD_BWD_B8 = 83_423_232  # docs/meter.md section 3.3, analytic == FlopCounterMode


class ReferenceCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(2048, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def test_reference_cnn_matches_the_analytic_count() -> None:
    model = ReferenceCNN()
    assert total_elements(model) == 268_650
    count = FlopCounter().forward_backward(model, (3, 32, 32), 8)
    assert count.total == REFERENCE_FWD_BWD_B8
    assert count.per_module["fc1"] == 4_194_304 + 8_388_608 and count.per_module["conv1"] == 2 * 7_077_888


def test_counted_once_per_shape_and_scaled_by_steps_with_a_partial_last_batch() -> None:
    model = ReferenceCNN()
    counter = FlopCounter()
    per_sample = REFERENCE_FWD_BWD_B8 // 8  # every counted kernel is linear in the batch for this model
    assert counter.training(model, (3, 32, 32), [8, 8, 8, 3]) == 3 * REFERENCE_FWD_BWD_B8 + 3 * per_sample
    assert counter.cached == 2
    counter.training(model, (3, 32, 32), [8] * 50)
    assert counter.cached == 2


def test_counting_leaves_training_state_untouched() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    FlopCounter().training(model, (4,), [5, 1])  # batch 1 with training BatchNorm falls back to eval mode
    assert torch.equal(torch.rand(3), expected)  # the RNG stream is as if nothing ran
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_a_masked_model_executes_the_same_dense_count() -> None:
    model = ReferenceCNN()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_((torch.rand_like(p) < 0.3).float())
    assert FlopCounter().forward_backward(model, (3, 32, 32), 8).total == REFERENCE_FWD_BWD_B8


@pytest.mark.parametrize(("config", "expected"), [
    (("sgd", {}), 2), (("sgd", {"momentum": 0.9}), 4), (("sgd", {"weight_decay": 1e-4}), 4),
    (("sgd", {"momentum": 0.9, "nesterov": True}), 6), (("sgd", {"momentum": 0.9, "weight_decay": 0.1,
                                                                "nesterov": True}), 8),
    (("adam", {}), 13), (("adamw", {"weight_decay": 0.01}), 14), (("adam", {"weight_decay": 0.01}), 15),
    (("adamw", {}), 13), (("adam", {"amsgrad": True}), 14)])
def test_optimizer_table(config: tuple[str, dict[str, float]], expected: int) -> None:
    name, options = config
    assert optimizer_flops_per_element(name, **options) == expected


def test_unknown_optimizer_is_unknown_not_guessed() -> None:
    with pytest.warns(UserWarning, match="no FLOP table entry"):
        assert optimizer_flops_per_element("lion") is None


class ElementwiseFlops(TorchDispatchMode):
    """Counts FLOPs of elementwise aten ops on N-element tensors under the convention of docs/meter.md section 3.4."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel = numel
        self.flops = 0
        self.unknown: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if not any(isinstance(a, torch.Tensor) and a.numel() == self.numel for a in args):
            return result
        name = func.overloadpacket.__name__.rstrip("_")
        if name in ("add", "sub"):
            self.flops += self.numel * (1 + (kwargs.get("alpha", 1) != 1))
        elif name in ("addcmul", "addcdiv"):
            self.flops += self.numel * (2 + (kwargs.get("value", 1) != 1))
        elif name == "lerp":
            self.flops += self.numel * 3
        elif name in ("mul", "div", "sqrt", "maximum"):
            self.flops += self.numel
        elif name not in ("clone", "detach", "copy", "zero", "_local_scalar_dense"):
            self.unknown.append(name)
        return result


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD([p], lr=0.1), lambda p: torch.optim.SGD([p], lr=0.1, momentum=0.9),
    lambda p: torch.optim.SGD([p], lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1),
    lambda p: torch.optim.Adam([p]), lambda p: torch.optim.Adam([p], weight_decay=0.1),
    lambda p: torch.optim.AdamW([p]), lambda p: torch.optim.AdamW([p], weight_decay=0.0),
    lambda p: torch.optim.AdamW([p], amsgrad=True)])
def test_table_equals_a_dispatch_trace_of_step(make) -> None:  # type: ignore[no-untyped-def]
    """A torch upgrade that changes the optimizer's arithmetic fails here loudly."""
    param = nn.Parameter(torch.randn(1000))
    optimizer = make(param)
    for _ in range(2):  # the second step is traced: SGD momentum buffers exist by then
        param.grad = torch.randn(1000)
        trace = ElementwiseFlops(1000)
        with trace:
            optimizer.step()
    assert trace.unknown == []
    assert optimizer_step_flops(optimizer) == trace.flops


def test_param_snapshot_catches_adam_moving_masked_weights() -> None:
    torch.manual_seed(0)
    model = nn.Linear(10, 10)
    mask = {"weight": (torch.rand(10, 10) < 0.3)}
    claim = mask_elements(model, mask)
    assert claim == int(mask["weight"].sum()) + 10  # bias unmasked
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    for step in range(3):
        optimizer.zero_grad()
        model(torch.randn(4, 10)).sum().backward()
        snapshot = ParamSnapshot(model)
        if step > 0:  # the first step is dense, then gradients are masked: Adam's moments still move weights
            model.weight.grad.mul_(mask["weight"])
        optimizer.step()
    assert snapshot.changed(model) > claim
    with torch.no_grad():  # re-masking after the step is what actually freezes them
        before = ParamSnapshot(model)
        frozen = before._before["weight"]
        model.weight.copy_(torch.where(mask["weight"], model.weight, frozen))
    assert before.changed(model) == 0
    assert before.changed_by_name(model) == {"weight": 0, "bias": 0}


def test_mask_elements_rejects_unknown_names_and_counts_trainable_only() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    model[1].bias.requires_grad_(False)
    assert trainable_elements(model) == 20 + 8
    assert mask_elements(model, {"0.weight": torch.eye(4)}) == 4 + 4 + 8
    with pytest.raises(KeyError):
        mask_elements(model, {"nope": torch.ones(1)})


def test_theoretical_sparse_scales_each_masked_layer() -> None:
    model = ReferenceCNN()
    counter = FlopCounter()
    dense = counter.forward_backward(model, (3, 32, 32), 8)
    masks = {"fc1.weight": torch.rand(128, 2048) < 0.25, "conv2.weight": torch.zeros(32, 16, 3, 3)}
    densities = densities_from_masks(masks)
    expected = dense.total - (1 - densities["fc1.weight"]) * dense.per_module["fc1"] - dense.per_module["conv2"]
    assert counter.theoretical_sparse(model, (3, 32, 32), [8, 8], densities) == round(2 * expected)
    assert counter.theoretical_sparse(model, (3, 32, 32), [8], {}) == dense.total
    with pytest.raises(ValueError):
        counter.theoretical_sparse(model, (3, 32, 32), [8], {"fc1.weight": 1.5})
