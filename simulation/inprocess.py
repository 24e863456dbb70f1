"""The in-process round driver: a fleet of clients in one process, played through the runtime's own rules.

``make_fleet`` builds an algorithm's server half and one client half per client, a ``CoordinatorProtocol`` and one
``AgentProtocol`` per client, and a device-state directory per client; every agent registers with a real Hello and
joins on a real Welcome. ``run_round`` then plays one round as the coordinator and the agents do: the coordinator
protocol opens it and builds each selected client's Task, every packet is encoded, handed over as bytes and decoded
by the other side's protocol object, each agent loads its client half from its committed device state, trains with
THE loop, writes its state as pending and sends an Update (typed runtime fields and all), the coordinator protocol
validates it (a refusal fails the round, with the reason), the server half aggregates, and the Commits it sends make
each agent promote its pending state. So an algorithm's invariants are checked on the runtime's rules, not on a
thinner copy. Device state is written without fsync (``plumbing.without_fsync``); it is otherwise the agent's own.

For tests, benchmarks and quick experiments; the deployment path is ``coordinator`` and ``edge_agent``. No sockets,
threads or clocks: time is a counter the driver advances.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import fedge
from fedge import codec
from fedge.algorithms.base import ClientUpdate, ModelLayout, Payload, ServerContext
from fedge.algorithms.loop import TrainSettings, round_seed, train_local
from fedge.algorithms.registry import make_client, make_server
from fedge.client.protocol import AgentProtocol, Confirm, Join, SendFrame, Train
from fedge.client.state import DeviceState
from fedge.coordinator.agents import AgentRegistry
from fedge.coordinator.protocol import CoordinatorProtocol, Rejected, Send
from fedge.models import ModelSpec, build, definition_hash, state_to_arrays
from fedge.plumbing import without_fsync

RUN_ID = "inprocess"
FOREVER_S = 1e12


@dataclass
class Fleet:
    """The server half, the client halves with their models, the protocol objects and device states, and the
    packets' sizes seen so far (Tasks in ``bytes_down``, Updates in ``bytes_up``, in the order sent)."""

    server: Any
    clients: list[Any]
    models: list[nn.Module]
    coordinator: CoordinatorProtocol
    agents: list[AgentProtocol]
    states: list[DeviceState]
    state_root: Path
    initial: dict[str, np.ndarray] = field(default_factory=dict)  # the models' common start (client halves get it)
    welcomes: list[codec.Welcome] = field(default_factory=list)
    bytes_down: list[int] = field(default_factory=list)
    bytes_up: list[int] = field(default_factory=list)
    clock: float = 0.0
    keep: Any = None  # the temporary directory, when the fleet made its own


def through_codec(payload: Payload, kind: str, round_number: int) -> tuple[Payload, int]:
    """Encode a payload as a real Task or Update packet and decode it back; the decoded payload and the size."""
    cls = codec.Task if kind == "task" else codec.Update
    packet = codec.encode(cls(run_id=RUN_ID, round=round_number, sender="x", groups=dict(payload.groups),
                              meta=dict(payload.meta)))
    message = codec.decode(packet)
    assert isinstance(message, (codec.Task, codec.Update))
    return Payload(groups=dict(message.groups), meta=dict(message.meta)), len(packet)


def client_id(index: int) -> str:
    return f"c{index}"


def make_fleet(name: str, options: Mapping[str, Any], spec: ModelSpec, clients: int, seed: int = 0,
               state_dir: str | Path | None = None) -> Fleet:
    """A fleet of ``clients`` agents of algorithm ``name``, each registered and joined; every model starts from
    the same weights. ``state_dir``: where the device states go (default: a temporary directory the fleet keeps)."""
    torch.manual_seed(seed)
    models = [build(spec) for _ in range(clients)]
    for model in models[1:]:
        model.load_state_dict(models[0].state_dict())
    arrays = state_to_arrays(models[0])
    context = ServerContext(num_clients=clients, layout=ModelLayout.of(models[0]), seed=seed)
    server = make_server(name, options, arrays, context)
    keep = None
    if state_dir is None:
        keep = tempfile.TemporaryDirectory(prefix="fedge-inprocess-")
        state_dir = keep.name
    root = Path(state_dir)
    model_hash = definition_hash(spec)
    welcome = {"num_clients": clients, "seed": seed, "model_hash": model_hash, "model": spec.as_dict(),
               "algorithm": name, "algorithm_options": dict(options),
               "train": {**TrainSettings().__dict__, "class_weights": []},  # informative: run_round has its own
               "heartbeat_s": FOREVER_S, "liveness_s": FOREVER_S}
    registry = AgentRegistry(clients, FOREVER_S)
    registry.reserve([client_id(i) for i in range(clients)])
    coordinator = CoordinatorProtocol(RUN_ID, model_hash, {k: tuple(v.shape) for k, v in arrays.items()}, registry,
                                      server, lambda index: {**welcome, "client_index": index})
    fleet = Fleet(server=server, clients=[], models=models, coordinator=coordinator,
                  agents=[AgentProtocol(client_id(i), hello_interval_s=1.0) for i in range(clients)],
                  states=[DeviceState(root / client_id(i)) for i in range(clients)], state_root=root, keep=keep,
                  initial=arrays)
    for index, agent in enumerate(fleet.agents):
        hello = codec.Hello(run_id="", round=0, sender=agent.client_id, fedge_version=fedge.__version__,
                            versions=codec.SPOKEN_VERSIONS, torch_version=torch.__version__, model_hash=model_hash,
                            capabilities=(), dataset_size=0, holds=agent.holds())
        for _, action in deliver_to_agents(fleet, coordinator.receive(agent.client_id.encode(), codec.encode(hello),
                                                                   fleet.clock)):
            if isinstance(action, Join):
                w = action.welcome
                if w.client_index != index:
                    raise AssertionError(f"agent {agent.client_id} was given index {w.client_index}")
                agent.joined(w.run_id, w.client_index, w.heartbeat_s, w.liveness_s)
                fleet.welcomes.append(w)
                fleet.clients.append(client_half(w))
                fleet.clients[-1].initial_model(fleet.initial)
        if agent.index is None:
            raise AssertionError(f"agent {agent.client_id} did not join the session")
    return fleet


