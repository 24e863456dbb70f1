"""Asynchronous buffered rounds (FedBuff) in process, on a simulated clock; and synchronous rounds on the same clock,
so that the two compare.

``run_async`` plays a session of versions through the protocol objects a session and its agents use: the fleet's
``CoordinatorProtocol`` serves versions (``protocol.versions``: which device gets the next task, each Task numbered
and carrying its base version, each Update checked, placed by the task table or refused, the cancels and the
Commits), each logical client's ``AgentProtocol`` takes its Task, Cancel and Commit as an agent does, and each task
is trained by THE client-round function (``simulation.inprocess.train_task``). Only time is simulated:
``simulation.timing.DeviceTiming`` says how long each task takes. Every accepted update is folded at once on the one
aggregation path (``protocol.server_half.Aggregation``, one per version, with the fleet's bounds and server step);
a version is flushed the moment its ``buffer``-th update is folded.

Events: a task is trained when it is sent (its result depends only on its base model and its client) and its update
arrives at its simulated finish time; arrivals are taken in order of (time, task id), so a run is the same, bit for
bit, for the same seed. A cancelled task's result is dropped, and its device is idle at once.

``run_sync`` plays synchronous rounds (``simulation.inprocess.run_round``) on the same clock: a round lasts as long as
its slowest kept device; with over-selection (``selected`` > ``cohort``) the ``cohort`` fastest are kept and the rest
cancelled. Evaluation costs no simulated time.

For the stateless algorithms (FedAvg, FedProx: ``coordinator.sections.ASYNC_ALGORITHMS``) with delta uploads. No
sockets, threads or wall clocks.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedge import codec
from fedge.algorithms.base import TrainSettings
from fedge.exhaustive import assert_never
from fedge.plumbing import without_fsync
from fedge.protocol.asynchronous import AsyncRounds, AsyncSettings
from fedge.protocol.events import (
    Accepted,
    AgentAction,
    CancelTraining,
    Checkpoint,
    Confirm,
    CoordinatorEvent,
    Noted,
    Rejected,
    Send,
    SendFrame,
    Train,
)
from fedge.protocol.selection import censored, choose, measured
from fedge.protocol.server_half import Aggregation
from fedge.protocol.versions import VersionRounds
from fedge.simulation.inprocess import FOREVER_S, Fleet, global_arrays, run_round, train_task
from fedge.simulation.timing import DeviceTiming

Evaluate = Callable[[dict[str, np.ndarray]], dict[str, Any]]
Data = Sequence[tuple[torch.Tensor, torch.Tensor]]


def planned_steps(samples: int, settings: TrainSettings) -> int:
    """The local steps a task is planned to take (its simulated cost): epochs times the batches of its data."""
    return settings.epochs * max(1, math.ceil(samples / settings.batch_size))


@dataclass
class Timeline:
    """What a run recorded: one row per version (or round), the clients' rows, and the simulated clock."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    clients: list[dict[str, Any]] = field(default_factory=list)
    clock: float = 0.0


def _evaluated(row: dict[str, Any], fleet: Fleet, evaluate: Evaluate | None) -> dict[str, Any]:
    if evaluate is not None:
        row.update(evaluate(global_arrays(fleet)))
    return row


