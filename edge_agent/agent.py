"""The agent loop: register with the coordinator, train on each task, send the update, keep device state.

The main thread owns the DEALER socket: it says hello (again, whenever the coordinator seems to have gone), sends
heartbeats, receives tasks, commits and byes. Local training runs in a worker thread so that heartbeats continue
during a long step. The agent reads only its own data (``client.data``). Its algorithm's client half, model and
task are built from the session settings in the coordinator's welcome, after the welcome's plugin names have passed
this device's rule (``fedge.plugins.check_allowed``: nothing the network names is imported otherwise). Its device
state is committed in two phases (``client.state``). Must not know any algorithm by name.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

import fedge
from fedge import codec
from fedge.algorithms.loop import TrainingCancelled
from fedge.client.data import DeviceData
from fedge.client.joining import (
    JoinedSession,
    Refused,
    data_tensors,
    inference_meta,
    join_session,
    training_device,
)
from fedge.client.round import play_task, update_frame
from fedge.client.state import DeviceState
from fedge.edge_agent.availability import read_readings, why_not
from fedge.edge_agent.config import AgentSettings
from fedge.edge_agent.transport import CurveClientKeys, DealerTransport, tcp_peer
from fedge.exhaustive import assert_never
from fedge.meter import AgentMeter
from fedge.plumbing import hold_directory
from fedge.plumbing.forking import ParentWatch
from fedge.plumbing.memory import trim_heap
from fedge.protocol.agent import AgentProtocol, DeviceFacts
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

log = logging.getLogger("fedge.agent")



class Agent:
    """One edge agent; ``run()`` returns a process exit code."""

    def __init__(self, settings: AgentSettings, parent_pid: int | None = None, data: DeviceData | None = None) -> None:
        self.settings = settings
        # stop when the process that started this agent is gone (a forked agent's parent is a server that outlives it)
        self.parent_gone: Callable[[], bool] = ParentWatch(parent_pid).gone if parent_pid is not None \
            else lambda: False
        self.stop_requested = threading.Event()
        self.cancel_requested = threading.Event()  # the coordinator cancelled the round being trained
        self.wake: Callable[[], None] = lambda: None  # ends the main loop's poll (the transport's, once serving)
        self.data = data or DeviceData.open(settings.data)  # first: bad data is refused before anything is written
        self.state = DeviceState(settings.state_dir, settings.keep_sessions)
        self.device = training_device(settings.device)
        self.session: JoinedSession | None = None
        self.worker: threading.Thread | None = None
        self.outcome: Outcome | None = None
        facts = DeviceFacts(fedge_version=fedge.__version__, torch_version=torch.__version__,
                            dataset_size=int(self.data.train_y.shape[0]), device=str(self.device),
                            input_shape=tuple(self.data.input_shape), num_outputs=self.data.num_outputs)
        self.protocol = AgentProtocol(settings.client_id, settings.hello_interval_s, facts,
                                      stay=settings.after_session == "wait")
        self.protocol.masked_before = self.state.masked_rounds()  # the restart rule of secure aggregation
        self.progress = 0      # main-loop iterations and messages handled
        self.train_steps = 0   # optimizer steps taken by the training thread
        self.exit_code = 0
        self.meter = AgentMeter(energy=settings.energy)
        self.handshakes_counted = 0
        self.train_steps_at_start = 0
        self.show_status: Callable[[str], None] = lambda _status: None  # the service's status line

    # ------------------------------------------------------------------------------------------------ wire
    def send(self, transport: DealerTransport, message: codec.Message) -> None:
        frame = codec.encode(message)
        if transport.send(frame):
            self.meter.add_bytes("up", len(frame))

    def on_join(self, transport: DealerTransport, welcome: codec.Welcome) -> None:
        try:
            session = self.join(welcome)
        except Refused as refusal:
            self.session = None
            self.act(transport, self.protocol.refuse(refusal.code, str(refusal), time.monotonic()))
            return
        self.session = session
        self.protocol.joined(session.run_id, session.index, session.heartbeat_s, session.liveness_s,
                             session.welcome.seed)
        self.begin_session(session)

    def join(self, welcome: codec.Welcome) -> JoinedSession:
        """The session the welcome describes (``client.joining``), with this device's data as tensors."""
        session, self.tensors = join_session(self.settings, self.data, self.device, welcome)
        return session

    def load_tensors(self, session: JoinedSession, data: DeviceData) -> None:
        self.tensors = data_tensors(session, data, self.device)

    def begin_session(self, session: JoinedSession) -> None:
        count = int(self.tensors.labels.shape[0])
        batch_size = session.train.batch_size
        sizes = [batch_size] + ([count % batch_size] if count % batch_size else [])
        self.meter.prepare_training(session.model, tuple(self.tensors.inputs.shape[1:]), sizes)
        with contextlib.suppress(RuntimeError):  # a window is already open after a re-welcome
            self.meter.begin_round(0)
        log.info("joined run %s as client %d: %s with %s, %d samples on %s", session.run_id, session.index,
                 session.welcome.model["name"], session.welcome.algorithm, count, self.device)

    # ------------------------------------------------------------------------------------------------ round
    def start_task(self, task: codec.Task, decode_cpu_s: float) -> None:
        session = self.session
        if session is None:  # the protocol trains only in a joined session
            raise RuntimeError("a task before the session was joined")
        previous = self.worker
        if previous is not None and previous.is_alive():  # a cancelled round: it stops at its next step
            self.cancel_requested.set()
            previous.join(timeout=120)
        self.outcome = None
        self.cancel_requested.clear()
        self.train_steps_at_start = self.train_steps
        self.worker = threading.Thread(target=self.train_round, args=(session, task, decode_cpu_s), daemon=True,
                                       name=f"train-round-{task.round}")
        self.worker.start()

    def train_round(self, session: JoinedSession, task: codec.Task, decode_cpu_s: float) -> None:
        """The training thread: one task, its outcome then acted on by the main loop, which it wakes."""
        try:
            self.play_round(session, task, decode_cpu_s)
        finally:
            self.wake()

    def play_round(self, session: JoinedSession, task: codec.Task, decode_cpu_s: float) -> None:
        try:
            if self.settings.data_refresh == "every-task" and self.data.from_callable:
                self.data = self.data.refresh()
                if self.data.input_shape != tuple(self.tensors.inputs.shape[1:]):
                    raise ValueError(f"the data callable now returns samples shaped {self.data.input_shape}")
                self.load_tensors(session, self.data)
            result = play_task(session, self.tensors, self.state, task, self.meter, cancelled=self.step,
                               inference_meta=inference_meta(session, self.data), spent=self.budget())
            record = self.close_meter_window(task.round)
            record["cpu_s_decode"] = decode_cpu_s
            frame = update_frame(session, self.settings.client_id, result, record)
            del result
            trim_heap()
            self.outcome = Outcome(task.round, frame)
        except TrainingCancelled:
            why = "the coordinator cancelled it" if self.cancel_requested.is_set() else "the agent is stopping"
            log.info("round %d abandoned: %s (its costs are metered in the next round's record)", task.round, why)
            return
        except Exception as exc:  # a failed round is reported, never fatal for the agent
            log.exception("round %d failed", task.round)
            self.outcome = Outcome(task.round, None, f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(RuntimeError):
                self.close_meter_window(task.round)

    def budget(self) -> Callable[[int], bool] | None:
        """This device's work budget for a round (agent.max_steps, agent.max_seconds), or None."""
        max_steps, max_seconds = self.settings.max_steps, self.settings.max_seconds
        if not max_steps and not max_seconds:
            return None
        started = time.monotonic()
        return lambda steps: bool((max_steps and steps >= max_steps) or
                                  (max_seconds and time.monotonic() - started >= max_seconds))

    def step(self) -> bool:
        """Called by the training loop before each step: count it (the watchdog's progress while training) and
        say whether to stop (the agent is stopping, or the coordinator cancelled the round)."""
        self.train_steps += 1
        if self.settings.step_delay_s:  # a slower board, emulated (agent.step_delay_s); a cancel cuts it short
            self.cancel_requested.wait(self.settings.step_delay_s)
        return self.stop_requested.is_set() or self.cancel_requested.is_set()

    def watchdog_count(self) -> int:
        """What systemd's watchdog sees as progress: training steps while a round trains (a hung step stops the
        pings although the main loop still turns), the main loop otherwise."""
        if self.worker is not None and self.worker.is_alive():
            return self.train_steps
        return self.progress + self.train_steps

    def close_meter_window(self, round_number: int) -> dict[str, Any]:
        """End the meter's window and open the next one at once: windows tile time, so every byte, joule and CPU
        second (waiting included) is counted in exactly one round's record, that of the task that ends it."""
        record = self.meter.end_round()
        record["round"] = round_number
        self.meter.begin_round(round_number + 1)
        return record

    def unavailable(self) -> str:
        """Why this device may not train now by its ``[availability]`` rules, or ''."""
        rules = self.settings.availability
        return why_not(rules, read_readings()) if rules.any else ""

    def leave_session(self, transport: DealerTransport, run_id: str) -> None:
        """The session finished; the agent stays up: its goodbye, then nothing of the session is kept in memory
        (its committed state stays on disk). The next welcome builds a new session."""
        if self.worker is not None and self.worker.is_alive():
            self.cancel_requested.set()
            self.worker.join(timeout=60)
        self.send(transport, codec.Bye(run_id=run_id, round=0, sender=self.settings.client_id,
                                       code=codec.vocabulary.BYE_STOPPING, reason="session finished; staying up"))
        self.session, self.outcome = None, None
        trim_heap()
        log.info("session %s finished; waiting for the next one", run_id)

    def on_commit(self, round_number: int) -> None:
        if self.session is not None and self.state.confirm(self.session.run_id, round_number):
            log.info("round %d committed", round_number)

    # ------------------------------------------------------------------------------------------------ loop
    def act(self, transport: DealerTransport, actions: list[AgentAction], decode_cpu_s: float = 0.0) -> None:
        """Carry out what the protocol decided, in its order."""
        for action in actions:
            match action:
                case Send(message=message):
                    self.send(transport, message)
                case SendFrame(frame=frame, round=round_number):
                    transport.send(frame)  # its bytes are counted where they arrive (the coordinator)
                    log.info("round %d: sent update (%d bytes)", round_number, len(frame))
                case CancelTraining():
                    if self.worker is not None and self.worker.is_alive():
                        self.cancel_requested.set()
                case Join(welcome=welcome):
                    self.on_join(transport, welcome)
                case Train(task=task):
                    reason = self.unavailable()
                    if reason:
                        self.act(transport, self.protocol.decline_task(task.round, reason))
                    else:
                        self.start_task(task, decode_cpu_s)
                case Confirm(round=round_number):
                    self.on_commit(round_number)
                case Masked(run_id=run_id, round=round_number):
                    self.state.note_masked(run_id, round_number)
                case Left(run_id=run_id):
                    self.leave_session(transport, run_id)
                case Stop(exit_code=exit_code):
                    self.exit_code = exit_code
                    self.stop_requested.set()
                case Noted(level=level, text=text):
                    log.log(level, "%s", text)
                case Reconnect():
                    transport.reconnect()
                case _:
                    assert_never(action)

    def handle(self, transport: DealerTransport, frame: bytes, parts: tuple[int, ...] | None = None) -> None:
        """One packet from the coordinator; ``parts``: the sizes of the ZeroMQ frames it came in (the meter's
        framing bytes)."""
        self.meter.add_bytes("down", len(frame), parts)
        cpu_before = time.thread_time()
        actions = self.protocol.receive(frame, time.monotonic())
        self.progress += 1
        self.act(transport, actions, time.thread_time() - cpu_before)

    def tick(self, transport: DealerTransport) -> None:
        now = time.monotonic()
        outcome = self.outcome
        if outcome is not None and self.worker is not None and self.worker.is_alive():
            self.worker.join(timeout=5)  # setting its outcome is among its last acts: the thread is ending
        if outcome is not None and (self.worker is None or not self.worker.is_alive()):
            self.outcome = None
            self.act(transport, self.protocol.finished(outcome.round, outcome.frame, outcome.error))
        elif outcome is None and self.protocol.holding is not None and \
                (self.worker is None or not self.worker.is_alive()):
            self.protocol.abandoned()
        if transport.handshakes > self.handshakes_counted:  # before the clock's hello: one hello, not two
            self.handshakes_counted = transport.handshakes
            self.meter.add_connection("DEALER", "ROUTER", identity=transport.routing_id,
                                      mechanism="CURVE" if transport.curve else "NULL")
            self.act(transport, [self.protocol.hello_now(now)])  # a new connection: perhaps a restarted coordinator
        training = self.worker is not None and self.worker.is_alive()
        self.act(transport, self.protocol.tick(now, self.train_steps - self.train_steps_at_start if training else 0))
        self.show_status(self.protocol.status(training))
        if self.parent_gone():
            log.warning("the process that started this agent is gone; stopping")
            self.stop_requested.set()

    def run(self) -> int:
        lock = hold_directory(self.settings.state_dir, "agent")  # one agent per state directory
        try:
            return self.serve()
        finally:
            lock.close()

    def serve(self) -> int:
        curve = None
        if self.settings.curve == "on":
            curve = CurveClientKeys.load(self.settings.keys_dir, self.settings.coordinator_public_key)
        transport = DealerTransport(self.settings.coordinator, self.settings.client_id, curve)
        self.wake = transport.wake  # the training thread's outcome is acted on as soon as it is set
        log.info("agent %s connecting to %s (CurveZMQ %s); energy source: %s", self.settings.client_id,
                 self.settings.coordinator, "on" if curve else "off",
                 self.meter.source.source if self.meter.source else "none")
        self.meter.watch_tcp(tcp_peer(self.settings.coordinator))
        self.meter.start()
        try:
            while not self.stop_requested.is_set():
                for frame, parts in zip(transport.poll(100), transport.received_parts, strict=True):
                    self.handle(transport, frame, parts)
                self.tick(transport)
                self.progress += 1
            self.act(transport, self.protocol.leaving())
        finally:
            worker = self.worker
            if worker is not None and worker.is_alive():
                worker.join(timeout=60)  # training stops at its next step; torch must not run at interpreter exit
            self.meter.stop()
            transport.close()
        return self.exit_code
