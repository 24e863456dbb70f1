"""The coordinator at fleet scale: the real coordinator against N light agents on real sockets.

    python benchmarks/fleet_scale.py [--agents 10,100,1000] [--algorithms fedavg,ef-fedprox] [--curve off,on]
        [--rounds 4] [--per-process 250] [--max-uploads 16] [--bounds derived,preset] [--profile PREFIX]
        [--input-shape 3,32,32] [--set KEY=VALUE ...]

Starts ``coordinator start --bind tcp://127.0.0.1:0`` (the paper CNN at ``--input-shape``: at 3x32x32 it has
1,147,466 parameters, at 1x28x28 688,138; no data on
the coordinator, no evaluation) and N light agents in processes of ``--per-process`` agents each. A light agent is
the agent's own protocol object (``fedge.protocol.agent``) and the real codec over its own DEALER socket, without
torch: it answers a task with a synthetic update of the right names, shapes and encoding, computed cheaply (FedAvg
and DSSA: the received model sent back; ef-fedprox: an int8 indexed section of 30 % of the float coordinates, against the
public model the task names). Samples the coordinator's CPU time and resident memory through psutil and prints, per
configuration, over rounds 2 to R: the coordinator's CPU seconds per round (the primary figure: on 2 cores the
light agents compete for the CPU), its wall time per round (the light agents compute nothing, so this is all
beyond the slowest agent's compute), its peak RSS with two earlier readings (once bound, before any agent; once
every agent has connected and round 1 is under way), and the bytes each way; and, measured in the same run, the
transport floor: the same frames (one task down to each agent, one update back) through ZeroMQ alone. Uploads are
paced (``fleet.max_uploads``, ``--max-uploads``; 0: unpaced). ``--bounds``: ``derived`` (the defaults: a bound
fleet derives its weight cap and norm bound from round 1's claims and norms, so round 1 holds every update until
it closes), ``preset`` (``robust.max_samples`` and ``robust.norm_bound`` set: no round holds), ``off``, or a
robust aggregator's name (over the preset bounds: every round holds its updates for the rule), or ``secagg``
(secure aggregation, fedavg or DSSA: the light agents mask with the agent's own protocol objects, ``protocol.agent`` and
``protocol.secure_device``, and the bounds are off; the light agents' CPU per round is then the masking's, since
their update costs nothing else). ``--profile PREFIX`` runs each coordinator under cProfile. Figures only: no thresholds (docs/scale.md has the table).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import zmq
import zmq.auth

import fedge
from fedge import codec
from fedge.algorithms.ef_meta import KEY as EF_KEY
from fedge.algorithms.ef_meta import EfTask, EfUpdate
from fedge.exhaustive import assert_never
from fedge.plumbing.threads import one_blas_thread
from fedge.protocol.agent import AgentProtocol, DeviceFacts
from fedge.protocol.events import (
    AgentAction,
    CancelTraining,
    Confirm,
    Join,
    Left,
    Masked,
    Noted,
    Reconnect,
    Send,
    SendFrame,
    Stop,
    Train,
)


def model_args(shape: tuple[int, ...]) -> list[str]:
    return ["--model", "cnn", "--set", f"model.input_shape={list(shape)}", "--set", "model.outputs=10",
            "--set", 'data.dataset=""']
KEEP = 0.3


# ------------------------------------------------------------------------------------------------ light agents
class LightAgent:
    """One agent: its protocol object and its socket; answers tasks with synthetic updates."""

    layout: list[tuple[str, tuple[int, ...]]] = []  # the model's float tensors (the parent process builds it)
    input_shape: tuple[int, ...] = (3, 32, 32)

    def __init__(self, context: zmq.Context[Any], endpoint: str, client_id: str, curve: dict[str, bytes] | None):
        self.client_id = client_id
        facts = DeviceFacts(fedge_version=fedge.__version__, torch_version="none", dataset_size=64,
                            input_shape=LightAgent.input_shape, num_outputs=10)
        self.protocol = AgentProtocol(client_id, hello_interval_s=1.0, facts=facts, stay=False)
        self.socket = context.socket(zmq.DEALER)
        if curve is None:  # with CurveZMQ on, the coordinator knows an agent by its key, as a real agent
            self.socket.setsockopt(zmq.IDENTITY, client_id.encode())
        self.socket.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            self.socket.curve_secretkey, self.socket.curve_publickey = curve["secret"], curve["public"]
            self.socket.curve_serverkey = curve["server"]
        self.socket.connect(endpoint)
        self.done = False

    def act(self, actions: list[AgentAction]) -> None:
        for action in actions:
            match action:
                case Send(message=message):
                    self.socket.send(codec.encode(message), zmq.NOBLOCK)
                case SendFrame(frame=frame):
                    self.socket.send(frame, zmq.NOBLOCK)
                case Join(welcome=w):
                    self.protocol.joined(w.run_id, w.client_index, w.heartbeat_s, w.liveness_s, w.seed)
                case Train(task=task):
                    try:
                        frame = self.update(task)
                    except (codec.CodecError, KeyError, ValueError) as exc:  # reported, so the round does not wait
                        self.act(self.protocol.finished(task.round, None, f"{type(exc).__name__}: {exc}"))
                        continue
                    self.act(self.protocol.finished(task.round, frame))
                case Stop() | Left():
                    self.act(self.protocol.leaving())
                    self.done = True
                case CancelTraining() | Confirm() | Masked() | Noted() | Reconnect():
                    continue  # a light agent trains at once, keeps no state, logs nothing and keeps its socket
                case _:
                    assert_never(action)

    def update(self, task: codec.Task) -> bytes:
        fields = {"num_samples": 64, "steps": 1, "train_loss": 1.0, "train_s": 0.0}
        if EF_KEY not in task.meta:  # FedAvg, DSSA: the received model, as if a step changed nothing
            model = task.groups["model"]
            section = model.sparse
            if section is not None and section.mask is not None:  # DSSA's sparse round: the complement's values
                complement = trained_values(int(np.count_nonzero(~section.mask.astype(bool))),
                                            zlib.crc32(f"{self.client_id}:{task.round}".encode()) % 8)
                model = codec.TensorGroup(dense=model.dense, sparse=codec.SparseSection.masked_values(
                    section.names, section.shapes, section.mask, complement, select=False))
            return codec.encode(codec.Update(run_id=task.run_id, round=task.round, sender=self.client_id,
                                             groups={"model": model}, **fields))
        names = tuple(n for n, _ in LightAgent.layout)
        shapes = tuple(s for _, s in LightAgent.layout)
        indices, values = pattern(sum(int(np.prod(s)) for s in shapes), zlib.crc32(f"{self.client_id}:{task.round}".encode()) % 8)
        section = codec.SparseSection.with_indices(names, shapes, indices, values)
        group = codec.TensorGroup(dense={}, sparse=section, value_dtype="int8")
        return codec.encode(codec.Update(run_id=task.run_id, round=task.round, sender=self.client_id,
                                         groups={"update": group}, meta=self.origin(task), **fields))

    @staticmethod
    def origin(task: codec.Task) -> dict[str, Any]:
        """ef's uplink meta for a task: trained from the task's public model, holding its keyframe."""
        described = EfTask.from_meta(task.meta)
        return EfUpdate(base=described.version, keyframe=described.keyframe).to_meta()


PATTERNS: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def pattern(size: int, which: int) -> tuple[np.ndarray, np.ndarray]:
    """One of 8 seeded (indices, ternary values) of 30 % of ``size`` coordinates: as hard to compress as a real
    top-k selection, and drawn once per process (the agents of a process share them, by round and id)."""
    if which not in PATTERNS:
        rng = np.random.default_rng(which)
        indices = np.sort(rng.choice(size, max(1, int(KEEP * size)), replace=False)).astype(np.int64)
        PATTERNS[which] = indices, (rng.integers(0, 2, indices.size) * 2e-3 - 1e-3).astype(np.float32)
    return PATTERNS[which]


TRAINED: dict[tuple[int, int], np.ndarray] = {}


def trained_values(size: int, which: int) -> np.ndarray:
    """One of 8 seeded float32 vectors of a round's change in scale (DSSA's values on its mask's complement, which
    grow from zero): as hard to compress as trained values, drawn once per process."""
    if (size, which) not in TRAINED:
        TRAINED[size, which] = np.random.default_rng(which).normal(0, 1e-3, size).astype(np.float32)
    return TRAINED[size, which]


def serve_agents(endpoint: str, first: int, count: int, keys_dir: str, layout: str, shape: tuple[int, ...]) -> int:
    """A process of light agents, until every one of them has left its session."""
    LightAgent.layout = [(name, tuple(shape)) for name, shape in json.loads(Path(layout).read_text())]
    LightAgent.input_shape = shape
    context = zmq.Context()
    ids = [f"light-{i:05d}" for i in range(first, first + count)]
    curves: dict[str, dict[str, bytes] | None] = dict.fromkeys(ids)
    if keys_dir:
        server = zmq.auth.load_certificate(Path(keys_dir) / "coordinator.key")[0]
        for client_id in ids:  # a key pair per agent, allowed as its client id (allowed/CLIENT_ID.key)
            public, secret = zmq.curve_keypair()
            (Path(keys_dir) / "allowed" / f"{client_id}.key").write_text(
                f"metadata\ncurve\n    public-key = \"{public.decode()}\"\n")
            curves[client_id] = {"public": public, "secret": secret, "server": server}
    agents = [LightAgent(context, endpoint, client_id, curves[client_id]) for client_id in ids]
    poller = zmq.Poller()
    by_socket = {}
    for agent in agents:
        poller.register(agent.socket, zmq.POLLIN)
        by_socket[agent.socket] = agent
    last_tick = 0.0
    while not all(a.done for a in agents):
        for socket, _ in poller.poll(100):
            agent = by_socket[socket]
            while True:
                try:
                    frame = b"".join(socket.recv_multipart(zmq.NOBLOCK))  # a Task may come in two parts
                except zmq.Again:
                    break
                agent.act(agent.protocol.receive(frame, time.monotonic()))
        now = time.monotonic()
        if now - last_tick >= 0.2:
            last_tick = now
            for agent in agents:
                if not agent.done:
                    agent.act(agent.protocol.tick(now))
    for agent in agents:
        agent.socket.close()
    context.term()
    return 0


# ------------------------------------------------------------------------------------------------ the floor
def transport_floor(task: bytes, update: bytes, agents: int) -> float:
    """Seconds to move ``task`` to each of ``agents`` DEALERs and ``update`` back, through ZeroMQ alone."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealers = []
    for i in range(agents):
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.IDENTITY, f"d{i}".encode())
        dealer.connect(f"tcp://127.0.0.1:{port}")
        dealer.send(b"hi")
        dealers.append(dealer)
    for _ in range(agents):
        router.recv_multipart()
    started = time.perf_counter()
    for i in range(agents):
        router.send_multipart([f"d{i}".encode(), task], copy=False)
    poller = zmq.Poller()
    for dealer in dealers:
        poller.register(dealer, zmq.POLLIN)
    answered = 0
    while answered < agents:
        for socket, _ in poller.poll(1000):
            socket.recv()
            socket.send(update)
            poller.unregister(socket)
            answered += 1
    for _ in range(agents):
        router.recv_multipart()
    took = time.perf_counter() - started
    for dealer in dealers:
        dealer.close(0)
    router.close(0)
    context.term()
    return took


