"""The seam the hostile cells stand on: frames in, the closed round's server state out.

``record(mode)`` plays a short session of ``mode`` once, as ``coordinator start`` plays a simulated fleet (the real
``Session``, ``coordinator.rounds`` or ``coordinator.asynchronous``, the logical clients trained inline), and keeps
every frame each device sent, by the task it answered. ``replay(mode, recording, attacked)`` then plays the same
session again with no training: a ``ReplayTransport`` answers each Task with the frames recorded for it, except
the attacked device's chosen task, answered with the frames given (a mutation of the honest ones, or nothing). It
returns the closed round's server state as bytes (the server half's ``state_dict`` arrays and meta, and the server
step's), every warning the coordinator logged, and the exception that escaped the session, if one did.

Under central differential privacy the session's noise generators are pinned to one seed in every replay, so that
two rounds with the same clipped sum give the same bytes (the seam: ``SessionPrivacy.generators``). A securely aggregated
round's coordinator draws its graph seed from the OS, so ``live`` plays those sessions with their logical clients
training (each device's noise and rounding seeded: ``secagg.distributed.device_noise_rng`` pinned, and the
coordinator's rotation seed: ``PinnedSecrets``) and rewrites the attacked device's stage message in flight. Only this module knows how a session is put together; a refactor of
the engine changes this file, not the cells.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import tempfile
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedge import codec
from fedge.plumbing import without_fsync

RUN_ID = "hostile"
DATASET = "fmnist-demo"
MODEL = "tests.hostile_rounds:small_mlp"  # the built-in MLP's layers on a pooled image: 1,242 values, not 199,210
SMALL = (f"model.name={MODEL}", f"data.dataset={DATASET}", "data.partition=iid", "data.clients=4",
         "data.train_limit=16", "data.min_size=4", "train.batch_size=8", "run.rounds=2", "run.seed=5",
         "run.export_onnx=false", "fleet.mode=simulated", "fleet.backend=inline", "round.deadline_s=30",
         "eval.every=1000")
# the run directories of the replays: in memory where the system has a tmpfs there (thousands of short sessions)
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
ATTACKER = "agent-00"  # the attacked device, unless the server half does not select it (``attacker_of``)


@dataclass(frozen=True)
class Mode:
    """A composition under attack: its settings, the task of the attacker that is attacked (its n-th, 1-based:
    round n of a synchronous session), whether its rounds are securely aggregated (played live), and the mode whose
    recording it shares."""

    name: str
    sets: tuple[str, ...] = ()
    attacked: int = 2
    secure: bool = False
    records: str = ""  # the mode whose honest frames this one replays (its devices send the same), or itself

    @property
    def overrides(self) -> list[str]:
        return [*SMALL, *self.sets]


@dataclass
class Recording:
    hellos: list[tuple[bytes, bytes]]
    answers: dict[tuple[str, int], list[bytes]]  # (client id, task's round) -> the frames it sent for it
    tasks: dict[str, list[int]]  # client id -> the rounds (task ids) of its tasks, in order
    weight_cap: int = 0
    attacker: str = ATTACKER


def attacker_of(tasks: dict[str, list[int]], attacked: int) -> str:
    """agent-00, or (a server half that picks its cohort, as fedcos does) the first device given that many tasks."""
    able = sorted(c for c, rounds in tasks.items() if len(rounds) >= attacked)
    return ATTACKER if ATTACKER in able else able[0]


@dataclass
class Closed:
    """What a replay left: the server state's bytes by part, the warnings logged, an escaped exception."""

    state: dict[str, str]
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    attacker: str = ATTACKER

    def differs(self, other: Closed) -> list[str]:
        return sorted(k for k in {*self.state, *other.state} if self.state.get(k) != other.state.get(k))


