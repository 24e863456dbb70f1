"""A user's own model (tests/plugin_models.py) through the model registry and every algorithm family, in process."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from fedge.algorithms import fedavg
from fedge.algorithms.base import ModelLayout
from fedge.algorithms.loop import TrainSettings, evaluate, train_local
from fedge.algorithms.task import evaluate_task, make_task
from fedge.models import ModelSpec, build, definition_hash, state_to_arrays
from fedge.plugins import PluginError
from fedge.simulation.inprocess import global_arrays, make_fleet, run_round
from tests.plugin_models import sensor_windows

PLUGIN = "tests.plugin_models:sensor_cnn"
SPEC = ModelSpec(name=PLUGIN, input_shape=(3, 32), num_classes=3, options={"width": 8})
ADAM = TrainSettings(epochs=1, batch_size=16, lr=5e-3, optimizer="adam")


def client_data(clients: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    data = []
    for index in range(clients):
        arrays = sensor_windows(count=96, seed=index)
        x = torch.from_numpy((arrays["train_x"] - 3.0) / 1.5)
        data.append((x, torch.from_numpy(arrays["train_y"])))
    return data


def test_what_the_algorithms_see_of_a_plugin_model() -> None:
    model = build(SPEC, seed=0)
    layout = ModelLayout.of(model)
    assert layout.prunable == ("body.stem.weight", "body.mix.conv.weight", "head.out.weight")  # gate opted out
    assert set(layout.batch_norm) == {"body.norm.weight", "body.norm.bias", "body.norm.running_mean",
                                      "body.norm.running_var", "body.norm.num_batches_tracked"}
    assert sorted(layout.layers) == ["body.mix.conv", "body.mix.group", "body.norm", "body.stem", "head.gate",
                                     "head.layer", "head.out"]  # modules with parameters of their own
    assert "channel_gain" in layout.names and not any("channel_gain" in n for g in layout.layers.values() for n in g)
    assert definition_hash(SPEC) == definition_hash(ModelSpec.from_dict(SPEC.as_dict()))
    wider = ModelSpec(name=PLUGIN, input_shape=(3, 32), num_classes=3, options={"width": 10})
    assert definition_hash(wider) != definition_hash(SPEC)


def test_pans_on_a_plugin_model_and_a_one_line_error_without_encodings() -> None:
    plain = build(SPEC, seed=0)
    with_pan = build(ModelSpec(**{**SPEC.__dict__, "pan": "add", "pan_a": 0.5}), seed=0)
    x = torch.randn(4, 3, 32)
    plain.eval(), with_pan.eval()
    assert not torch.allclose(plain(x), with_pan(x))
    with pytest.raises(ValueError, match="no position-encoding layers"):
        build(ModelSpec(name="tests.plugin_models:tabular_mlp", input_shape=(3, 32), num_classes=3, pan="add"))


@pytest.mark.parametrize(("name", "message"), [
    ("tests.plugin_models:not_a_module", "not a torch.nn.Module"),
    ("tests.plugin_models:raises", "needs options.width"),
    ("tests.plugin_models:missing", "has no missing"),
    ("tests.no_such_module:f", "cannot import tests.no_such_module"),
    ("no-such-entry-point", "unknown model 'no-such-entry-point'"),
])
def test_a_bad_plugin_is_one_line(name: str, message: str) -> None:
    with pytest.raises((PluginError, ValueError), match=message) as info:
        build(ModelSpec(name=name, input_shape=(3, 32), num_classes=3))
    assert "\n" not in str(info.value)


ALGORITHMS = [("fedavg", {}), ("scaffold", {}), ("dssa-fedprox", {"sparsity": 0.5}), ("fedbn", {}),
              ("ef-fedprox", {"keep": 0.3, "value_dtype": "ternary"}), ("pfedla", {})]


@pytest.mark.parametrize(("name", "options"), ALGORITHMS)
def test_every_algorithm_family_trains_the_plugin_model(name: str, options: dict[str, Any]) -> None:
    data = client_data()
    fleet = make_fleet(name, options, SPEC, clients=3, seed=0)
    before = state_to_arrays(fleet.models[0])
    uploads: list[set[str]] = []
    for client in fleet.clients:
        original = client.make_update

        def record(round_number, model, stats, _original=original):  # type: ignore[no-untyped-def]
            payload = _original(round_number, model, stats)
            for group in payload.groups.values():
                uploads.append(set(group.dense) | set(group.sparse.names if group.sparse else ()))
            return payload

        client.make_update = record
    replicas: list[bool] = []

    def replica_is_public(index: int, _payload: Any, model: torch.nn.Module) -> None:
        if name == "ef-fedprox":  # after each on_receive, bit for bit
            public = fleet.server.public
            replicas.append(all(np.array_equal(fleet.clients[index].start[k], public[k]) and
                                np.array_equal(state_to_arrays(model)[k], public[k]) for k in public))

    for round_number in (1, 2, 3):
        run_round(fleet, round_number, data, ADAM, seed=0, participants=[0, 1] if round_number == 2 else None,
                  inspect=replica_is_public)
    for model in fleet.models:
        arrays = state_to_arrays(model)
        assert arrays.keys() == before.keys()
        assert all(np.isfinite(a).all() for a in arrays.values() if a.dtype.kind == "f")
        assert any(not np.array_equal(arrays[k], before[k]) for k in before)
    if name == "fedbn":
        assert uploads and all(not (names & set(ModelLayout.of(fleet.models[0]).batch_norm)) for names in uploads)
    if name == "ef-fedprox":
        assert replicas == [True] * 8
    if name == "dssa-fedprox":
        masked = [names for names in uploads if "body.stem.weight" in names]
        assert masked, "the prunable conv weights travel"
    if name == "pfedla":
        assert len(fleet.server.layer_names) == 7
    else:
        merged = global_arrays(fleet) if name not in ("fedbn",) else None
        if merged is not None:
            assert set(merged) <= set(before)


def test_a_regression_task_learns_a_synthetic_target() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 3, 32)).astype(np.float32)
    y = np.stack([x[:, 0].mean(1), x[:, 1].std(1)], axis=1).astype(np.float32)
    spec = ModelSpec(name="tests.plugin_models:sensor_regressor", input_shape=(3, 32), num_classes=2)
    model = build(spec, seed=0)
    settings = TrainSettings(epochs=1, batch_size=32, lr=5e-3, optimizer="adam", loss="mse")
    task = make_task("mse")
    inputs, targets = torch.from_numpy(x), torch.from_numpy(y)
    first = evaluate_task(model, inputs, targets, task)
    for epoch in range(8):
        train_local(model, fedavg.Client(fedavg.Config(), 0), inputs, targets, settings, seed=epoch)
    last = evaluate_task(model, inputs, targets, task)
    assert last["mse"] < 0.5 * first["mse"] and last["accuracy"] is None and last["mae"] is not None
    assert last["loss"] == pytest.approx(last["mse"], rel=1e-5)


def test_classification_metrics_and_multilabel_metrics() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0], [0.0, 2.0]])
    labels = torch.tensor([0, 1, 1, 1])
    found = make_task().metrics(logits, labels)
    assert found["accuracy"] == 0.75 and found["f1_macro"] == pytest.approx((2 / 3 + 0.8) / 2)
    assert found["loss"] == pytest.approx(evaluate(torch.nn.Identity(), logits, labels)[1], rel=1e-6)
    multi = make_task("bce").metrics(torch.tensor([[1.0, -1.0], [1.0, 1.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    assert multi["exact_match"] == 0.5 and multi["label_accuracy"] == 0.75 and multi["accuracy"] is None
    weighted = make_task("cross_entropy", (1.0, 3.0)).loss(logits, labels)
    assert float(weighted) != pytest.approx(found["loss"])


def test_losses_that_do_not_fit_the_labels_are_one_line() -> None:
    outputs = torch.zeros(4, 3)
    with pytest.raises(ValueError, match="takes float32 targets of the output's shape"):
        make_task("mse").check(outputs, torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="takes int64 class labels"):
        make_task().check(outputs, torch.zeros(4, 3))
    with pytest.raises(ValueError, match="outputs 3 scores per sample but the data has class 5"):
        make_task().check(outputs, torch.tensor([0, 1, 5, 2]))
    assert float(make_task("tests.plugin_models:sum_loss", targets_are_classes=False).loss(
        outputs, torch.ones(4, 3))) == 1.0


def test_a_plugin_model_exports_to_onnx(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fedge.models.export import export_onnx, onnx_max_abs_difference

    model = build(ModelSpec(**{**SPEC.__dict__, "pan": "mul", "pan_a": 0.2}), seed=0)
    path = tmp_path / "sensor.onnx"
    export_onnx(model, SPEC.input_shape, path, definition_hash(SPEC))
    batch = np.random.default_rng(0).standard_normal((5, *SPEC.input_shape)).astype(np.float32)
    assert onnx_max_abs_difference(model, path, batch) < 1e-4
