"""The in-process round driver: a fleet of clients in one process, played through the runtime's own rules.

``make_fleet`` builds an algorithm's server half, a ``CoordinatorProtocol`` and one logical client per client
(``simulation.client.LogicalClient``: the agent's protocol object, its device state, its Hello); every client
registers with its real Hello and joins on the real Welcome. ``run_round`` then plays one round as a session and
its agents do: the coordinator protocol opens it and builds each selected client's Task, every packet is encoded,
handed over as bytes and decoded by the other side's protocol object, each client trains its task with THE
client-round function (``client.round.play_task``: the client half loaded from the committed device state,
on_receive, THE loop, the update, the pending state), the coordinator protocol validates the Update (a refusal
fails the round, with the reason), each accepted update is folded as it arrives and the round closed on the one
aggregation path (``protocol.server_half.Aggregation``, as a session does; bounded by ``protocol.influence`` when
``make_fleet`` is given ``bounds``), and the Commits make each client promote
its pending state. So an algorithm's tests exercise the production path, not a thinner copy. Device state is
written without fsync (``plumbing.without_fsync``); it is otherwise the agent's own.

For tests, benchmarks and quick experiments; the deployment path is ``coordinator`` and ``edge_agent``. No sockets,
threads or clocks: time is a counter the driver advances.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedge import codec
from fedge.algorithms.base import ModelLayout, Payload, ServerContext
from fedge.algorithms.loop import TrainSettings, task_of
from fedge.algorithms.registry import make_client, make_server
from fedge.client.joining import JoinedSession, Tensors
from fedge.client.round import play_task, update_frame
from fedge.client.state import DeviceState
from fedge.exhaustive import assert_never
from fedge.models import ModelSpec, build, definition_hash, state_to_arrays
from fedge.plumbing import without_fsync
from fedge.protocol.coordinator import CoordinatorProtocol
from fedge.protocol.events import (
    Accepted,
    AgentAction,
    Checkpoint,
    Confirm,
    CoordinatorEvent,
    Join,
    Noted,
    Rejected,
    Send,
    SendFrame,
    Train,
)
from fedge.protocol.influence import Influence, InfluenceLimits
from fedge.protocol.registry import AgentRegistry
from fedge.protocol.robust_rules import RobustRule
from fedge.protocol.server_half import Aggregation
from fedge.protocol.server_step import ServerStep
from fedge.simulation.client import LogicalClient, simulated_facts

RUN_ID = "inprocess"
FOREVER_S = 1e12


@dataclass
class Fleet:
    """The server half, the client halves with their models, the coordinator protocol and the logical clients,
    and the packets' sizes seen so far (Tasks in ``bytes_down``, Updates in ``bytes_up``, in the order sent). A
    test may replace ``server`` or ``clients`` between rounds (a restored half); the next round uses them."""

    server: Any
    clients: list[Any]
    models: list[nn.Module]
    coordinator: CoordinatorProtocol
    logical: list[LogicalClient]
    state_root: Path
    initial: dict[str, np.ndarray] = field(default_factory=dict)  # the models' common start (client halves get it)
    welcomes: list[codec.Welcome] = field(default_factory=list)
    bytes_down: list[int] = field(default_factory=list)
    bytes_up: list[int] = field(default_factory=list)
    clock: float = 0.0
    aggregation: Aggregation | None = None  # the round in progress's
    influence: Influence | None = None  # bounded influence (make_fleet's ``bounds``), as a session has it
    rule: RobustRule | None = None  # a robust aggregation rule (make_fleet's ``rule``)
    step: ServerStep | None = None  # the server's optimizer step (``protocol.server_step``); None: the aggregate
    keep: Any = None  # the temporary directory, when the fleet made its own

    @property
    def states(self) -> list[DeviceState]:
        return [client.state() for client in self.logical]


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
               state_dir: str | Path | None = None, bounds: InfluenceLimits | None = None,
               weight_cap: int = 0, rule: RobustRule | None = None) -> Fleet:
    """A fleet of ``clients`` agents of algorithm ``name``, each registered and joined; every model starts from
    the same weights. ``state_dir``: where the device states go (default: a temporary directory the fleet keeps).
    ``bounds``: bound each update's influence as a session does (``weight_cap``: the cap fixed before round 1;
    0: ``bounds.max_samples`` or derived from round 1's claims); None: unbounded. ``rule``: a robust aggregation
    rule in place of the mean (``protocol.robust_rules``)."""
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
    made: list[Fleet] = []  # the fleet, once made: its round's aggregation announces the norm bounds in each task

    def task_fields(_round: int) -> dict[str, Any]:
        aggregation = made[0].aggregation if made else None
        return {"norm_bounds": aggregation.norm_bounds if aggregation is not None else {}}

    coordinator = CoordinatorProtocol(RUN_ID, model_hash, {k: tuple(v.shape) for k, v in arrays.items()}, registry,
                                      server, lambda index: {**welcome, "client_index": index}, task_fields,
                                      floats=frozenset(k for k, v in arrays.items() if v.dtype.kind == "f"))
    logical = [LogicalClient(client_id(i), str(root / client_id(i)), simulated_facts(0), stay=True)
               for i in range(clients)]
    fleet = Fleet(server=server, clients=[], models=models, coordinator=coordinator, logical=logical,
                  state_root=root, keep=keep, initial=arrays,
                  influence=None if bounds is None else Influence(bounds, cap=bounds.max_samples or weight_cap),
                  rule=rule)
    made.append(fleet)
    for index, client in enumerate(logical):
        for _, action, frame in deliver(fleet, coordinator.receive(client.peer, client.hello_frame(), fleet.clock)):
            if isinstance(action, Join):
                w = action.welcome
                if w.client_index != index:
                    raise AssertionError(f"agent {client.client_id} was given index {w.client_index}")
                client.joined(w, frame)
                fleet.welcomes.append(w)
                fleet.clients.append(make_client(w.algorithm, dict(w.algorithm_options), w.client_index))
                fleet.clients[-1].initial_model(fleet.initial)
        if client.protocol.index is None:
            raise AssertionError(f"agent {client.client_id} did not join the session")
    return fleet


def deliver(fleet: Fleet, events: Sequence[CoordinatorEvent]) -> list[tuple[int, AgentAction, bytes]]:
    """Carry out the coordinator protocol's events: Sends go to the clients as packets (Task sizes counted), an
    accepted update is folded into the round at once; returns what the clients' protocol objects decided, with the
    packet each decided on. A refusal by the coordinator is an error here."""
    actions: list[tuple[int, AgentAction, bytes]] = []
    for event in events:
        match event:
            case Rejected(peer=peer, code=code, reason=reason):
                raise AssertionError(f"the coordinator refused a message of {peer!r}: {code}: {reason}")
            case Accepted(update=update):
                assert fleet.aggregation is not None, "an update accepted outside a round"
                fleet.aggregation.fold(update)
            case Send(peer=peer, message=message, task_of=task_of_index):
                frame = codec.encode(message)
                if task_of_index is not None:
                    fleet.coordinator.sent_task(task_of_index, len(frame))
                    fleet.bytes_down.append(len(frame))
                index = fleet.coordinator.registry.agents[peer.decode()].index
                actions += [(index, a, frame) for a in fleet.logical[index].protocol.receive(frame, fleet.clock)]
            case Noted() | SendFrame() | Checkpoint():
                continue  # nothing to log, no older peer, no checkpoint in process
            case _:
                assert_never(event)
    return actions


def train_task(fleet: Fleet, index: int, task: codec.Task, data: tuple[torch.Tensor, torch.Tensor],
               settings: TrainSettings, seed: int, inspect: Callable[[int, Payload, nn.Module], None] | None) -> bytes:
    """What an agent does with a task: THE client-round function on this client's half and model (as on a device,
    the half lives for the session, and what it carries from round to round is what its ``state_dict`` put on disk
    and the coordinator committed), with this round's settings and seed; returns the Update packet."""
    inputs, labels = data
    welcome = dataclasses.replace(fleet.welcomes[index], seed=seed)
    session = JoinedSession(run_id=RUN_ID, index=index, welcome=welcome, model=fleet.models[index],
                            client=fleet.clients[index], train=settings, task=task_of(settings, labels[:1]),
                            mean=(), std=(), heartbeat_s=FOREVER_S, liveness_s=FOREVER_S)
    none = inputs[:0]
    tensors = Tensors(inputs, labels, none, labels[:0])
    received = None if inspect is None else (lambda payload, model: inspect(index, payload, model))
    result = play_task(session, tensors, fleet.logical[index].state(), task, received=received)
    return update_frame(session, client_id(index), result)