class Clock:
    """A clock the replay moves: a poll with nothing to hand over lets its timeout pass at once."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance_to(self, when: float) -> None:
        self.now = max(self.now, when)


def small_mlp(input_shape: tuple[int, ...], num_outputs: int, options: dict[str, Any]) -> Any:
    """The built-in ``mlp`` (flatten, two hidden ReLU layers, the classes) on a 4x4-pooled image, 16 wide: a user's
    model plugin, as ``model.name`` names one. What the cells check is the updates' structure, not their size."""
    from torch import nn

    channels, height, width = input_shape
    return nn.Sequential(nn.AvgPool2d(4), nn.Flatten(), nn.Linear(channels * (height // 4) * (width // 4), 16),
                         nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, num_outputs))


def plan_of(mode: Mode) -> Any:
    """``mode``'s session as ``coordinator start`` plans it (on the data set every mode reads, loaded once)."""
    from fedge.coordinator.config import load_config
    from fedge.runtime.plan import plan_session

    config = load_config(None, mode.overrides)
    assert config.data.dataset == DATASET and not config.data.path, config.data
    return plan_session(config, dataset())


@functools.cache
def dataset() -> Any:
    """The data set of every mode, as ``plan_session`` loads it; the plans and sessions only read it."""
    from fedge.fldata import load_dataset

    return load_dataset(DATASET)


def make_session(plan: Any, run_dir: Any, transport: Any, clock: Any, agents: Sequence[str]) -> Any:
    """The session ``runtime.launch.play`` builds for a simulated fleet (no evaluator: the devices evaluate)."""
    from fedge.coordinator.session import Session
    from fedge.runtime.launch import NEVER_S, largest_shard

    config = plan.config
    config = dataclasses.replace(config, fleet=dataclasses.replace(config.fleet, heartbeat_s=NEVER_S,
                                                                   liveness_s=NEVER_S))
    return Session(config, run_dir, transport, plan.spec, len(agents), None, run_id=RUN_ID,
                   reserved_ids=list(agents), initial=plan.initial, welcome_extra=plan.welcome_extra(),
                   weight_cap=largest_shard(plan), privacy=plan.privacy, clock=clock)


def pin_noise(session: Any) -> None:
    """Every replay draws the same central-DP noise and cohort (the same seed), so that equal clipped sums close
    to equal bytes."""
    if session.privacy is not None:  # each draw and each release: a generator of the same seed
        session.privacy.generators = lambda: np.random.default_rng(20260101)


def state_bytes(session: Any) -> dict[str, str]:
    arrays, meta = session.server.state_dict()
    parts = {f"server/{k}": digest(v) for k, v in arrays.items()}
    parts.update({f"step/{k}": digest(v) for k, v in session.step.state_dict().items()})
    parts["server/meta"] = hashlib.sha256(json.dumps(meta, sort_keys=True, default=repr).encode()).hexdigest()
    parts["round"] = str(session.round)
    return parts


def digest(array: Any) -> str:
    a = np.asarray(array)
    return hashlib.sha256(f"{a.dtype}{a.shape}".encode() + np.ascontiguousarray(a).tobytes()).hexdigest()


@contextlib.contextmanager
def warnings_logged() -> Iterator[list[str]]:
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep(logging.WARNING)
    logger = logging.getLogger("fedge")
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


def round_of(frame: bytes) -> tuple[type | None, int]:
    kind = codec.packet_kind(frame)
    if kind is None:
        return None, -1
    return kind, codec.read_header(frame).round


# ----------------------------------------------------------------------------------------------- recording
class Recorder:
    """A simulated fleet whose clients' frames are kept, by (client, task round), as they go to the session."""

    def __init__(self, fleet: Any) -> None:
        self.fleet = fleet
        self.hellos: list[tuple[bytes, bytes]] = []
        self.answers: dict[tuple[str, int], list[bytes]] = {}
        self.tasks: dict[str, list[int]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fleet, name)

    def send(self, peer: bytes, frame: bytes) -> bool:
        kind, number = round_of(frame)
        if kind is codec.Task:
            self.tasks.setdefault(peer.decode(), []).append(number)
        return bool(self.fleet.send(peer, frame))

    def send_parts(self, peer: bytes, parts: list[bytes]) -> bool:
        return self.send(peer, b"".join(parts))

    def poll(self, timeout_ms: int) -> Iterator[tuple[bytes, bytes, str | None]]:
        for peer, frame, identity in self.fleet.poll(timeout_ms):
            kind, number = round_of(frame)
            if kind is codec.Hello and not self.answers:
                self.hellos.append((peer, frame))
            elif kind is codec.Update:
                self.answers.setdefault((peer.decode(), number), []).append(frame)
            yield peer, frame, identity


def fleet_of(plan: Any, run_dir: Any) -> tuple[Any, list[str]]:
    from fedge.runtime.launch import prepare_local_fleet, simulated_fleet
    from fedge.simulation.backends import InlineBackend

    agents = prepare_local_fleet(plan, run_dir)
    return simulated_fleet(plan, agents, InlineBackend()), [a.client_id for a in agents]


def record(mode: Mode, plan: Any | None = None) -> Recording:
    """Play ``mode``'s session once with its clients training; every frame each device sent, by task."""
    from fedge.coordinator.rundir import RunDir
    from fedge.runtime.launch import largest_shard

    plan = plan or plan_of(mode)
    with tempfile.TemporaryDirectory(prefix="fedge-hostile-", dir=SCRATCH) as tmp, without_fsync():
        run_dir = RunDir(Path(tmp) / "run")
        fleet, agents = fleet_of(plan, run_dir)
        recorder = Recorder(fleet)
        session = make_session(plan, run_dir, recorder, None, agents)
        pin_noise(session)
        status = session.run(len(agents), 10.0)
        assert status == "done", status
        return Recording(recorder.hellos, recorder.answers, recorder.tasks, largest_shard(plan),
                         attacker_of(recorder.tasks, mode.attacked))


# ----------------------------------------------------------------------------------------------- replaying
STALL_POLLS = 400


class Stalled(RuntimeError):
    """The replayed session waits for frames no device will send (a round or version that never closes)."""


class ReplayTransport:
    """A transport whose devices answer each Task with the frames recorded for it; the attacked device's
    ``attacked``-th task is answered with ``frames`` instead, sent first."""

    curve = False

    def __init__(self, recording: Recording, clock: Clock, attacked: int, frames: list[bytes] | None) -> None:
        self.recording = recording
        self.clock = clock
        self.attacked = attacked
        self.frames = frames
        self.outbox: deque[tuple[bytes, bytes]] = deque(recording.hellos)
        self.seen: dict[str, int] = {}
        self.endpoint = "replay://"
        self.idle = 0
        self.horizon = float("inf")

    def send(self, peer: bytes, frame: bytes) -> bool:
        kind, number = round_of(frame)
        if kind is not codec.Task:
            return True
        client = peer.decode()
        self.seen[client] = self.seen.get(client, 0) + 1
        if client == self.recording.attacker and self.seen[client] == self.attacked and self.frames is not None:
            self.outbox.extendleft((peer, f) for f in reversed(self.frames))
            return True
        self.outbox.extend((peer, f) for f in self.recording.answers.get((client, number), []))
        return True

    def send_parts(self, peer: bytes, parts: list[bytes]) -> bool:
        return self.send(peer, b"".join(parts))

    def poll(self, timeout_ms: int) -> Iterator[tuple[bytes, bytes, str | None]]:
        if not self.outbox:
            self.idle += 1
            if self.idle > STALL_POLLS:
                raise Stalled(f"the session still waits after {STALL_POLLS} polls with nothing left to hand over "
                              f"(clock {self.clock.now:.0f} s)")
            self.clock.advance_to(min(self.clock.now + max(timeout_ms, 1000) / 1000 * 5, self.horizon))
            if self.clock.now >= self.horizon:
                self.clock.now = self.horizon
            return
        while self.outbox:
            peer, frame = self.outbox.popleft()
            yield peer, frame, None

    def present(self) -> int:
        return len(self.recording.hellos)

    def close(self) -> None:
        return None


def earlier_answers(recording: Recording, mode: Mode) -> tuple[bytes, list[bytes]]:
    """The attacker's honest frame for its attacked task, and its frames of the tasks before."""
    rounds = recording.tasks[recording.attacker]
    honest = recording.answers[(recording.attacker, rounds[mode.attacked - 1])]
    earlier = [f for r in rounds[: mode.attacked - 1] for f in recording.answers.get((recording.attacker, r), [])]
    return honest[0], earlier


def replay(mode: Mode, plan: Any, recording: Recording, frames: list[bytes] | None) -> Closed:
    """Play ``mode``'s session again from the recorded frames, the attacker's attacked task answered with
    ``frames`` (None: as recorded; []: nothing); the state its last round (or version) closed to."""
    from fedge.coordinator.rundir import RunDir

    with tempfile.TemporaryDirectory(prefix="fedge-hostile-", dir=SCRATCH) as tmp, warnings_logged() as warnings, \
            without_fsync():
        clock = Clock()
        transport = ReplayTransport(recording, clock, mode.attacked, frames)
        agents = [peer.decode() for peer, _ in recording.hellos]
        error = None
        session = None
        try:
            session = make_session(plan, RunDir(Path(tmp) / "run"), transport, clock, agents)
            pin_noise(session)
            session.run(len(agents), 10.0)
        except Exception as exc:  # the cell's invariant: nothing a device sends makes one escape
            error = f"{type(exc).__name__}: {exc}"
        state = state_bytes(session) if session is not None else {}
        return Closed(state, list(warnings), error, recording.attacker)


def with_samples(frame: bytes, count: int) -> bytes:
    return codec.encode(dataclasses.replace(_update(frame), num_samples=count))


def _update(frame: bytes) -> codec.Update:
    message = codec.decode(frame)
    assert isinstance(message, codec.Update)
    return message


# ----------------------------------------------------------------------------------------------- live (secure)
class Rewriter:
    """A simulated fleet whose attacked device's first message of ``kind`` in its ``attacked``-th task's round is
    replaced by the frames ``change`` makes of it (None: dropped) on its way to the session."""

    def __init__(self, fleet: Any, kind: type, change: Callable[[bytes], list[bytes]] | None, attacked: int) -> None:
        self.fleet, self.kind, self.change, self.attacked = fleet, kind, change, attacked
        self.tasks = 0
        self.task_round = -1
        self.done = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fleet, name)

    def send(self, peer: bytes, frame: bytes) -> bool:
        kind, number = round_of(frame)
        if kind is codec.Task and peer.decode() == ATTACKER:
            self.tasks += 1
            if self.tasks == self.attacked:
                self.task_round = number
        return bool(self.fleet.send(peer, frame))

    def send_parts(self, peer: bytes, parts: list[bytes]) -> bool:
        return self.send(peer, b"".join(parts))

    def poll(self, timeout_ms: int) -> Iterator[tuple[bytes, bytes, str | None]]:
        for peer, frame, identity in self.fleet.poll(timeout_ms):
            kind, number = round_of(frame)
            if not self.done and peer.decode() == ATTACKER and kind is self.kind and number == self.task_round:
                self.done = True
                for sent in ([] if self.change is None else self.change(frame)):
                    yield peer, sent, identity
                continue
            yield peer, frame, identity


