"""THE session: register agents, then play rounds (``coordinator.rounds``) or versions (``coordinator.asynchronous``).

A ``Session`` owns one run: the algorithm's server half, the run directory, and the driver's part of the protocol:
it polls the ``RouterTransport``, feeds every frame and the current time to ``protocol.coordinator`` (which holds
the agent registry, the round in progress and every rule that guards it, with no I/O), sends what that returns and
logs what it reports. So a local fleet on loopback and a fleet of Raspberry Pis are served by the same code.
Device state is committed in two phases: an agent promotes what a round produced only when told that the round was
checkpointed with its update in it. Must not import torch directly (models and evaluation do that), nor know any
algorithm by name.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fedge import codec
from fedge.algorithms import make_server
from fedge.algorithms.base import ModelLayout, ServerContext
from fedge.codec import vocabulary as words
from fedge.coordinator import asynchronous, rounds
from fedge.coordinator.checkpoint import load_checkpoint, save_checkpoint
from fedge.coordinator.config import Config
from fedge.coordinator.crashpoints import crash_point
from fedge.coordinator.deferred import DeferredRow, PendingRow
from fedge.coordinator.distributed import SessionNoise
from fedge.coordinator.downlinks import BODY_FRAME, CURVE_BODY_FRAME, DownlinkBodies
from fedge.coordinator.privacy import PrivacyPlan, SessionPrivacy
from fedge.coordinator.recovery import recover_round
from fedge.coordinator.rundir import SPENT_FIELDS, RunDir, plain
from fedge.coordinator.secure import SessionSecAgg
from fedge.coordinator.status import AgentTallies, StatusBoard
from fedge.coordinator.transport import RouterTransport
from fedge.coordinator.trust import SessionTrust
from fedge.coordinator.welcome import welcome_fields
from fedge.exhaustive import assert_never
from fedge.models import ModelSpec, arrays_to_state, build, definition_hash, state_to_arrays
from fedge.plumbing.threads import part_threads
from fedge.protocol.coordinator import CoordinatorProtocol
from fedge.protocol.events import Accepted, Checkpoint, CoordinatorEvent, Noted, Rejected, Send, SendFrame
from fedge.protocol.exact_sum import fold_in_parts
from fedge.protocol.registry import AgentRegistry
from fedge.protocol.server_half import Aggregation
from fedge.protocol.server_step import ServerStep

log = logging.getLogger("fedge.coordinator")

class Session:
    """One federated session over a transport; ``run()`` plays rounds until done or asked to stop."""

    def __init__(self, config: Config, run_dir: RunDir, transport: RouterTransport, spec: ModelSpec,
                 num_clients: int, evaluator: Callable[[dict[str, np.ndarray]], dict[str, float | None]] | None,
                 run_id: str, reserved_ids: list[str] | None = None,
                 on_round: Callable[[dict[str, Any]], None] | None = None,
                 initial: dict[str, np.ndarray] | None = None,
                 welcome_extra: dict[str, Any] | None = None, weight_cap: int = 0,
                 privacy: PrivacyPlan | None = None, clock: Callable[[], float] | None = None) -> None:
        self.config = config
        # the protocol's time (deadlines, liveness, a task's age): the real clock, or a simulated fleet's
        # (fleet.clock = "simulated"); what the session's own steps take is always measured on the real one
        self.clock = clock or time.monotonic
        self.simulated_clock = clock is not None
        self.run_dir = run_dir
        self.transport = transport
        self.spec = spec
        fold_in_parts(*part_threads())  # a large exact sum's parts fold on a few threads (the same bits as in one)
        self.evaluator = evaluator
        self.on_round = on_round
        self.welcome_extra = dict(welcome_extra or {})
        self.on_tick: Callable[[float], None] | None = None  # the local fleet's watch, called as the loop turns
        self.on_waiting: Callable[[int, int], None] | None = None  # (connected, expected) while waiting for agents
        self.stopping = False
        self.budget_spent = False  # distributed noise: the next round would take epsilon past privacy.max_epsilon
        self.progress = 0
        registry = AgentRegistry(num_clients, config.fleet.liveness_s)
        registry.reserve(reserved_ids or [])
        model = build(spec, seed=config.run.seed)
        if initial is not None:  # model.init: the session starts from saved weights (checked by the plan)
            arrays_to_state(model, dict(initial), strict=False)
        self.model_hash = definition_hash(spec)
        self.layout = ModelLayout.of(model)
        self.shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        context = ServerContext(num_clients=num_clients, layout=self.layout, seed=config.run.seed,
                                asynchronous=config.round.mode == "async",
                                initial_from_seed=initial is None)
        self.server = make_server(config.algorithm_name, config.algorithm_options, state_to_arrays(model), context)
        self.protocol = CoordinatorProtocol(run_id, self.model_hash, self.shapes, registry, self.server,
                                            self.welcome_fields, self.task_flags,
                                            max_uploads=config.fleet.max_uploads,
                                            admit=lambda update: self.aggregation.check(update),
                                            floats=frozenset(name for name, t in model.state_dict().items()
                                                             if t.is_floating_point()))
        self.started = time.monotonic()
        self.status = StatusBoard(run_dir, config.run.rounds, config.algorithm_name)  # status.json and friends
        self.tallies = AgentTallies()  # each agent's bytes, refusals, declines and last round; checkpointed
        self.round_walls: list[float] = []
        self.dropouts: list[int] = []  # under differential privacy: the round's drawn clients that were offline
        # bounded influence, the robust rule and the quarantine (``weight_cap``: a local or simulated fleet's
        # largest shard); checkpointed
        self.trust = SessionTrust(config.robust, weight_cap, run_dir)
        # differential privacy (docs/privacy.md): the clip, the private generator, the accountant; checkpointed
        self.privacy = SessionPrivacy(privacy, run_dir) if privacy is not None else None
        self.step = ServerStep(config.server.lr, config.server.momentum)  # the server's optimizer; checkpointed
        # secure aggregation (docs/secure-aggregation.md): each round's grid, settings and masked stages
        noise = SessionNoise(config.privacy, num_clients, run_dir) if config.privacy.mode == "distributed" else None
        self.secagg = SessionSecAgg(config.secagg, run_dir, noise) if config.secagg.enabled else None
        self.aggregation = Aggregation(self.server, 0)  # the round in progress's, on the one aggregation path
        self.checkpoint_s = 0.0  # the time the last checkpoint took to write
        # where the round's time went on this side (metrics.jsonl: receive_s, fold_s, downlink_s, close_s, tail_s)
        self.spent = dict.fromkeys(SPENT_FIELDS, 0.0)
        self.last_accepted = 0.0  # when the round's last update was accepted (the start of its tail)
        self.downlinks = DownlinkBodies(CURVE_BODY_FRAME if getattr(transport, "curve", False) else BODY_FRAME)  # a round's Task bodies, encoded once per distinct payload
        self.bytes_total = {"down": 0, "up": 0}  # packet bytes of the rounds recorded so far (metrics.jsonl)
        # the last round's row, until its evaluation (beside the next round) is done
        self.rows = PendingRow(config.eval.every, config.run.rounds, evaluator, self.write_row)
        self.resumed_versions: dict[str, Any] | None = None  # an asynchronous session's task table, as checkpointed
        self.resumed = False  # this session went on from a checkpoint

    @property
    def registry(self) -> AgentRegistry:
        return self.protocol.registry

    @property
    def round(self) -> int:
        return self.protocol.round

    @property
    def run_id(self) -> str:
        return self.protocol.run_id

    # ----------------------------------------------------------------------------------------- checkpoint
    def save_checkpoint(self) -> None:
        arrays, server_meta = self.server.state_dict()
        fleet = self.transport.checkpoint_state() if hasattr(self.transport, "checkpoint_state") else None
        save_checkpoint(self.run_dir.checkpoint, {**arrays, **self.step.state_dict(), **(fleet[0] if fleet else {})}, {
            "round": self.round, "run_id": self.run_id, "algorithm": self.config.algorithm_name,
            "model_hash": self.model_hash, "server": server_meta, **self.registry.state(),
            **self.trust.state(), **self.tallies.state(),
            **(self.privacy.state() if self.privacy is not None else {}),
            asynchronous.STATE_KEY: None if self.protocol.versions is None else self.protocol.versions.rounds.state(),
            "sim_clock": self.clock() if self.simulated_clock else None, "fleet": fleet[1] if fleet else None,
            "pending_row": None if self.rows.held is None else plain(self.rows.held.row)})

    def load_checkpoint(self) -> None:
        arrays, meta = load_checkpoint(self.run_dir.checkpoint, self.model_hash, self.config.algorithm_name)
        self.step.load_state_dict(arrays)
        self.server.load_state_dict({k: v for k, v in arrays.items() if not k.startswith(("server_step/", "fleet/"))},
                                    meta["server"])
        self.registry.load_state(meta)
        self.trust.load_state(meta)
        self.tallies.load_state(meta)
        if self.privacy is not None:
            self.privacy.load_state(meta, int(meta["round"]))
        self.protocol.resume(str(meta["run_id"]), int(meta["round"]))
        self.resumed_versions = meta.get(asynchronous.STATE_KEY)
        self.resumed = True
        if self.simulated_clock and meta.get("sim_clock") is not None:  # simulated time goes on from the checkpoint
            self.clock.advance_to(float(meta["sim_clock"]))  # type: ignore[attr-defined]
        if meta.get("fleet") is not None and hasattr(self.transport, "restore"):  # a simulated clock's jobs out
            self.transport.restore(meta["fleet"], {k: v for k, v in arrays.items() if k.startswith("fleet/")})
        for name in ("metrics.jsonl", "clients.jsonl"):
            self.run_dir.truncate_jsonl(name, self.round)
        pending = meta.get("pending_row")
        if pending and all(r.get("round") != pending["round"] for r in self.run_dir.read_jsonl("metrics.jsonl")):
            self.hold_row(dict(pending), int(pending["round"]))  # its round's model: the checkpoint's
            self.rows.flush()
        for row in self.run_dir.read_jsonl("metrics.jsonl"):
            for direction in self.bytes_total:
                self.bytes_total[direction] += int(row.get(f"bytes_{direction}") or 0)
        log.info("resumed %s at round %d", self.run_dir.path, self.round)

    def welcome_fields(self, index: int) -> dict[str, Any]:
        return {**welcome_fields(self.config, self.spec, self.model_hash, index, self.registry.capacity),
                **self.welcome_extra}

    def task_flags(self, number: int) -> dict[str, Any]:
        """The runtime's fields of a task in round ``number``: its evaluation flags and the round's norm bounds (an
        asynchronous task, ``number`` its task id: the version's norm bounds alone)."""
        if self.protocol.versions is not None:
            return {"norm_bounds": self.aggregation.norm_bounds}
        personal = self.config.eval.personal_every
        return {"personal_eval": bool(personal and number % personal == 0),
                "evaluate": self.evaluator is None and self.rows.due(number),
                "norm_bounds": self.privacy.norm_bounds if self.privacy is not None else
                self.secagg.noise_bounds() if self.secagg is not None and self.secagg.noise is not None else
                self.aggregation.norm_bounds,
                **(self.secagg.task_fields(number) if self.secagg is not None else {})}

    # ----------------------------------------------------------------------------------------- driving the protocol
    def act(self, events: list[CoordinatorEvent]) -> None:
        """Carry out what the protocol decided, in its order."""
        for event in events:
            match event:
                case Send(message=codec.Task() as task, peer=peer, task_of=int(index)):
                    began = time.monotonic()
                    self.protocol.sent_task(index, self.send_task(peer, task, index))
                    self.spent["downlink_s"] += time.monotonic() - began
                case Send(message=message, peer=peer):
                    self.send(peer, message)
                case SendFrame(peer=peer, frame=frame):
                    self.transport.send(peer, frame)
                case Accepted(round=number, update=update):  # streaming: folded at once, its tensors then dropped
                    began = time.monotonic()
                    problem = self.aggregation.fold(update)
                    self.last_accepted = time.monotonic()
                    self.spent["fold_s"] += self.last_accepted - began
                    if problem:  # nothing of it was kept: the protocol ends its part (no Commit)
                        self.act(self.protocol.unfolded(number, update.index, problem, self.clock()))
                case Checkpoint(round=number):
                    written = time.monotonic()
                    self.save_checkpoint()
                    self.checkpoint_s = time.monotonic() - written
                    crash_point("checkpoint", number)
                case Rejected(peer=peer, code=code, reason=reason):
                    log.warning("rejected a message from %r: %s (%s)", peer, reason, code)
                    client_id = peer.decode(errors="replace")
                    if self.registry.get(client_id) is not None:
                        self.tallies.rejected(client_id)
                        if code == words.INVALID_UPDATE:
                            self.trust.refused(client_id)
                case Noted(level=level, text=text):
                    log.log(level, "%s", text)
                case _:
                    assert_never(event)

    def close_aggregation(self, number: int) -> dict[str, Any]:
        """Close the round's (or version's) aggregation; an update it refuses at the close (a held one) is reported
        to the protocol as a refusal at folding is."""
        before = len(self.aggregation.refused)
        metrics: dict[str, Any] = self.aggregation.close()
        for refusal in self.aggregation.refused[before:]:
            self.act(self.protocol.unfolded(number, refusal.index, refusal.reason, self.clock()))
        return metrics

    def send(self, peer: bytes, message: codec.Message) -> int:
        frame = self.downlinks.frame(message) if isinstance(message, codec.Task) else codec.encode(message)
        return len(frame) if self.transport.send(peer, frame) else 0

    def send_task(self, peer: bytes, task: codec.Task, index: int) -> int:
        """A Task in parts (its header, the round's shared body in frames) to an agent that takes them, else in
        one frame."""
        if words.TASK_PARTS not in self.registry.by_index(index).hello.get("capabilities", ()):
            return self.send(peer, task)
        parts = self.downlinks.parts(task)
        return sum(len(part) for part in parts) if self.transport.send_parts(peer, parts) else 0

    def handle(self, peer: bytes, frame: bytes, identity: str | None = None) -> None:
        began = time.monotonic()
        events = self.protocol.receive(peer, frame, self.clock(), identity)
        self.spent["receive_s"] += time.monotonic() - began
        self.act(events)

    def horizon(self, when: float) -> None:
        """A simulated fleet's clock stops at ``when`` until told otherwise (a deadline of the protocol's: no
        result may arrive after it has passed); a fleet on the real clock has none."""
        if hasattr(self.transport, "horizon"):
            self.transport.horizon = when

    def pump(self, timeout_ms: int, until: Callable[[], bool] | None = None) -> None:
        """Handle what one poll brings, one message at a time; ``until``: stop after the message that makes it true
        (the rest stay queued for the next poll)."""
        self.progress += 1
        for peer, frame, identity in self.transport.poll(timeout_ms):
            self.handle(peer, frame, identity)
            if until is not None and until():
                break
        if self.on_tick is not None:
            self.on_tick(time.monotonic())

    def drain(self) -> None:
        """Handle everything already queued (heartbeats included) so that liveness reflects the present."""
        for _ in range(10_000):
            handled = 0
            for peer, frame, identity in self.transport.poll(0):
                self.handle(peer, frame, identity)
                handled += 1
            if not handled:
                return

    # ----------------------------------------------------------------------------------------- the round
    def wait_for_agents(self, expect: int, timeout_s: float) -> bool:
        minimum = max(self.config.round.min_clients, 1)
        until = time.monotonic() + timeout_s
        announced = -1
        while not self.stopping:
            live = len(self.registry.live_indices(self.clock()))
            if live != announced:
                log.info("%d of %d expected agents connected", live, expect)
                announced = live
            if self.on_waiting is not None:
                self.on_waiting(live, expect)
            if live >= expect or (time.monotonic() > until and live >= minimum):
                return True
            self.pump(200)
            self.write_status("waiting for agents")
        return False

    def index_of(self, client_id: str) -> int:
        return self.registry.agents[client_id].index

    def hold_row(self, row: dict[str, Any], number: int) -> DeferredRow:
        return self.rows.hold(row, number, self.server.evaluation_arrays, self.server.pruned_evaluation_arrays)

    def write_row(self, row: dict[str, Any]) -> None:
        self.run_dir.append_jsonl("metrics.jsonl", row)
        if self.on_round is not None:
            self.on_round(row)

    # ----------------------------------------------------------------------------------------- driving
    def write_status(self, phase: str, force: bool = False) -> None:
        self.status.write(phase, force, now=self.clock(), run_id=self.run_id, round_number=self.round,
                          registry=self.registry,
                          rejections=self.rejections(), bytes_total=self.bytes_total, round_walls=self.round_walls,
                          bounded=self.trust.counts, quarantined=self.trust.quarantine.quarantined,
                          privacy=self.privacy.status() if self.privacy is not None else
                          self.secagg.noise.status() if self.secagg is not None and self.secagg.noise else None,
                          tallies=self.tallies)

    def rejections(self) -> dict[str, int]:
        """Messages refused per peer (routing id), the 100 largest counts."""
        return self.protocol.limiter.largest(100)

    def run(self, expect: int, join_timeout_s: float) -> str:
        """Play the remaining rounds; returns 'done', 'stopped', 'no-agents' or 'budget' (privacy.max_epsilon). The last round's row is written
        before it returns."""
        try:
            return self.play_rounds(expect, join_timeout_s)
        finally:
            self.rows.flush()

    def play_rounds(self, expect: int, join_timeout_s: float) -> str:
        versions = asynchronous.start(self, self.resumed_versions) if self.config.round.mode == "async" else None
        if not self.wait_for_agents(expect, join_timeout_s):
            return "stopped"
        if versions is not None:
            return asynchronous.play_versions(self, versions)
        while self.round < self.config.run.rounds:
            if self.privacy is not None and self.privacy.over_budget():
                log.warning("privacy: another round would take epsilon past privacy.max_epsilon = %g (now %.4g); "
                            "stopping", self.config.privacy.max_epsilon, self.privacy.epsilon)
                self.write_status("privacy budget spent", force=True)
                return "budget"
            self.drain()
            if not self.registry.live_indices(self.clock()):
                log.warning("no live agent; waiting for agents to come back")
                if not self.wait_for_agents(max(self.config.round.min_clients, 1), self.config.fleet.join_timeout_s):
                    return "stopped"
                if not self.registry.live_indices(self.clock()):
                    return "no-agents"
            kept = self.secagg.kept(self.run_id, self.round + 1) if self.secagg is not None else None
            row = rounds.play_round(self, self.round + 1) if kept is None else recover_round(self, kept)
            if row is None and self.budget_spent:
                self.write_status("privacy budget spent", force=True)
                return "budget"
            if row is None:
                self.write_status("stopped", force=True)
                return "stopped"
            self.write_status(f"round {self.round} done", force=True)
        self.write_status("done", force=True)
        return "done"

    def say_goodbye(self, code: str, reason: str, wait_s: float = 0.0) -> None:
        """Send every connected agent a Bye; then, for up to ``wait_s``, keep serving until each has said its own
        Bye back (closing at once lost Byes in the e2e tests, and those agents waited for an ended session)."""
        told = [a for a in self.registry.agents.values() if a.connected and a.peer]
        self.act(self.protocol.byes(code, reason))
        deadline = time.monotonic() + wait_s
        while any(a.connected for a in told) and time.monotonic() < deadline:
            self.pump(50)
