"""Fedge against Flower on one machine: the same model, N nodes on loopback, no local training, run alternately.

    python benchmarks/vs_flower.py [--nodes 10] [--rounds 6] [--pairs 2] [--work none|step]
                                   [--input-shape 3,32,32] [--flower-python PATH]

Flower needs ``pip install 'fedge[flower]'`` (flwr 1.42, pinned: Flower's app API changes between releases) in the
environment of ``--flower-python`` (default: this interpreter); Fedge itself never imports it. Each pair of runs:

- **Flower**: a SuperLink and N SuperNodes (``--insecure``, 127.0.0.1, Flower's defaults otherwise), and a Flower App
  written for the run: its ServerApp runs Flower's FedAvg over the model's initial arrays for R rounds (every node
  trains every round, no evaluation) and notes the time at each round's end; its ClientApp loads the received arrays
  into the model (torch) and sends the model's state back.
- **Fedge**: ``coordinator start --bind`` with FedAvg and N ``edge-agent run`` processes, no evaluation.

``--work none`` (the default): no local training; Fedge's agents get a work budget of 0 s (``--max-seconds``), so
that each sends back the model it received. Flower then sends almost nothing up: its nodes push only objects the
SuperLink does not hold yet (content-addressed), and an unchanged model is one it holds. ``--work step``: one Adam
step on one batch of 64 on both sides (Fedge: ``--max-steps 1``), so that every weight changes, as in training.

Both train the paper CNN (``cnn``) at ``--input-shape`` on synthetic data. Per run: the median round time over
rounds 2..R (Flower: between the ServerApp's round ends; Fedge: ``wall_s`` of metrics.jsonl), the bytes per node and
round (counted by a TCP relay that every node connects through, between the first and the last round end, over N
and R - 1: both directions of the node-to-server link, protocol overhead included, and not Flower's hops inside a
machine, ServerApp to SuperLink and SuperNode to ClientApp), and the
device-side memory (peak resident set of one node: a SuperNode with the ClientApp processes it starts, or an
edge-agent; the median over nodes). Prints every run, then medians and Fedge's figure over Flower's. Figures only,
no thresholds (docs/scale.md has a table). Every process it starts is stopped by its process group.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from _fleet_common import Processes, cnn_spec, read_rows, start_coordinator, write_shard
from _flower_app import write_app

FLOWER_VERSION = "1.42.0"

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class CountingProxy:
    """A TCP relay on 127.0.0.1 in front of the server: counts the bytes that cross the node-to-server link, both
    ways, whatever the protocol (Flower's HTTP, Fedge's ZeroMQ), one thread per direction of each connection."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.total = 0
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self) -> None:
        while True:
            try:
                node, _ = self.listener.accept()
                server = socket.create_connection(self.target)
            except OSError:
                return
            self.sockets += [node, server]
            for source, sink in ((node, server), (server, node)):
                threading.Thread(target=self.pump, args=(source, sink), daemon=True).start()

    def pump(self, source: socket.socket, sink: socket.socket) -> None:
        buffer = bytearray(1 << 20)
        try:
            while True:
                count = source.recv_into(buffer)
                if not count:
                    break
                sink.sendall(memoryview(buffer)[:count])
                with self.lock:
                    self.total += count
        except OSError:
            pass
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def bytes(self) -> int:
        with self.lock:
            return self.total

    def close(self) -> None:
        for end in [self.listener, *self.sockets]:
            end.close()


def tree_rss(process: psutil.Process) -> int:
    total = 0
    for member in [process, *process.children(recursive=True)]:
        try:
            total += member.memory_info().rss
        except psutil.Error:
            pass
    return total


def wait_for_port(port: int, seconds: float) -> None:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {seconds:.0f} s")