def client_half(welcome: codec.Welcome) -> Any:
    """The client half an agent builds from its welcome."""
    return make_client(welcome.algorithm, dict(welcome.algorithm_options), welcome.client_index)


def deliver_to_agents(fleet: Fleet, events: Sequence[Any]) -> list[Any]:
    """Carry the coordinator's Sends to the agents (as packets; Task sizes counted) and return what the agents'
    protocol objects decided; a refusal by the coordinator is an error here."""
    actions: list[Any] = []
    for event in events:
        if isinstance(event, Rejected):
            raise AssertionError(f"the coordinator refused a message of {event.peer!r}: {event.code}: {event.reason}")
        if not isinstance(event, Send):
            continue
        frame = codec.encode(event.message)
        if event.task_of is not None:
            fleet.coordinator.sent_task(event.task_of, len(frame))
            fleet.bytes_down.append(len(frame))
        index = fleet.coordinator.registry.agents[event.peer.decode()].index
        actions += [(index, a) for a in fleet.agents[index].receive(frame, fleet.clock)]
    return actions


def train_task(fleet: Fleet, index: int, task: codec.Task, data: tuple[torch.Tensor, torch.Tensor],
               settings: TrainSettings, seed: int, inspect: Callable[[int, Payload, nn.Module], None] | None) -> bytes:
    """What an agent does with a task (``edge_agent.agent``): its client half loaded from the committed device
    state, on_receive, THE loop, the update, the pending state; returns the Update packet. As on a device, the
    client half object lives for the session, and what it carries from round to round is what its ``state_dict``
    put on disk and the coordinator committed."""
    state, client, model = fleet.states[index], fleet.clients[index], fleet.models[index]
    state.discard_unconfirmed(RUN_ID, task.last_accepted_round)
    client.load_state_dict(state.committed(RUN_ID))
    down = Payload(groups=dict(task.groups), meta=dict(task.meta))
    client.on_receive(task.round, down, model)
    if inspect is not None:
        inspect(index, down, model)
    inputs, labels = data
    stats = train_local(model, client, inputs, labels, settings, round_seed(seed, task.round, index))
    up = client.make_update(task.round, model, stats)
    state.write_pending(RUN_ID, task.round, client.state_dict(), state_to_arrays(model))
    return codec.encode(codec.Update(run_id=RUN_ID, round=task.round, sender=client_id(index), groups=dict(up.groups),
                                     meta=dict(up.meta), num_samples=int(labels.shape[0]), steps=stats.steps,
                                     train_loss=float(stats.loss)))


def run_round(fleet: Fleet, round_number: int, data: Sequence[tuple[torch.Tensor, torch.Tensor]],
              settings: TrainSettings, seed: int = 0, participants: Sequence[int] | None = None,
              inspect: Callable[[int, Payload, nn.Module], None] | None = None) -> dict[str, Any]:
    """One round over the participants (default: all); ``inspect`` sees each client's model after on_receive.
    Returns what the server half's aggregate returned."""
    coordinator = fleet.coordinator
    coordinator.server = fleet.server  # a test may have swapped the server half for a restored one
    chosen = list(range(len(fleet.clients))) if participants is None else list(participants)
    fleet.clock += 1.0
    with without_fsync():
        actions = deliver_to_agents(fleet, coordinator.open_round(round_number, chosen, fleet.clock, FOREVER_S))
        for index, action in actions:
            if not isinstance(action, Train):
                continue
            frame = train_task(fleet, index, action.task, data[index], settings, seed, inspect)
            for sent in fleet.agents[index].finished(round_number, frame):
                if isinstance(sent, SendFrame):
                    fleet.bytes_up.append(len(sent.frame))
                    deliver_to_agents(fleet, coordinator.receive(client_id(index).encode(), sent.frame, fleet.clock))
        current = coordinator.current
        if current is not None and not coordinator.complete(fleet.clock):
            raise AssertionError(f"round {round_number}: clients {current.awaited()} sent no update")
        closed, _ = coordinator.close_round(fleet.clock)
        updates = [ClientUpdate(client_id=client_id(i), index=i, num_samples=u.num_samples,
                                payload=Payload(groups=dict(u.groups), meta=dict(u.meta)))
                   for i, (u, _) in sorted(closed.updates.items())]
        metrics = dict(fleet.server.aggregate(round_number, updates)) if updates else {}
        for index in closed.updates:
            coordinator.registry.by_index(index).last_accepted_round = round_number
        for index, action in deliver_to_agents(fleet, coordinator.commits(round_number)):
            if isinstance(action, Confirm) and not fleet.states[index].confirm(RUN_ID, action.round):
                raise AssertionError(f"client {index} had no pending state of round {action.round} to commit")
    return metrics


def global_arrays(fleet: Fleet) -> dict[str, np.ndarray]:
    arrays = fleet.server.evaluation_arrays()
    if arrays is None:
        raise ValueError("this algorithm keeps no global model")
    return dict(arrays)