def run_round(fleet: Fleet, round_number: int, data: Sequence[tuple[torch.Tensor, torch.Tensor]],
              settings: TrainSettings, seed: int = 0, participants: Sequence[int] | None = None,
              inspect: Callable[[int, Payload, nn.Module], None] | None = None) -> dict[str, Any]:
    """One round over the participants (default: all); ``inspect`` sees each client's model after on_receive.
    Returns the metrics of the round's close."""
    coordinator = fleet.coordinator
    coordinator.replace_server(fleet.server)  # a test may have swapped the server half for a restored one
    chosen = list(range(len(fleet.clients))) if participants is None else list(participants)
    fleet.clock += 1.0
    fleet.aggregation = Aggregation(fleet.server, round_number, fleet.influence, fleet.rule, step=fleet.step)
    with without_fsync():
        for index, action, _ in deliver(fleet, coordinator.open_round(round_number, chosen, fleet.clock, FOREVER_S)):
            if not isinstance(action, Train):
                continue
            frame = train_task(fleet, index, action.task, data[index], settings, seed, inspect)
            for sent in fleet.logical[index].protocol.finished(round_number, frame):
                if isinstance(sent, SendFrame):
                    fleet.bytes_up.append(len(sent.frame))
                    deliver(fleet, coordinator.receive(fleet.logical[index].peer, sent.frame, fleet.clock))
        current = coordinator.current
        if current is not None and not coordinator.complete(fleet.clock):
            raise AssertionError(f"round {round_number}: clients {current.awaited()} sent no update")
        coordinator.close_round(fleet.clock)
        metrics = fleet.aggregation.close()
        fleet.aggregation = None
        for index, action, _ in deliver(fleet, coordinator.commits(round_number)):
            if isinstance(action, Confirm) and not fleet.logical[index].confirm(action.round):
                raise AssertionError(f"client {index} had no pending state of round {action.round} to commit")
    return metrics


def global_arrays(fleet: Fleet) -> dict[str, np.ndarray]:
    arrays = fleet.server.evaluation_arrays()
    if arrays is None:
        raise ValueError("this algorithm keeps no global model")
    return dict(arrays)
