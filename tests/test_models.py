"""Models: parameter counts, shapes, PAN options, state <-> arrays, tensor classes, ONNX parity."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedge import models
from fedge.models import ModelSpec, build
from fedge.models.export import export_onnx, onnx_max_abs_difference


@pytest.mark.parametrize(("shape", "expected"), [((3, 32, 32), 1_147_466), ((1, 28, 28), 688_138)])
def test_paper_cnn_has_the_papers_parameter_count(shape: tuple[int, int, int], expected: int) -> None:
    model = build(ModelSpec("cnn", shape))
    assert models.parameter_count(model) == expected
    prunable = sum(dict(model.named_parameters())[n].numel() for n in models.prunable_names(model))
    if shape == (3, 32, 32):
        assert prunable == 1_146_720 and expected - prunable == 746


def test_mlp_is_flatten_200_200_classes() -> None:
    model = build(ModelSpec("mlp", (1, 28, 28)))
    assert models.parameter_count(model) == 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10


@pytest.mark.parametrize("name", sorted(models.MODELS))
@pytest.mark.parametrize("shape", models.SUPPORTED_INPUT_SHAPES)
def test_forward_shape(name: str, shape: tuple[int, int, int]) -> None:
    out = build(ModelSpec(name, shape, num_classes=7))(torch.randn(3, *shape))
    assert out.shape == (3, 7)


def test_cnn_bn_has_batch_norm_after_every_conv_and_the_hidden_fc() -> None:
    model = build(ModelSpec("cnn-bn", (3, 32, 32)))
    bn = models.batch_norm_names(model)
    assert {n.split(".")[0] for n in bn} == {"bn1", "bn2", "bn3", "bn4"}
    assert all(n.split(".")[0].startswith("bn") for n in bn)
    assert models.parameter_count(model) == 1_147_466 + 2 * (32 + 64 + 128 + 512)


def test_unknown_model_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown model 'resnet'"):
        build(ModelSpec("resnet"))


@pytest.mark.parametrize("width_and_t", [(32, 16.0), (32, 32.0), (64, 32.0), (64, 64.0)])
def test_degenerate_pan_period_is_rejected(width_and_t: tuple[int, float]) -> None:
    _, t = width_and_t
    with pytest.raises(ValueError, match="degenerate"):
        build(ModelSpec("cnn", (1, 28, 28), pan="add", pan_t=t))


def test_pan_encoding_is_not_state_and_is_identical_everywhere() -> None:
    a = build(ModelSpec("mlp", (1, 28, 28), pan="mul", pan_a=0.2))
    b = build(ModelSpec("mlp", (1, 28, 28), pan="mul", pan_a=0.2))
    assert not any("encoding" in k for k in a.state_dict())
    assert set(a.state_dict()) == set(build(ModelSpec("mlp", (1, 28, 28))).state_dict())
    for (na, ea), (nb, eb) in zip(a.named_buffers(), b.named_buffers(), strict=True):
        assert na == nb and torch.equal(ea, eb)


def test_pan_sits_after_batch_norm_and_before_relu() -> None:
    model = build(ModelSpec("cnn-bn", (1, 28, 28), pan="mul", pan_a=0.5)).eval()
    x = torch.randn(2, 1, 28, 28)
    seen: dict[str, torch.Tensor] = {}
    model.bn1.register_forward_hook(lambda m, i, o: seen.__setitem__("bn", o.detach()))
    model.pe1.register_forward_hook(lambda m, i, o: seen.__setitem__("pe", o.detach()))
    model(x)
    e = model.pe1.encoding.view(1, -1, 1, 1)
    assert torch.allclose(seen["pe"], seen["bn"] * e)


def test_hidden_permutation_invariance_holds_only_without_pan() -> None:
    torch.manual_seed(0)
    x = torch.randn(16, 1, 28, 28)
    perm = torch.randperm(200)
    for pan_a, invariant in ((0.0, True), (0.3, False)):
        model = build(ModelSpec("mlp", (1, 28, 28), pan="add", pan_a=pan_a)).eval()
        before = model(x)
        with torch.no_grad():
            model.fc1.weight.copy_(model.fc1.weight[perm])
            model.fc1.bias.copy_(model.fc1.bias[perm])
            model.fc2.weight.copy_(model.fc2.weight[:, perm])
        after = model(x)
        assert torch.allclose(before, after, atol=1e-5) == invariant


def test_state_arrays_round_trip_bit_exact() -> None:
    source = build(ModelSpec("cnn-bn", (1, 28, 28)))
    source.train()
    source(torch.randn(4, 1, 28, 28))  # move BN running stats
    arrays = models.state_to_arrays(source)
    target = build(ModelSpec("cnn-bn", (1, 28, 28)))
    models.arrays_to_state(target, arrays)
    for name, value in target.state_dict().items():
        assert np.array_equal(value.numpy(), arrays[name])
    assert arrays["bn1.num_batches_tracked"].dtype == np.int64


def test_arrays_with_wrong_shape_or_name_are_refused() -> None:
    model = build(ModelSpec("mlp", (1, 28, 28)))
    with pytest.raises(ValueError, match="fc1.bias"):
        models.arrays_to_state(model, {"fc1.bias": np.zeros(3, np.float32)}, strict=False)
    with pytest.raises(KeyError):
        models.arrays_to_state(model, {"nope": np.zeros(3, np.float32)}, strict=False)


def test_describe_models_lists_every_model_and_shape() -> None:
    rows = models.describe_models()
    assert len(rows) == len(models.MODELS) * len(models.SUPPORTED_INPUT_SHAPES)
    cnn = next(r for r in rows if r["name"] == "cnn" and r["input_shape"] == [3, 32, 32])
    assert cnn["params"] == 1_147_466 and cnn["prunable"] == 1_146_720
    assert set(rows[0]) == {"name", "input_shape", "params", "prunable", "options"}


def test_definition_hash_differs_with_options() -> None:
    base = models.definition_hash(ModelSpec("cnn", (1, 28, 28)))
    assert base == models.definition_hash(ModelSpec("cnn", (1, 28, 28)))
    assert base != models.definition_hash(ModelSpec("cnn", (1, 28, 28), pan="add"))
    assert base != models.definition_hash(ModelSpec("cnn", (3, 32, 32)))


@pytest.mark.parametrize("spec", [
    ModelSpec("cnn", (3, 32, 32)), ModelSpec("cnn", (1, 28, 28)), ModelSpec("mlp", (1, 28, 28)),
    ModelSpec("cnn-bn", (3, 32, 32), pan="mul", pan_a=0.1), ModelSpec("mlp", (1, 28, 28), pan="add", pan_a=0.2),
], ids=lambda s: f"{s.name}-{s.input_shape[0]}-{s.pan}")
def test_onnx_export_matches_torch(tmp_path, spec: ModelSpec) -> None:
    pytest.importorskip("onnxruntime")
    torch.manual_seed(1)
    model = build(spec)
    if spec.name == "cnn-bn":
        model.train()
        model(torch.randn(8, *spec.input_shape))
    path = export_onnx(model, spec.input_shape, tmp_path / "m.onnx")
    batch = np.random.default_rng(0).standard_normal((5, *spec.input_shape)).astype(np.float32)
    assert onnx_max_abs_difference(model, path, batch) <= 1e-4


def test_a_model_spec_survives_its_json_form() -> None:
    import json

    spec = ModelSpec("cnn-bn", (3, 32, 32), num_classes=7, pan="mul", pan_a=0.2, pan_t=2.0)
    again = ModelSpec.from_dict(json.loads(json.dumps(spec.as_dict())))
    assert again == spec and models.definition_hash(again) == models.definition_hash(spec)
