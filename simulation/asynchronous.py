"""Asynchronous buffered rounds (FedBuff) in process, on a simulated clock; and synchronous rounds on the same clock,
so that the two compare.

``run_async`` plays a session of versions: ``protocol.asynchronous.AsyncRounds`` decides which task may be sent, how
stale each update is, whether it is folded and when a version is flushed; ``simulation.timing.DeviceTiming`` says
how long each task takes. Every task is a real Task packet (its base version's model, from the server half's
downlink), trained by THE client-round function (``simulation.inprocess.train_task``), and its Update packet is
decoded and checked as the coordinator checks one (``protocol.validation``, the half's ``check_update``). An
accepted update is folded at once on the one aggregation path (``protocol.server_half.Aggregation``, one per
version, with the fleet's bounds and server step) under its staleness factors; a flush closes it. A stateless
client's pending device state is discarded by its next task, so no Commit is played.

Events: a task is trained when it is sent (its result depends only on its base model and its client) and its update
arrives at its simulated finish time; the event heap orders arrivals by (time, task id), so a run is the same, bit
for bit, for the same seed. Which idle client gets the next task is drawn from (seed, task id). A task's Task packet
carries base version + 1 where a synchronous one carries its round (the batch order's seed derives from it, with
the client's attempt on that base: ``attempt_seed``); the wire format's own task id is the next step (docs/protocol.md).

``run_sync`` plays synchronous rounds (``simulation.inprocess.run_round``) on the same clock: a round lasts as long as
its slowest kept device; with over-selection (``selected`` > ``cohort``) the ``cohort`` fastest are kept and the rest
cancelled. Evaluation costs no simulated time.

For the stateless algorithms (FedAvg, FedProx: ``ASYNC_ALGORITHMS``) with delta uploads. No sockets, threads or wall
clocks.
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
from fedge.plumbing import without_fsync
from fedge.protocol.asynchronous import Arrival, AsyncRounds, AsyncSettings, Refusal
from fedge.protocol.events import COORDINATOR
from fedge.protocol.payload import ClientUpdate, Payload
from fedge.protocol.server_half import Aggregation
from fedge.protocol.validation import check_update
from fedge.simulation.inprocess import RUN_ID, Fleet, global_arrays, run_round, train_task
from fedge.simulation.timing import DeviceTiming

ASYNC_ALGORITHMS = ("fedavg", "fedprox")  # stateless clients whose server half folds deltas under a discount
Evaluate = Callable[[dict[str, np.ndarray]], dict[str, Any]]
Data = Sequence[tuple[torch.Tensor, torch.Tensor]]


def planned_steps(samples: int, settings: TrainSettings) -> int:
    """The local steps a task is planned to take (its simulated cost): epochs times the batches of its data."""
    return settings.epochs * max(1, math.ceil(samples / settings.batch_size))


def attempt_seed(run_seed: int, attempt: int) -> int:
    """The seed a client's ``attempt``-th task on one base version trains with (0: the run's own, as a synchronous
    round's), so that two tasks of one client on one base do not repeat one batch order."""
    return run_seed if attempt == 0 else run_seed + attempt * 7919


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


