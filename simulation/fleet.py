"""The simulated fleet: a transport under the unchanged ``Session`` whose peers are logical clients, not sockets.

``SimulatedFleet`` offers what ``coordinator.transport.RouterTransport`` offers (``poll``, ``send``, ``close``, the
endpoint and byte counts), so the coordinator's protocol object, validation, records and checkpoint run exactly as
for a fleet of devices. Each logical client is an ``AgentProtocol`` (``protocol.agent``, the agent's own rules)
fed the real packets the coordinator sends: its Hello is real, it joins on the real Welcome, a Task becomes a
``Job`` for the backend (``simulation.backends``: inline, a process pool or Ray actors), the Update packet the
worker returns goes back through the client's protocol (a paced task waits for its grant, a cancelled one is not
sent), a Commit promotes the client's pending device state in its own directory (``client.state``, two phases). The
clock is the real one (heartbeats keep the clients live in the coordinator's registry while they wait their turn), or,
given a ``SimulatedClock`` and a ``DeviceTiming`` (``fleet.clock = "simulated"``), a simulated one: each job's
finish time is fixed when it is sent (its planned steps and its Task's bytes, ``simulation.timing``), and ``poll``
hands over the results in order of (finish time, job number), waiting for a job's worker when it has not finished,
and moves the clock to each result's time; with no job out, a poll lets its timeout pass on the clock. Whichever
worker returns first, the session then sees the same events in the same order, so a run is the same bit for bit on
every backend. On the simulated clock the fleet's state goes into the session's checkpoint (``checkpoint_state``:
the jobs out, with their finish times, job numbers and Task packets, and the Welcome of each client holding one)
and comes back at a resume (``restore``): each such client is rebuilt holding its task, as a device that kept
training while its coordinator restarted, and says hello naming it (a hello queued like any message: no result is
handed over, and the clock does not move, while the queue holds one). So a resumed run is the run it would have been
without the crash, bit for bit. ``ScriptedFleet`` hands over no result until told which (``deliver``): ``coordinator replay`` plays a
run's dispatch journal through it, each update in the order the run received it.
No sockets and no algorithm by name; the coordinator never imports this module except in ``coordinator start``.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from fedge import codec
from fedge.exhaustive import assert_never
from fedge.protocol.events import (
    AgentAction,
    CancelTraining,
    Confirm,
    Join,
    Left,
    Masked,
    Noted,
    Outcome,
    Reconnect,
    Send,
    SendFrame,
    Stop,
    Train,
)
from fedge.simulation.backends import Backend
from fedge.simulation.client import LogicalClient, simulated_facts
from fedge.simulation.schedule import JobSchedule, Move
from fedge.simulation.timing import DeviceTiming, SimulatedClock
from fedge.simulation.worker import ClientFiles, Job, WorkerRule

log = logging.getLogger("fedge.simulation")



class SimulatedFleet:
    """Logical clients behind a transport's interface; ``poll`` also drives their clocks and the backend."""

    curve = False

    def __init__(self, clients: Sequence[ClientFiles], backend: Backend, input_shape: tuple[int, ...],
                 num_outputs: int, dataset_sizes: Sequence[int], rule: WorkerRule | None = None,
                 owns_backend: bool = True, clock: SimulatedClock | None = None,
                 timing: DeviceTiming | None = None, steps: Callable[[int], int] | None = None,
                 budget: Callable[[str, int], int] | None = None) -> None:
        self.clients = {c.client_id: c for c in clients}
        self.backend = backend
        self.owns_backend = owns_backend  # closed with the fleet (a backend handed in by the caller is the caller's)
        self.rule = rule or WorkerRule()
        self.input_shape = tuple(input_shape)
        self.num_outputs = num_outputs
        self.logical = {c.client_id: LogicalClient(c.client_id, c.state_dir,
                                                   simulated_facts(int(n), self.input_shape, num_outputs))
                        for c, n in zip(clients, dataset_sizes, strict=True)}
        self.protocols = {client_id: c.protocol for client_id, c in self.logical.items()}
        self.outbox: collections.deque[tuple[bytes, bytes]] = collections.deque()
        self.endpoint = f"simulated://{len(clients)}-clients/{backend.__class__.__name__}/{backend.workers}-workers"
        self.bytes_in = 0
        self.bytes_out = 0
        self.stopped: set[str] = set()  # clients whose session ended: they say and hear nothing more
        if clock is not None and (timing is None or steps is None):
            raise ValueError("a simulated clock needs the devices' timing and each client's planned steps")
        self.clock = clock
        self.now: Callable[[], float] = clock if clock is not None else time.monotonic
        self.steps = steps  # a client's planned steps a task, by its dataset size
        self.sizes = {c.client_id: int(n) for c, n in zip(clients, dataset_sizes, strict=True)}
        # the simulated clock's calendar (jobs out, the trace's moves; ``simulation.schedule``)
        self.schedule = JobSchedule(timing, [c.client_id for c in clients]) if timing is not None else None
        self.away = self.schedule.absent_at(0.0) if self.schedule is not None else set()  # the trace keeps away
        self.done: dict[tuple[str, int], Outcome] = {}  # results back before their turn
        self.horizon = float("inf")  # the session's next deadline: the simulated clock does not pass it
        self.budget = budget  # (client id, task's round) -> that task's work budget in steps (0: none)
        self.packets: dict[tuple[str, int], bytes] = {}  # simulated clock: each job out's Task packet (checkpoint)

    # ------------------------------------------------------------------------------------------ the transport
    def send(self, peer: bytes, frame: bytes) -> bool:
        """Hand a frame of the coordinator to the client ``peer``; False for a client that does not exist."""
        client_id = peer.decode(errors="replace")
        protocol = self.protocols.get(client_id)
        if protocol is None or client_id in self.stopped or client_id in self.away:
            return False
        self.bytes_out += len(frame)
        self.act(client_id, protocol.receive(frame, self.now()), frame)
        return True

    def present(self) -> int:
        """How many clients are there now (all but those a trace keeps away)."""
        return len(self.clients) - len(self.away)

    def send_parts(self, peer: bytes, parts: list[bytes]) -> bool:
        """A message of several frames (a Task's header and body): the packet is their concatenation."""
        return self.send(peer, b"".join(parts))

    def poll(self, timeout_ms: int, batch: int = 1000) -> Iterator[tuple[bytes, bytes, str | None]]:
        """What the clients sent: finished updates (or failures), heartbeats, hellos, byes; as the router's poll
        gives them, one at a time (what the driver does not take stays queued), with no key identity (no CurveZMQ:
        the clients are this process's own)."""
        outcomes = self.outcomes(timeout_ms)
        now = self.now()
        for client_id, protocol in self.protocols.items():  # first, so that a clock that jumped finds them live
            if client_id not in self.stopped and client_id not in self.away:
                self.act(client_id, protocol.tick(now))
        for outcome in outcomes:
            protocol = self.protocols[outcome.client_id]
            self.act(outcome.client_id, protocol.finished(outcome.round, outcome.frame, outcome.error))
        for _ in range(batch):
            if not self.outbox:
                return
            peer, frame = self.outbox.popleft()
            self.bytes_in += len(frame)
            yield peer, frame, None

    def outcomes(self, timeout_ms: int) -> list[Outcome]:
        """The results to hand over now: as the backend gives them (real clock); or the next due, the clock moved
        to its finish time (simulated clock)."""
        if self.clock is None:
            return self.backend.results(0.0 if self.outbox else timeout_ms / 1000)
        if self.outbox:
            return []
        assert self.schedule is not None
        while True:
            when, what = self.schedule.next(self.clock(), self.horizon, timeout_ms / 1000)
            for key in self.schedule.skipped:  # cancelled jobs: collected, never waited for
                self.collect(*key)
                self.packets.pop(key, None)
            self.schedule.skipped.clear()
            self.clock.advance_to(when)
            if what is None:
                return []
            if isinstance(what, Move):
                self.move(what)
                return []  # its bye or hello goes out on this poll
            _, _, client_id, round_number, uploading = what
            outcome = self.collect(client_id, round_number)
            if not uploading and self.schedule.timing.bandwidth_bps > 0 and outcome.frame is not None:
                self.done[(client_id, round_number)] = outcome  # trained: its update goes up the link first
                self.schedule.upload(what, len(outcome.frame))
                continue
            self.packets.pop((client_id, round_number), None)
            return [outcome]

    def move(self, move: Move) -> None:
        """A trace's move: a device that goes says goodbye and drops the task it held (so the coordinator stops
        waiting for it); one that comes says hello on its next tick."""
        if move.there:  # its hello at once (as after a restart, not when its hello interval would next allow)
            self.away.discard(move.client_id)
            if move.client_id not in self.stopped:
                self.outbox.append((self.logical[move.client_id].peer, self.logical[move.client_id].hello_frame()))
                self.protocols[move.client_id].last_hello = move.time
            return
        if move.client_id in self.stopped or move.client_id in self.away:
            return
        protocol = self.protocols[move.client_id]
        self.act(move.client_id, [*protocol.leaving(), *protocol.leave_session()])
        self.away.add(move.client_id)

    def collect(self, client_id: str, round_number: int) -> Outcome:
        """The result of one job, waiting for its worker if it has not come back yet (others that come meanwhile
        are kept for their turn)."""
        while (client_id, round_number) not in self.done:
            for outcome in self.backend.results(1.0):
                self.done[(outcome.client_id, outcome.round)] = outcome
        return self.done.pop((client_id, round_number))

    # ------------------------------------------------------------------------------------------ checkpoint
    def checkpoint_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
        """The simulated clock's jobs out, for the session's checkpoint: (arrays: each job's Task packet and its
        client's Welcome, as bytes; meta). None on the real clock (its devices say hello without their tasks)."""
        if self.schedule is None:
            return None
        state = self.schedule.state()
        arrays: dict[str, np.ndarray] = {}
        for _, job, client_id, round_number, _ in state["due"]:
            arrays[f"fleet/task/{job}"] = np.frombuffer(self.packets[(client_id, round_number)], dtype=np.uint8)
            arrays[f"fleet/welcome/{client_id}"] = np.frombuffer(self.logical[client_id].welcome_frame, np.uint8)
        return arrays, {**state, "away": sorted(self.away)}

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Take up the jobs a checkpoint held: each client rebuilt in its session holding its task (its Welcome and
        Task packets received again), the job trained again with its finish time and number, and the client's hello
        naming its task queued."""
        assert self.schedule is not None
        now = self.now()
        self.away = set(meta.get("away", ()))
        for _, job, client_id, _, _ in self.schedule.restore(meta):
            client, frame = self.logical[client_id], arrays[f"fleet/task/{job}"].tobytes()
            welcome = arrays[f"fleet/welcome/{client_id}"].tobytes()  # (a client holds one task at most)
            self.act(client_id, client.protocol.receive(welcome, now), welcome)
            self.act(client_id, client.protocol.receive(frame, now), frame)
            self.outbox.append((client.peer, client.hello_frame()))

    def close(self) -> None:
        if self.owns_backend:
            self.backend.close()

    # ------------------------------------------------------------------------------------------ the clients
    def act(self, client_id: str, actions: Sequence[AgentAction], frame: bytes = b"") -> None:
        """Carry out a client protocol's decisions, as an agent's driver does."""
        client = self.logical[client_id]
        for action in actions:
            match action:
                case Send(message=message):
                    self.outbox.append((client.peer, codec.encode(message)))
                case SendFrame(frame=update):
                    self.outbox.append((client.peer, update))
                case Join(welcome=welcome):
                    client.joined(welcome, frame)
                case Train(task=task):
                    budget = self.budget(client_id, task.round) if self.budget is not None else 0
                    if self.schedule is not None:  # its finish (a resumed job: the checkpoint's) and its budget
                        assert self.steps is not None
                        budget = self.schedule.add(client_id, task.round, self.steps(self.sizes[client_id]),
                                                   len(frame), self.now())
                        self.packets[(client_id, task.round)] = frame
                    self.backend.submit(Job(self.clients[client_id], client.welcome_frame, frame, self.rule,
                                            budget))
                case Masked(run_id=run_id, round=round_number):
                    client.state().note_masked(run_id, round_number)
                case Confirm(round=round_number):
                    if not client.confirm(round_number):
                        log.warning("client %s had no pending state of round %d to commit", client_id, round_number)
                case Noted(level=level, text=text):
                    log.log(min(level, logging.INFO), "client %s: %s", client_id, text)
                case Stop():  # the session ended: the client's goodbye, as an agent's on leaving
                    self.stopped.add(client_id)
                    self.act(client_id, client.protocol.leaving())
                case CancelTraining(round=round_number):  # its result is dropped by the protocol, and on a simulated
                    if self.schedule is not None:                # clock it takes no time
                        self.schedule.drop(client_id, round_number)
                case Left():
                    continue  # clients do not stay for another session
                case Reconnect():
                    continue  # a logical client has no connection
                case _:
                    assert_never(action)


class ScriptedFleet(SimulatedFleet):
    """A simulated fleet whose results wait until ``deliver`` names them: the driver decides the order in which the
    coordinator receives the updates (``coordinator replay``: the order a run's journal recorded). The clock is the
    real one; nothing in a replay reads it but the records."""

    def outcomes(self, timeout_ms: int) -> list[Outcome]:
        return []

    def deliver(self, client_id: str, round_number: int) -> None:
        """Hand the result of ``client_id``'s task ``round_number`` (waiting for its worker) to the client's
        protocol, as its training ending: its Update (or failure report) goes out on the next poll."""
        outcome = self.collect(client_id, round_number)
        self.act(client_id, self.protocols[client_id].finished(outcome.round, outcome.frame, outcome.error))