class AsyncFleet:
    """One asynchronous run of a fleet: the events on the simulated clock, and the protocol objects' decisions carried
    out as a session and its agents carry them out."""

    def __init__(self, fleet: Fleet, settings: AsyncSettings, data: Data, train: TrainSettings,
                 timing: DeviceTiming, seed: int, device_state: bool = False) -> None:
        self.fleet, self.data, self.train, self.timing, self.seed = fleet, data, train, timing, seed
        self.coordinator = fleet.coordinator
        self.coordinator.replace_server(fleet.server)
        self.versions = VersionRounds(AsyncRounds(settings), self.coordinator.registry, self.coordinator.shapes,
                                      self.task_flags, FOREVER_S, 0.0, device_state=device_state)
        self.coordinator.start_versions(self.versions)
        fleet.aggregation = Aggregation(fleet.server, 1, fleet.influence, step=fleet.step)
        self.heap: list[tuple[float, int, int]] = []   # (arrival time, task id, client index)
        self.results: dict[int, bytes] = {}            # task id -> its Update packet, until it arrives
        self.refused: list[str] = []                   # the version's refusals, with their reasons

    def task_flags(self, _task_id: int) -> dict[str, Any]:
        aggregation = self.fleet.aggregation
        return {"norm_bounds": aggregation.norm_bounds if aggregation is not None else {}}

    def carry(self, events: Sequence[CoordinatorEvent], now: float) -> None:
        """The coordinator protocol's events: an accepted update folded at once, a refusal counted, a message
        handed to its client's protocol as a packet."""
        for event in events:
            match event:
                case Accepted(update=update):
                    assert self.fleet.aggregation is not None
                    self.fleet.aggregation.fold(update)
                case Rejected(reason=reason):
                    self.refused.append(reason)
                case Send(peer=peer, message=message, task_of=task_of):
                    packet = codec.encode(message)
                    if task_of is not None:
                        self.coordinator.sent_task(task_of, len(packet))
                    index = self.coordinator.registry.agents[peer.decode()].index
                    for action in self.fleet.logical[index].protocol.receive(packet, now):
                        self.act(index, action, packet, now)
                case Checkpoint() | Noted() | SendFrame():
                    continue  # no checkpoint or log in process; no older peer
                case _:
                    assert_never(event)

    def act(self, index: int, action: AgentAction, packet: bytes, now: float) -> None:
        """A client protocol's decision: a task trained now and its update scheduled, a cancelled task's result
        dropped, a commit's pending state promoted."""
        match action:
            case Train(task=task):
                frame = train_task(self.fleet, index, task, self.data[index], self.train, self.seed, None)
                self.results[task.round] = frame
                steps = planned_steps(int(self.data[index][1].shape[0]), self.train)
                finish = now + self.timing.duration(index, task.round, steps, len(packet) + len(frame))
                heapq.heappush(self.heap, (finish, task.round, index))
            case CancelTraining(round=task_id):
                self.results.pop(task_id, None)
            case Confirm(round=task_id):
                self.fleet.logical[index].confirm(task_id)
            case _:
                return  # what a client logs or reports beside its tasks plays no part here

    def fill(self, now: float) -> None:
        """Tasks while the rules leave room and a client holds none (which one: ``VersionRounds.pick``)."""
        idle = self.versions.idle(list(range(len(self.fleet.clients))))
        while idle and self.versions.rounds.room() > 0:
            pick = self.versions.pick(idle, self.seed)
            idle.remove(pick)
            self.carry([self.coordinator.dispatch(pick, now)], now)

    def arrive(self, now: float, task_id: int, index: int) -> None:
        """A task's update reaches the coordinator (unless the task was cancelled meanwhile)."""
        frame = self.results.pop(task_id, None)
        if frame is None:
            return
        client = self.fleet.logical[index]
        for action in client.protocol.finished(task_id, frame):
            if isinstance(action, SendFrame):
                self.carry(self.coordinator.receive(client.peer, action.frame, now), now)

    def flush(self, now: float) -> dict[str, Any]:
        """Close the version: its aggregation, its cancels, then its Commits; its row (``round``: the version)."""
        fleet = self.fleet
        assert fleet.aggregation is not None
        metrics = fleet.aggregation.close()
        flush, record, cancels = self.coordinator.close_version(now)
        self.carry(cancels, now)
        self.carry(self.coordinator.flush_version(flush.version), now)
        fleet.aggregation = Aggregation(fleet.server, flush.version + 1, fleet.influence, step=fleet.step)
        row = {"round": flush.version, "updates": len(flush.arrivals), **flush.staleness(), "sim_time_s": now,
               "refused": len(self.refused), "cancelled": len(flush.cancelled),
               "bytes_down": sum(record.bytes_down.values()), "bytes_up": sum(u[3] for u in record.updates),
               **metrics}
        self.refused = []
        return row | {"clients": [{"client": index, "task": task, "staleness": staleness,
                                   "num_samples": update.num_samples}
                                  for index, task, update, _, staleness in record.updates]}