def run_async(fleet: Fleet, settings: AsyncSettings, data: Data, train: TrainSettings, timing: DeviceTiming,
              versions: int, seed: int = 0, evaluate: Evaluate | None = None, until_s: float = math.inf,
              stop: Callable[[dict[str, Any]], bool] | None = None) -> Timeline:
    """Play asynchronous versions until ``versions`` are flushed, the simulated clock passes ``until_s`` or
    ``stop`` says so of a version's row."""
    if len(fleet.clients) < 1:
        raise ValueError("an asynchronous run needs clients")
    server, shapes = fleet.server, {name: tuple(a.shape) for name, a in fleet.initial.items()}
    rounds = AsyncRounds(settings)
    timeline = Timeline()
    heap: list[tuple[float, int]] = []          # (arrival time, task id)
    frames: dict[int, tuple[bytes, int]] = {}   # task id -> (its Update packet, its Task packet's size)
    counts = {"refused": 0, "cancelled": 0, "bytes_down": 0, "bytes_up": 0}
    aggregation = Aggregation(server, 1, fleet.influence, step=fleet.step)

    def fill(now: float) -> None:
        busy = rounds.busy()
        while rounds.room() > 0:
            idle = [i for i in range(len(fleet.clients)) if i not in busy]
            if not idle:
                return
            pick = idle[int(np.random.default_rng([seed, rounds.next_id]).integers(len(idle)))]
            sent = rounds.dispatch(pick, now)
            busy.add(pick)
            payload = server.downlink(sent.base + 1, pick)
            packet = codec.encode(codec.Task(run_id=RUN_ID, round=sent.base + 1, sender=COORDINATOR,
                                             groups=dict(payload.groups), meta=dict(payload.meta),
                                             committed_round=rounds.version, norm_bounds=aggregation.norm_bounds))
            task = codec.decode(packet)
            assert isinstance(task, codec.Task)
            frame = train_task(fleet, pick, task, data[pick], train, attempt_seed(seed, sent.attempt), None)
            frames[sent.task_id] = (frame, len(packet))
            steps = planned_steps(int(data[pick][1].shape[0]), train)
            finish = now + timing.duration(pick, sent.task_id, steps, len(packet) + len(frame))
            heapq.heappush(heap, (finish, sent.task_id))

    with without_fsync():
        fill(0.0)
        while heap and rounds.version < versions:
            now, task_id = heapq.heappop(heap)
            if now > until_s:
                break
            timeline.clock = now
            sent = rounds.in_flight.get(task_id)
            frame, task_size = frames.pop(task_id)
            if sent is None:  # cancelled before it arrived
                continue
            counts["bytes_down"] += task_size
            counts["bytes_up"] += len(frame)
            update = codec.decode(frame)
            assert isinstance(update, codec.Update)
            decoded = ClientUpdate(client_id=fleet.logical[sent.index].client_id, index=sent.index,
                                   num_samples=update.num_samples,
                                   payload=Payload(groups=dict(update.groups), meta=dict(update.meta)),
                                   clip_scale=update.clip_scale)
            problem = check_update(update, shapes, set()) or server.check_update(sent.base + 1, decoded)
            outcome: Arrival | Refusal
            if problem:
                rounds.fail(task_id)
                outcome = Refusal(task_id, sent.index, problem)
            else:
                outcome = rounds.arrive(task_id, sent.index)
            if isinstance(outcome, Refusal):
                counts["refused"] += 1
                timeline.clients.append({"round": rounds.version + 1, "client": sent.index, "task": task_id,
                                         "base": sent.base, "refused": outcome.reason, "sim_time_s": now})
            else:
                aggregation.fold(ClientUpdate(client_id=decoded.client_id, index=decoded.index,
                                              num_samples=decoded.num_samples, payload=decoded.payload,
                                              clip_scale=decoded.clip_scale, discount=outcome.discount,
                                              counted=outcome.counted))
                timeline.clients.append({"round": rounds.version + 1, "client": sent.index, "task": task_id,
                                         "base": sent.base, "staleness": outcome.staleness,
                                         "discount": outcome.discount, "num_samples": update.num_samples,
                                         "sim_time_s": now})
            if rounds.flush_due:
                metrics = aggregation.close()
                flush = rounds.flush()
                counts["cancelled"] += len(flush.cancelled)
                row = {"round": flush.version, "updates": len(flush.arrivals), **flush.staleness(),
                       "sim_time_s": now, **counts, **metrics}
                counts = dict.fromkeys(counts, 0)
                timeline.rows.append(_evaluated(row, fleet, evaluate))
                if stop is not None and stop(row):
                    break
                aggregation = Aggregation(server, flush.version + 1, fleet.influence, step=fleet.step)
            fill(now)
    return timeline


def run_sync(fleet: Fleet, rounds: int, data: Data, train: TrainSettings, timing: DeviceTiming, cohort: int,
             selected: int = 0, seed: int = 0, evaluate: Evaluate | None = None,
             until_s: float = math.inf, stop: Callable[[dict[str, Any]], bool] | None = None) -> Timeline:
    """Synchronous rounds on the simulated clock: ``selected`` clients drawn each round (0: ``cohort``), the
    ``cohort`` fastest kept, the round lasting until the last of those arrives; ``until_s`` and ``stop`` as for
    ``run_async``."""
    selected = selected or cohort
    if not 0 < cohort <= selected <= len(fleet.clients):
        raise ValueError(f"need 0 < cohort ({cohort}) <= selected ({selected}) <= clients ({len(fleet.clients)})")
    timeline = Timeline()
    task_id = 0
    for number in range(1, rounds + 1):
        rng = np.random.default_rng([seed, number])
        chosen = sorted(int(i) for i in rng.choice(len(fleet.clients), size=selected, replace=False))
        durations = {}
        for index in chosen:
            task_id += 1
            durations[index] = timing.duration(index, task_id, planned_steps(int(data[index][1].shape[0]), train))
        kept = sorted(sorted(chosen, key=lambda i: (durations[i], i))[:cohort])
        took = max(durations[i] for i in kept)
        if timeline.clock + took > until_s:
            break
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
