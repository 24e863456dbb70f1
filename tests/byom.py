"""Bring-your-own-model helpers: the repository and its worked example (examples/tabular), a session file's keys as
``--set`` overrides, the sensor model plugin of tests/plugin_models.py, fast session settings, a sensor shard on disk,
a coordinator's welcome for the plugin model, and an agent (not connected) that reads the shard."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedge import codec
from fedge.coordinator.config import tomllib
from fedge.edge_agent.agent import Agent
from fedge.edge_agent.config import AgentSettings
from fedge.fldata import ClientShard, write_shard

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tabular"
PLUGIN = "tests.plugin_models:sensor_cnn"
FAST = ["--set", "fleet.heartbeat_s=0.5", "--set", "fleet.liveness_s=6.0", "--set", "run.export_onnx=false", "--quiet"]


def sensor_shard(path: Path, classes: int = 3) -> Path:
    from tests.plugin_models import sensor_windows

    arrays = sensor_windows(count=60, classes=classes)
    write_shard(path, ClientShard(index=0, train_x=arrays["train_x"], train_y=arrays["train_y"],
                                  test_x=arrays["test_x"], test_y=arrays["test_y"], num_classes=classes,
                                  mean=(3.0,) * 3, std=(1.5,) * 3, dataset="sensor", partition="iid", seed=0))
    return path


def welcome(model: str = PLUGIN, plugins: dict[str, Any] | None = None, loss: str = "cross_entropy",
            num_classes: int = 3, normalization: dict[str, list[float]] | None = None) -> codec.Welcome:
    from fedge.models import ModelSpec, definition_hash

    spec = ModelSpec(name=model, input_shape=(3, 32), num_classes=num_classes)
    described = {"model": spec.plugin().as_dict()} if plugins is None and not spec.builtin else (plugins or {})
    return codec.Welcome(run_id="r1", round=0, sender="coordinator", client_index=0, num_clients=1, seed=0,
                         model=spec.as_dict(), model_hash=definition_hash(spec) if model == PLUGIN else "x",
                         algorithm="fedavg", algorithm_options={},
                         train={"epochs": 1, "batch_size": 16, "lr": 0.01, "optimizer": "adam", "momentum": 0.0,
                                "weight_decay": 0.0, "loss": loss, "class_weights": []},
                         heartbeat_s=1.0, liveness_s=5.0, plugins=described, normalization=normalization or {})


def agent(tmp_path: Path, **settings: Any) -> Agent:
    base = AgentSettings(coordinator="tcp://127.0.0.1:9", client_id="pi", data=str(sensor_shard(tmp_path / "s.npz")),
                         state_dir=str(tmp_path / "state"))
    return Agent(AgentSettings(**{**base.__dict__, **settings}))


def toml_sets(path: Path) -> list[str]:
    """Every key of a session's TOML file as a ``--set SECTION.KEY=VALUE`` override: ``load_config`` reads the file's
    keys and then the overrides, so these give the configuration the file gives."""
    def literal(value: Any) -> str:
        if isinstance(value, dict):
            return "{ " + ", ".join(f"{key} = {literal(item)}" for key, item in value.items()) + " }"
        if isinstance(value, list):
            return "[" + ", ".join(literal(item) for item in value) + "]"
        return json.dumps(value)  # a string, a number or a boolean: the same literal in TOML

    with open(path, "rb") as f:
        return [f"{section}.{key}={literal(value)}" for section, table in tomllib.load(f).items()
                for key, value in table.items()]