# ------------------------------------------------------------------------------------------------ one configuration
BOUNDS = {"derived": [], "preset": ["--set", "robust.max_samples=100000", "--set", "robust.norm_bound=1e6"],
          "off": ["--set", "robust.max_samples=1000000000000", "--set", "robust.norm_factor=0"]}
for _rule in ("multi-krum", "centered-clip", "trimmed-mean", "median"):  # a robust rule over preset bounds
    BOUNDS[_rule] = [*BOUNDS["preset"], "--set", f'robust.aggregator="{_rule}"']
# secure aggregation (fedavg, DSSA; its bounds off, unpaced): the light agents mask with the agent's own protocol objects
BOUNDS["secagg"] = ["--set", "secagg.enabled=true", "--set", "secagg.stage_timeout_s=600"]


def run(algorithm: str, agents: int, curve: bool, rounds: int, per_process: int, max_uploads: int,
        workdir: Path, profile: str = "", bounds: str = "derived", shape: tuple[int, ...] = (3, 32, 32),
        settings: tuple[str, ...] = ()) -> dict[str, Any]:
    run_dir = workdir / f"{algorithm}-{agents}-{'curve' if curve else 'plain'}-{bounds}"
    keys = workdir / f"keys-{agents}-{algorithm}"
    profiler = ["-m", "cProfile", "-o", f"{profile}-{run_dir.name}.prof"] if profile else []
    args = [sys.executable, *profiler, "-m", "fedge.runtime.cli", "start", "--bind", "tcp://127.0.0.1:0", "--expect",
            str(agents), "--rounds", str(rounds), "--run-dir", str(run_dir), "--algorithm", algorithm, *model_args(shape),
            "--set", f"data.clients={agents}", "--set", "eval.every=0", "--set", "run.export_onnx=false",
            "--set", "fleet.heartbeat_s=5", "--set", "fleet.liveness_s=300", "--set", "round.deadline_s=900",
            "--set", "fleet.join_timeout_s=600", "--set", f"security.curve={'on' if curve else 'off'}", "--quiet",
            *BOUNDS[bounds], *(arg for setting in settings for arg in ("--set", setting))]
    if curve:
        subprocess.run([sys.executable, "-m", "fedge.runtime.cli", "keygen", "--keys-dir", str(keys)],
                       check=True, capture_output=True)
        args += ["--set", f"security.keys_dir={keys}"]
    if max_uploads and bounds != "secagg":  # paced uploads wait for grants the masking stages do not give
        args += ["--set", f"fleet.max_uploads={max_uploads}"]
    coordinator = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint_file = run_dir / "endpoint"
    until = time.monotonic() + 120
    while not (endpoint_file.exists() and endpoint_file.read_text().strip()) and time.monotonic() < until:
        time.sleep(0.1)
    endpoint = endpoint_file.read_text().strip()
    process = psutil.Process(coordinator.pid)
    bound_rss = process.memory_info().rss  # bound, its model built, no agent yet
    light = [subprocess.Popen([sys.executable, __file__, "--serve-agents", str(first), str(min(per_process,
                                                                                           agents - first)),
                               "--endpoint", endpoint, "--keys-dir", str(keys) if curve else "",
                               "--layout", str(workdir / "layout.json"),
                               "--input-shape", ",".join(map(str, shape))])
             for first in range(0, agents, per_process)]
    peak_rss, joined_rss, samples, seen = 0, 0, [], 0
    light_cpu: dict[int, float] = {}  # the light agents' processes: their CPU seconds, last read
    while coordinator.poll() is None:
        try:
            times, rss, threads = process.cpu_times(), process.memory_info().rss, process.threads()
        except psutil.Error:
            break
        for child in light:
            try:
                used = psutil.Process(child.pid).cpu_times()
                light_cpu[child.pid] = used.user + used.system
            except psutil.Error:
                pass
        peak_rss = max(peak_rss, rss)
        if not joined_rss and phase(run_dir).startswith("round"):
            joined_rss = rss  # every agent connected, round 1 under way: registry, connections, queues
        rows = read_rows(run_dir)
        if len(rows) > seen:
            seen = len(rows)
            by_name: dict[str, float] = {}  # CPU seconds by thread name (the round loop's thread: "main")
            for t in threads:
                name = "main" if t.id == coordinator.pid else thread_name(coordinator.pid, t.id) or "?"
                by_name[name] = by_name.get(name, 0.0) + t.user_time + t.system_time
            samples.append((seen, times.user + times.system, by_name))
        time.sleep(0.05)
    for child in light:
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
    rows = read_rows(run_dir)
    cpu = [b[1] - a[1] for a, b in zip(samples, samples[1:], strict=False)]
    names = sorted({name for _, _, by_name in samples for name in by_name})
    threads_cpu = {name: statistics.median(b[2].get(name, 0.0) - a[2].get(name, 0.0)
                                           for a, b in zip(samples, samples[1:], strict=False))
                   for name in names} if len(samples) > 1 else {}
    later = rows[1:] or rows
    return {"algorithm": algorithm, "agents": agents, "curve": curve, "bounds": bounds, "rounds": len(rows),
            "cpu_s": statistics.median(cpu) if cpu else None,
            "main_cpu_s": threads_cpu.get("main"), "threads_cpu_s": threads_cpu,
            "wall_s": statistics.median(r["wall_s"] for r in later) if later else None,
            "rss_mb": peak_rss / 2**20, "bound_rss_mb": bound_rss / 2**20, "joined_rss_mb": joined_rss / 2**20,
            "down_mb": statistics.median(r["bytes_down"] for r in later) / 1e6,
            "up_mb": statistics.median(r["bytes_up"] for r in later) / 1e6, "exit": coordinator.returncode,
            "agents_cpu_s": sum(light_cpu.values()) / max(len(rows), 1),
            "run_dir": str(run_dir)}