def run_async(fleet: Fleet, settings: AsyncSettings, data: Data, train: TrainSettings, timing: DeviceTiming,
              versions: int, seed: int = 0, evaluate: Evaluate | None = None, until_s: float = math.inf,
              stop: Callable[[dict[str, Any]], bool] | None = None, device_state: bool = False) -> Timeline:
    """Play asynchronous versions until ``versions`` are flushed, the simulated clock passes ``until_s`` or
    ``stop`` says so of a version's row. ``seed``: the run's (the batch orders, which device gets a task).
    ``device_state``: hold each device to one uncommitted task, as for an algorithm whose devices keep state
    (``protocol.versions.VersionRounds``; the benchmark measures what that rule costs)."""
    if len(fleet.clients) < 1:
        raise ValueError("an asynchronous run needs clients")
    run = AsyncFleet(fleet, settings, data, train, timing, seed, device_state)
    timeline = Timeline()
    with without_fsync():
        run.fill(0.0)
        while run.heap and run.versions.version < versions:
            now, task_id, index = heapq.heappop(run.heap)
            if now > until_s:
                break
            timeline.clock = now
            run.arrive(now, task_id, index)
            if run.versions.rounds.flush_due:
                row = run.flush(now)
                timeline.clients += [{"round": row["round"], **client, "sim_time_s": now}
                                     for client in row.pop("clients")]
                timeline.rows.append(_evaluated(row, fleet, evaluate))
                if stop is not None and stop(row):
                    break
            run.fill(now)
    return timeline


def run_sync(fleet: Fleet, rounds: int, data: Data, train: TrainSettings, timing: DeviceTiming, cohort: int,
             selected: int = 0, seed: int = 0, evaluate: Evaluate | None = None,
             until_s: float = math.inf, stop: Callable[[dict[str, Any]], bool] | None = None,
             policy: str = "uniform") -> Timeline:
    """Synchronous rounds on the simulated clock: ``selected`` clients drawn each round (0: ``cohort``) by the
    session's own selection (``protocol.selection.choose``: ``policy`` "uniform", or "latency", weighted by each
    client's round times as measured so far, a cancelled one's censored), the ``cohort`` fastest kept, the round
    lasting until the last of those arrives; ``until_s`` and ``stop`` as for ``run_async``."""
    selected = selected or cohort
    if not 0 < cohort <= selected <= len(fleet.clients):
        raise ValueError(f"need 0 < cohort ({cohort}) <= selected ({selected}) <= clients ({len(fleet.clients)})")
    timeline = Timeline()
    task_id = 0
    measured_s: dict[int, float | None] = {}  # each client's round-time estimate, as a session keeps it
    for number in range(1, rounds + 1):
        rng = np.random.default_rng([seed, number])
        chosen = choose(list(range(len(fleet.clients))), selected, rng, policy, measured_s)
        durations = {}
        for index in chosen:
            task_id += 1
            durations[index] = timing.duration(index, task_id, planned_steps(int(data[index][1].shape[0]), train))
        kept = sorted(sorted(chosen, key=lambda i: (durations[i], i))[:cohort])
        took = max(durations[i] for i in kept)
        if timeline.clock + took > until_s:
            break
        for index in chosen:
            measured_s[index] = measured(measured_s.get(index), durations[index]) if index in kept else \
                censored(measured_s.get(index), took, math.inf)
        down, up = len(fleet.bytes_down), len(fleet.bytes_up)
        metrics = run_round(fleet, number, data, train, seed=seed, participants=kept)
        timeline.clock += took
        task_size = fleet.bytes_down[-1] if fleet.bytes_down else 0
        row = {"round": number, "updates": len(kept), "sim_time_s": timeline.clock, "cancelled": selected - cohort,
               "bytes_down": sum(fleet.bytes_down[down:]) + (selected - cohort) * task_size,
               "bytes_up": sum(fleet.bytes_up[up:]), **metrics}
        timeline.rows.append(_evaluated(row, fleet, evaluate))
        timeline.clients += [{"round": number, "client": i, "sim_time_s": timeline.clock - took + durations[i]}
                             for i in kept]
        if stop is not None and stop(row):
            break
    return timeline