def watch(nodes: list[psutil.Process], ends: Any, link: CountingProxy, rounds: int,
          deadline_s: float) -> dict[str, Any]:
    """Poll until ``ends()`` lists round ``rounds``: the link's bytes at each round end, the nodes' peak memory."""
    peak = [0] * len(nodes)
    seen: dict[int, int] = {}
    until = time.monotonic() + deadline_s
    while time.monotonic() < until:
        marks = ends()
        for number in marks:
            seen.setdefault(number, link.bytes())
        for i, node in enumerate(nodes):
            peak[i] = max(peak[i], tree_rss(node))
        if rounds in seen:
            return {"bytes_at": seen, "peak_rss": peak}
        time.sleep(0.02)
    raise RuntimeError(f"the run did not finish {rounds} rounds in {deadline_s:.0f} s")


def summary(name: str, times: list[float], bytes_at: dict[int, int], peak: list[int], nodes: int,
            rounds: int) -> dict[str, Any]:
    return {"system": name, "round_s": statistics.median(times[1:] or times),
            "bytes_per_node_round": (bytes_at[rounds] - bytes_at[1]) / (nodes * (rounds - 1)),
            "node_rss_mb": statistics.median(peak) / 2**20}


def run_flower(python: str, work: Path, nodes: int, rounds: int, spec: dict[str, Any], initial: Path,
               local_work: str) -> dict[str, Any]:
    home, app = work / "flwr-home", work / "app"
    home.mkdir()
    ends = work / "round-ends.jsonl"
    port = free_port()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "bench"\n[superlink.bench]\n'
                                      f'address = "127.0.0.1:{port}"\ninsecure = true\n')
    write_app(app, rounds=rounds, nodes=nodes, spec=spec, initial=initial, ends=ends, work=local_work)
    bin_dir = str(Path(python).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "FLWR_HOME": str(home)}
    processes, link = Processes(), CountingProxy(port)
    try:
        processes.start([f"{bin_dir}/flower-superlink", "--insecure", "--host", "127.0.0.1", "--port", str(port),
                         "--disable-runtime-dependency-installation"], work / "superlink.log", env)
        wait_for_port(port, 60)
        supernodes = [processes.start([f"{bin_dir}/flower-supernode", "--insecure", "--superlink",
                                       f"127.0.0.1:{link.port}", "--port", str(free_port())],
                                      work / f"supernode-{i}.log", env) for i in range(nodes)]
        submitted = subprocess.run([f"{bin_dir}/flwr", "run", str(app), "bench"], env=env, capture_output=True,
                                   text=True, timeout=120)
        if submitted.returncode:
            raise RuntimeError(f"flwr run failed: {submitted.stdout[-500:]} {submitted.stderr[-500:]}")

        def marks() -> list[int]:
            lines = ends.read_text().splitlines() if ends.exists() else []
            return [json.loads(line)["round"] for line in lines]

        seen = watch([psutil.Process(p.pid) for p in supernodes], marks, link, rounds, 120 + 60 * rounds)
        stamps = {r["round"]: r["time"] for r in map(json.loads, ends.read_text().splitlines())}
        times = [stamps[r] - stamps[r - 1] for r in range(1, rounds + 1)]
        return summary("flower", times, seen["bytes_at"], seen["peak_rss"], nodes, rounds)
    finally:
        processes.stop()
        link.close()


