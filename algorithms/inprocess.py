"""An in-process driver of an algorithm's two halves, for tests and quick experiments only.

It plays the runtime's part without sockets: builds the server half and one client half per client, sends each
downlink through the real codec (encode -> bytes -> decode) unless told not to, trains with THE loop, and aggregates.
The deployment path is the coordinator and the agents; this exists so that algorithm invariants can be checked in
seconds. Must not import a transport.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from fedge import codec
from fedge.algorithms.base import ClientUpdate, ModelLayout, Payload, ServerContext
from fedge.algorithms.loop import TrainSettings, round_seed, train_local
from fedge.algorithms.registry import make_client, make_server
from fedge.models import ModelSpec, build, state_to_arrays


@dataclass
class Fleet:
    """The server half, the client halves with their models, and the packets' sizes seen so far."""

    server: Any
    clients: list[Any]
    models: list[nn.Module]
    bytes_down: list[int] = field(default_factory=list)
    bytes_up: list[int] = field(default_factory=list)


def through_codec(payload: Payload, kind: str, round_number: int) -> tuple[Payload, int]:
    """Encode a payload as a real packet and decode it back; returns the decoded payload and the packet size."""
    cls = codec.Task if kind == "task" else codec.Update
    packet = codec.encode(cls(run_id="inprocess", round=round_number, sender="x",
                              groups=dict(payload.groups), meta=dict(payload.meta)))
    message = codec.decode(packet)
    return Payload(groups=dict(message.groups), meta=dict(message.meta)), len(packet)  # type: ignore[union-attr]


def make_fleet(name: str, options: Mapping[str, Any], spec: ModelSpec, clients: int, seed: int = 0) -> Fleet:
    torch.manual_seed(seed)
    models = [build(spec) for _ in range(clients)]
    for model in models[1:]:
        model.load_state_dict(models[0].state_dict())
    context = ServerContext(num_clients=clients, layout=ModelLayout.of(models[0]), seed=seed)
    server = make_server(name, options, state_to_arrays(models[0]), context)
    halves = [make_client(name, options, index) for index in range(clients)]
    return Fleet(server=server, clients=halves, models=models)


def run_round(fleet: Fleet, round_number: int, data: Sequence[tuple[torch.Tensor, torch.Tensor]],
              settings: TrainSettings, seed: int = 0, participants: Sequence[int] | None = None,
              use_codec: bool = True,
              inspect: Callable[[int, Payload, nn.Module], None] | None = None) -> dict[str, Any]:
    """One round over the participants (default: all); ``inspect`` sees each client's model after on_receive."""
    chosen = list(range(len(fleet.clients))) if participants is None else list(participants)
    updates = []
    for index in chosen:
        down = fleet.server.downlink(round_number, index)
        if use_codec:
            down, size = through_codec(down, "task", round_number)
            fleet.bytes_down.append(size)
        client, model = fleet.clients[index], fleet.models[index]
        client.on_receive(round_number, down, model)
        if inspect is not None:
            inspect(index, down, model)
        inputs, labels = data[index]
        stats = train_local(model, client, inputs, labels, settings, round_seed(seed, round_number, index))
        up = client.make_update(round_number, model, stats)
        if use_codec:
            up, size = through_codec(up, "update", round_number)
            fleet.bytes_up.append(size)
        updates.append(ClientUpdate(client_id=f"c{index}", index=index, num_samples=int(labels.shape[0]),
                                    payload=up))
    return dict(fleet.server.aggregate(round_number, updates))


def global_arrays(fleet: Fleet) -> dict[str, np.ndarray]:
    arrays = fleet.server.evaluation_arrays()
    if arrays is None:
        raise ValueError("this algorithm keeps no global model")
    return dict(arrays)
