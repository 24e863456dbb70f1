"""Frames and a tiny-MLP coordinator protocol for the tests of the coordinator's side of the round protocol: the
session's welcome fields, a ``CoordinatorProtocol`` on FedAvg (or any algorithm), a hello, an update, and helpers
that read what the protocol sent (its messages, its error codes) and register agents."""

from __future__ import annotations

from typing import Any

import fedge
from fedge import codec
from fedge.algorithms import make_server
from fedge.algorithms.base import ModelLayout, ServerContext
from fedge.models import build, definition_hash, state_to_arrays
from fedge.protocol.coordinator import CoordinatorProtocol, Send
from fedge.protocol.registry import AgentRegistry
from tests.algo_helpers import TINY_MLP

HASH = definition_hash(TINY_MLP)


def welcome_fields(index: int) -> dict[str, Any]:
    return dict(client_index=index, num_clients=3, seed=0, model_hash=HASH, model=TINY_MLP.as_dict(),
                algorithm="fedavg", algorithm_options={},
                train={"epochs": 1, "batch_size": 8, "lr": 0.01, "optimizer": "sgd", "momentum": 0.0,
                       "weight_decay": 0.0, "loss": "cross_entropy", "class_weights": []},
                heartbeat_s=1.0, liveness_s=5.0)


def protocol(capacity: int = 3, algorithm: str = "fedavg", options: dict[str, Any] | None = None,
             liveness_s: float = 5.0, max_uploads: int = 0) -> CoordinatorProtocol:
    model = build(TINY_MLP, seed=0)
    arrays = state_to_arrays(model)
    server = make_server(algorithm, options or {}, arrays, ServerContext(capacity, ModelLayout.of(model)))
    shapes = {name: tuple(a.shape) for name, a in arrays.items()}
    return CoordinatorProtocol("run-1", HASH, shapes, AgentRegistry(capacity, liveness_s), server,
                               welcome_fields, max_uploads=max_uploads)


def hello(sender: str, **changes: Any) -> bytes:
    fields: dict[str, Any] = dict(run_id="", round=0, sender=sender, fedge_version=fedge.__version__,
                                  versions=(codec.PROTOCOL_VERSION,), torch_version="x", model_hash=HASH,
                                  capabilities=(), dataset_size=10)
    fields.update(changes)
    return codec.encode(codec.Hello(**fields))


def frame(message: codec.Message) -> bytes:
    return codec.encode(message)


def sent(events: list[Any]) -> list[codec.Message]:
    return [e.message for e in events if isinstance(e, Send)]


def codes(events: list[Any]) -> list[str]:
    return [m.code for m in sent(events) if isinstance(m, codec.ErrorMessage)]


def joined(p: CoordinatorProtocol, *names: str, now: float = 0.0) -> None:
    for name in names:
        assert isinstance(sent(p.receive(name.encode(), hello(name), now))[0], codec.Welcome)


def update(p: CoordinatorProtocol, sender: str, round_number: int, *, shift: float = 0.1,
           groups: dict[str, codec.TensorGroup] | None = None) -> bytes:
    arrays = p.server.evaluation_arrays()
    model = {k: (v + shift).astype(v.dtype) if v.dtype.kind == "f" else v for k, v in arrays.items()}
    return frame(codec.Update(run_id="run-1", round=round_number, sender=sender,
                              groups=groups if groups is not None else {"model": codec.TensorGroup(dense=model)},
                              num_samples=10))
