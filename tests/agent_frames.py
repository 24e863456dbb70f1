"""Frames for the tests of the agent's side of the round protocol: a session's model and training settings, a
coordinator's welcome, task and other messages as bytes, the device facts, an ``AgentProtocol`` that has joined,
and the kinds of the actions the protocol returned."""

from __future__ import annotations

from typing import Any

from fedge import codec
from fedge.protocol.agent import AgentProtocol, DeviceFacts
from fedge.protocol.events import Join, Send

MODEL = {"name": "cnn", "input_shape": [1, 28, 28], "num_classes": 10, "pan": "none", "pan_a": 1.0, "pan_t": 1.0,
         "options": {}}
TRAIN = {"epochs": 1, "batch_size": 8, "lr": 0.01, "optimizer": "sgd", "momentum": 0.0, "weight_decay": 0.0,
         "loss": "cross_entropy", "class_weights": []}


def welcome(run_id: str = "r1", **changes: Any) -> bytes:
    fields: dict[str, Any] = dict(client_index=2, num_clients=3, seed=0, model_hash="h", model=MODEL,
                                  algorithm="fedavg", algorithm_options={}, train=TRAIN, heartbeat_s=1.0,
                                  liveness_s=5.0)
    fields.update(changes)
    return codec.encode(codec.Welcome(run_id=run_id, round=0, sender="coordinator", **fields))


def task(round_number: int, run_id: str = "r1", **fields: Any) -> bytes:
    return codec.encode(codec.Task(run_id=run_id, round=round_number, sender="coordinator", **fields))


def from_coordinator(cls: type[codec.Message], round_number: int, run_id: str = "r1", **fields: Any) -> bytes:
    return codec.encode(cls(run_id=run_id, round=round_number, sender="coordinator", **fields))  # type: ignore[arg-type]


FACTS = DeviceFacts(fedge_version="0", torch_version="none", dataset_size=10)


def kinds(actions: list[Any]) -> list[str]:
    return [type(a).__name__ if not isinstance(a, Send) else type(a.message).__name__ for a in actions
            if type(a).__name__ != "Noted"]


def joined() -> AgentProtocol:
    p = AgentProtocol("pi", hello_interval_s=3.0, facts=FACTS)
    (join,) = [a for a in p.receive(welcome(), 0.0) if isinstance(a, Join)]
    p.joined(join.welcome.run_id, join.welcome.client_index, 1.0, 5.0)
    return p