def run_fedge(work: Path, nodes: int, rounds: int, shape: tuple[int, ...], local_work: str) -> dict[str, Any]:
    run_dir, rng = work / "run", np.random.default_rng(0)
    processes, link = Processes(), None
    try:
        endpoint = start_coordinator(processes, run_dir, nodes, rounds, shape, ["--algorithm", "fedavg"],
                                     work / "coordinator.log")
        link = CountingProxy(int(endpoint.rsplit(":", 1)[1]))
        budget = ["--max-steps", "1"] if local_work == "step" else ["--max-seconds", "1e-9"]
        agents = []
        for i in range(nodes):
            shard = work / f"shard-{i}.npz"
            write_shard(shard, i, shape, rng)
            agents.append(processes.start([sys.executable, "-m", "fedge.edge_agent.cli", "run", "--coordinator",
                                           f"tcp://127.0.0.1:{link.port}", "--client-id", f"node-{i}", "--data",
                                           str(shard), "--state-dir", str(work / f"state-{i}"), *budget],
                                          work / f"agent-{i}.log"))
        seen = watch([psutil.Process(p.pid) for p in agents], lambda: [r["round"] for r in read_rows(run_dir)], link,
                     rounds, 120 + 60 * rounds)
        return summary("fedge", [r["wall_s"] for r in read_rows(run_dir)], seen["bytes_at"], seen["peak_rss"], nodes,
                       rounds)
    finally:
        processes.stop()
        if link is not None:
            link.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--pairs", type=int, default=2, help="Flower and Fedge runs, alternately, this many times each")
    parser.add_argument("--input-shape", default="3,32,32", help="the CNN's input (3,32,32: 1,147,466 parameters)")
    parser.add_argument("--work", choices=("none", "step"), default="none",
                        help="local work: none (the received model sent back) or one Adam step on one batch")
    parser.add_argument("--flower-python", default=sys.executable, help="an interpreter whose environment has flwr")
    args = parser.parse_args()
    if args.nodes < 1 or args.rounds < 2 or args.pairs < 1:
        parser.error("--nodes >= 1, --rounds >= 2 and --pairs >= 1")
    try:
        check = subprocess.run([args.flower_python, "-c", "import flwr, fedge; print(flwr.__version__)"],
                               capture_output=True, text=True)
    except OSError:
        check = subprocess.CompletedProcess([], 1, "", "")
    if check.returncode:
        print(f"vs_flower: flwr is not installed for {args.flower_python}: pip install 'fedge[flower]' "
              f"(flwr=={FLOWER_VERSION}), or pass --flower-python", file=sys.stderr)
        return 2
    shape = tuple(int(v) for v in args.input_shape.split(","))
    from fedge.models import ModelSpec, build, state_to_arrays

    spec = ModelSpec.from_dict(cnn_spec(shape))
    model = build(spec, seed=0)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"# vs_flower: the paper CNN at {shape} ({parameters:,} parameters), {args.nodes} nodes, {args.rounds} "
          f"rounds, local work: {args.work}, flwr {check.stdout.strip()}, {os.cpu_count()} CPUs")
    print("| run | system | round s (median of rounds 2..R) | bytes per node and round | node peak RSS MB |")
    print("|---|---|---|---|---|")
    results: dict[str, list[dict[str, Any]]] = {"flower": [], "fedge": []}
    with tempfile.TemporaryDirectory(prefix="fedge-vs-flower-") as tmp:
        initial = Path(tmp) / "initial.npz"
        np.savez(initial, **state_to_arrays(model))
        for pair in range(args.pairs):
            for system in ("flower", "fedge"):
                work = Path(tmp) / f"{system}-{pair}"
                work.mkdir()
                result = (run_flower(args.flower_python, work, args.nodes, args.rounds, spec.as_dict(), initial,
                                     args.work) if system == "flower"
                          else run_fedge(work, args.nodes, args.rounds, shape, args.work))
                results[system].append(result)
                print(f"| {pair + 1} | {system} | {result['round_s']:.2f} | {result['bytes_per_node_round'] / 1e6:.2f} MB"
                      f" | {result['node_rss_mb']:.0f} |", flush=True)
    print()
    print("| figure (median over runs) | Flower | Fedge | Fedge / Flower |")
    print("|---|---|---|---|")
    for key, label, scale, unit in (("round_s", "round time", 1, "s"),
                                    ("bytes_per_node_round", "bytes per node and round", 1e6, "MB"),
                                    ("node_rss_mb", "node peak RSS", 1, "MB")):
        flower = statistics.median(r[key] for r in results["flower"])
        fedge = statistics.median(r[key] for r in results["fedge"])
        print(f"| {label} | {flower / scale:.2f} {unit} | {fedge / scale:.2f} {unit} | {fedge / flower:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