class PinnedSecrets:
    """Stands for the ``secrets`` module where the coordinator draws a round's rotation seed for distributed noise
    (``coordinator.distributed``, which has no other seam): the same seed in every live session."""

    @staticmethod
    def randbits(k: int) -> int:
        return 20260101 % (1 << k)


@contextlib.contextmanager
def seeded_device_noise() -> Iterator[None]:
    """Each device's distributed noise from one seed (the seam: ``secagg.distributed.device_noise_rng``), and the
    coordinator's rotation seed pinned (``PinnedSecrets``)."""
    from fedge.coordinator import distributed as coordinator_side
    from fedge.secagg import distributed

    honest, drawn = distributed.device_noise_rng, coordinator_side.secrets
    distributed.device_noise_rng = lambda: np.random.default_rng(7)  # type: ignore[assignment]
    coordinator_side.secrets = PinnedSecrets  # type: ignore[assignment]
    try:
        yield
    finally:
        distributed.device_noise_rng = honest  # type: ignore[assignment]
        coordinator_side.secrets = drawn


def live(mode: Mode, plan: Any, kind: type, change: Callable[[bytes], list[bytes]] | None) -> Closed:
    """Play ``mode``'s session with training, the attacker's ``kind`` message of its attacked round rewritten."""
    from fedge.coordinator.rundir import RunDir

    with tempfile.TemporaryDirectory(prefix="fedge-hostile-", dir=SCRATCH) as tmp, warnings_logged() as warnings, \
            seeded_device_noise(), without_fsync():
        run_dir = RunDir(Path(tmp) / "run")
        fleet, agents = fleet_of(plan, run_dir)
        transport = Rewriter(fleet, kind, change, mode.attacked)
        error = None
        session = None
        try:
            session = make_session(plan, run_dir, transport, fleet.clock, agents)
            pin_noise(session)
            session.run(len(agents), 10.0)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        state = state_bytes(session) if session is not None else {}
        return Closed(state, list(warnings), error)