def thread_name(pid: int, tid: int) -> str:
    """A thread's name as Linux shows it (libzmq names its I/O threads ZMQbg/IO/N); '' elsewhere."""
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return ""


def phase(run_dir: Path) -> str:
    """status.json's phase ('' before it is written or while it is being replaced)."""
    try:
        return str(json.loads((run_dir / "status.json").read_text()).get("phase", ""))
    except (OSError, ValueError):
        return ""


def write_layout(path: Path, shape: tuple[int, ...]) -> None:
    """The float tensors of the coordinator's model (ef's light agents build their updates over them)."""
    from fedge.models import ModelSpec, build

    spec = ModelSpec.from_dict({"name": "cnn", "input_shape": list(shape), "num_classes": 10, "pan": "off",
                                "pan_a": 0.1, "pan_t": 1.0, "options": {}})
    state = build(spec, seed=0).state_dict()
    path.write_text(json.dumps([[name, list(t.shape)] for name, t in state.items() if t.is_floating_point()]))


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", default="10,100,1000")
    parser.add_argument("--algorithms", default="fedavg,ef-fedprox")
    parser.add_argument("--curve", default="off,on")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--per-process", type=int, default=250)
    parser.add_argument("--max-uploads", type=int, default=16, help="paced uploads (fleet.max_uploads); 0: unpaced")
    parser.add_argument("--bounds", default="derived", help=f"comma-separated: {', '.join(BOUNDS)}")
    parser.add_argument("--profile", default="", help="write cProfile data of each coordinator to PREFIX-RUN.prof")
    parser.add_argument("--input-shape", default="3,32,32", help="the paper CNN's input shape (1,28,28: FMNIST's)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="passed to every coordinator (e.g. algorithm.warmup_rounds=1 for DSSA's sparse rounds)")
    parser.add_argument("--serve-agents", nargs=2, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--keys-dir", default="", help=argparse.SUPPRESS)
    parser.add_argument("--layout", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = tuple(int(n) for n in args.input_shape.split(","))
    if args.serve_agents:
        one_blas_thread()  # as a real agent process does
        return serve_agents(args.endpoint, args.serve_agents[0], args.serve_agents[1], args.keys_dir, args.layout,
                            shape)
    workdir = Path(tempfile.mkdtemp(prefix="fedge-fleet-"))
    write_layout(workdir / "layout.json", shape)
    print(f"# fleet_scale: {os.cpu_count()} CPUs; runs under {workdir}")
    print("| algorithm | agents | CurveZMQ | bounds | coordinator CPU s / round (its round loop's thread) | "
          "wall s / round | floor s | wall / floor | peak RSS MB | RSS bound / joined MB | down MB / round | "
          "up MB / round |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    results = []
    for algorithm in args.algorithms.split(","):
        for agents in (int(n) for n in args.agents.split(",")):
            for curve, bounds in ((c == "on", b) for c in args.curve.split(",") for b in args.bounds.split(",")):
                if bounds not in BOUNDS:
                    parser.error(f"--bounds: {bounds!r} is not one of {', '.join(BOUNDS)}")
                result = run(algorithm, agents, curve, args.rounds, args.per_process, args.max_uploads, workdir,
                             args.profile, bounds, shape, tuple(args.set))
                down = int(result["down_mb"] * 1e6 / max(agents, 1))
                up = int(result["up_mb"] * 1e6 / max(agents, 1))
                floor = transport_floor(b"t" * max(down, 1), b"u" * max(up, 1), agents)
                result["floor_s"] = floor
                results.append(result)
                ratio = result["wall_s"] / floor if result["wall_s"] else float("nan")
                print(f"| {algorithm} | {agents} | {'on' if curve else 'off'} | {bounds} | "
                      f"{result['cpu_s'] or float('nan'):.2f} ({result['main_cpu_s'] or float('nan'):.2f}) "
                      f"| {result['wall_s'] or float('nan'):.2f} | {floor:.3f} | {ratio:.1f} | {result['rss_mb']:.0f} | "
                      f"{result['bound_rss_mb']:.0f} / {result['joined_rss_mb']:.0f} | "
                      f"{result['down_mb']:.1f} | {result['up_mb']:.1f} |" +
                      ("" if result["exit"] == 0 else f" (exit {result['exit']}: {result['run_dir']})"), flush=True)
                busy = {name: cpu for name, cpu in result["threads_cpu_s"].items() if cpu >= 0.01}
                print(f"<!-- {algorithm}, {agents} agents: CPU s / round by coordinator thread: " +
                      ", ".join(f"{name} {cpu:.2f}" for name, cpu in sorted(busy.items(), key=lambda i: -i[1])) +
                      f"; the light agents' processes, all rounds and connecting: {result['agents_cpu_s']:.2f} s / "
                      "round -->", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
