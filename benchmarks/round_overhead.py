"""What a round costs beyond the slowest agent's training, with real agents, and where each millisecond goes.

    python benchmarks/round_overhead.py [--agents 10] [--rounds 6] [--repeats 3] [--algorithms fedavg,ef-fedprox]
                                        [--input-shape 3,32,32]

Starts ``coordinator start --bind`` (the paper CNN at ``--input-shape``, no data of its own, no evaluation, main's
defaults otherwise: the trust issue's norm bound included) and ``--agents`` real ``edge-agent run`` processes on
127.0.0.1, each with one batch of 64 synthetic samples, so that a round trains one step per agent. ef-fedprox runs
with the embedded default's settings (keep 0.3, ternary, mu 0.01). Each algorithm runs ``--repeats`` times.

Per round: ``overhead`` = ``wall_s`` + ``checkpoint_s`` - ``train_s_max``, the round's time on the coordinator
(selection to the Commits sent, checkpoint included) less the slowest agent's training; and ``tail_s``, from the
last accepted update to the Commits sent, the part the coordinator alone controls. A run's figure is the median over
rounds 2..R (round 1 also pays for the agents' first imports and model builds); the benchmark prints the median of
the runs' figures. The breakdown (medians over the same rounds and runs): on the coordinator ``receive_s`` (frames
decoded and checked), ``fold_s``, ``downlink_s`` (tasks encoded and queued), ``close_s``, ``checkpoint_s``; on the
agents, from their meter records (clients.jsonl), the median agent's ``wall_s_receive`` (state loaded, the task's
payload applied to the model), ``cpu_s_decode`` (the CPU seconds decoding the packet took) and ``wall_s_encode`` (the update made and
encoded). Figures only: no thresholds (docs/scale.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _fleet_common import Processes, read_rows, start_coordinator, write_shard

COORDINATOR_PARTS = ("receive_s", "fold_s", "downlink_s", "close_s", "checkpoint_s")
AGENT_PARTS = ("wall_s_receive", "cpu_s_decode", "wall_s_encode")
ALGORITHMS = {
    "fedavg": ["--algorithm", "fedavg"],
    "ef-fedprox": ["--algorithm", "ef-fedprox", "--set", "algorithm.keep=0.3", "--set",
                   "algorithm.value_dtype=ternary", "--set", "algorithm.mu=0.01"],
}


def run(algorithm: str, agents: int, rounds: int, shape: tuple[int, ...], work: Path) -> list[dict[str, float]]:
    """One run: per round (2..R), the overhead, the coordinator's parts and the median agent's parts."""
    run_dir, rng = work / "run", np.random.default_rng(0)
    processes = Processes()
    try:
        endpoint = start_coordinator(processes, run_dir, agents, rounds, shape, ALGORITHMS[algorithm],
                                     work / "coordinator.log")
        for i in range(agents):
            shard = work / f"shard-{i}.npz"
            write_shard(shard, i, shape, rng)
            processes.start([sys.executable, "-m", "fedge.edge_agent.cli", "run", "--coordinator", endpoint,
                             "--client-id", f"agent-{i}", "--data", str(shard), "--state-dir",
                             str(work / f"state-{i}")], work / f"agent-{i}.log")
        until = time.monotonic() + 120 + 60 * rounds
        while len(read_rows(run_dir)) < rounds:
            if time.monotonic() > until:
                raise RuntimeError(f"{algorithm}: {len(read_rows(run_dir))} of {rounds} rounds in time (see {work})")
            time.sleep(0.2)
    finally:
        processes.stop()
    clients = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text().splitlines() if line.strip()]
    out = []
    for row in read_rows(run_dir)[1:]:
        figures = {"round": row["round"], "overhead": row["wall_s"] + row["checkpoint_s"] - row["train_s_max"],
                   **{name: row[name] for name in ("tail_s", *COORDINATOR_PARTS)}}
        mine = [c for c in clients if c["round"] == row["round"]]
        for name in AGENT_PARTS:
            values = [c[name] for c in mine if c.get(name) is not None]
            figures[name] = statistics.median(values) if values else float("nan")
        out.append(figures)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--algorithms", default="fedavg,ef-fedprox")
    parser.add_argument("--input-shape", default="3,32,32", help="the CNN's input (3,32,32: 1,147,466 parameters)")
    args = parser.parse_args()
    names = args.algorithms.split(",")
    if args.agents < 1 or args.rounds < 2 or args.repeats < 1 or any(name not in ALGORITHMS for name in names):
        parser.error(f"--agents >= 1, --rounds >= 2, --repeats >= 1, --algorithms among {', '.join(ALGORITHMS)}")
    shape = tuple(int(v) for v in args.input_shape.split(","))
    print(f"# round_overhead: {args.agents} agents, the paper CNN at {shape}, one batch each, {os.cpu_count()} CPUs, "
          f"{args.repeats} run(s) per algorithm, rounds 2..{args.rounds}")
    parts = ("overhead", "tail_s", *COORDINATOR_PARTS, *AGENT_PARTS)
    print("| algorithm | run | " + " | ".join(parts) + " |")
    print("|---|---|" + "---|" * len(parts))
    summary: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="fedge-overhead-") as tmp:
        for name in names:
            per_run: list[dict[str, float]] = []
            for repeat in range(args.repeats):
                work = Path(tmp) / f"{name}-{repeat}"
                work.mkdir()
                rows = run(name, args.agents, args.rounds, shape, work)
                medians = {part: statistics.median(r[part] for r in rows) for part in parts}
                per_run.append(medians)
                print(f"| {name} | {repeat + 1} | " + " | ".join(f"{1000 * medians[p]:.1f}" for p in parts) + " |",
                      flush=True)
            summary[name] = {part: statistics.median(m[part] for m in per_run) for part in parts}
    print("\n(milliseconds; each a run's median over its rounds)\n")
    for name, figures in summary.items():
        print(f"{name}: overhead beyond training {1000 * figures['overhead']:.0f} ms (median of {args.repeats} runs' "
              f"medians), of which the coordinator's tail {1000 * figures['tail_s']:.0f} ms; " +
              ", ".join(f"{p} {1000 * figures[p]:.1f}" for p in (*COORDINATOR_PARTS, *AGENT_PARTS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
