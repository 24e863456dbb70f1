"""What a round costs beyond the slowest agent's training, with real agents.

    python benchmarks/round_overhead.py [--agents 10] [--rounds 6] [--algorithms fedavg,ef-fedprox]
                                        [--input-shape 3,32,32]

Starts ``coordinator start --bind`` (the paper CNN at ``--input-shape``, no data of its own, no evaluation) and
``--agents`` real ``edge-agent run`` processes on 127.0.0.1, each with one batch of 64 synthetic samples, so that a
round trains one step per agent. ef-fedprox runs with the embedded default's settings (keep 0.3, ternary, mu 0.01).
Prints, per round, ``wall_s`` (the coordinator's round, from selection to the records), ``train_s_max`` (the slowest
agent's training) and their difference, the time the runtime adds: the task built, sent and decoded, the update
encoded, sent, decoded and folded, the round closed and checkpointed (``checkpoint_s``, shown); and the median
of the difference over rounds 2..R (round 1 also pays for the agents' first imports and model builds). Figures
only: no thresholds (docs/scale.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _fleet_common import Processes, read_rows, start_coordinator, write_shard

ALGORITHMS = {
    "fedavg": ["--algorithm", "fedavg"],
    "ef-fedprox": ["--algorithm", "ef-fedprox", "--set", "algorithm.keep=0.3", "--set",
                   "algorithm.value_dtype=ternary", "--set", "algorithm.mu=0.01"],
}


def run(algorithm: str, agents: int, rounds: int, shape: tuple[int, ...], work: Path) -> list[dict[str, float]]:
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
        return [{"round": r["round"], "wall_s": r["wall_s"], "train_s_max": r["train_s_max"],
                 "checkpoint_s": r["checkpoint_s"] or 0.0} for r in read_rows(run_dir)]
    finally:
        processes.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--algorithms", default="fedavg,ef-fedprox")
    parser.add_argument("--input-shape", default="3,32,32", help="the CNN's input (3,32,32: 1,147,466 parameters)")
    args = parser.parse_args()
    names = args.algorithms.split(",")
    if args.agents < 1 or args.rounds < 2 or any(name not in ALGORITHMS for name in names):
        parser.error(f"--agents >= 1, --rounds >= 2, --algorithms among {', '.join(ALGORITHMS)}")
    shape = tuple(int(v) for v in args.input_shape.split(","))
    print(f"# round_overhead: {args.agents} agents, the paper CNN at {shape}, one batch each, {os.cpu_count()} CPUs")
    print("| algorithm | round | wall_s | train_s_max | wall_s - train_s_max | of which checkpoint_s |")
    print("|---|---|---|---|---|---|")
    medians = {}
    with tempfile.TemporaryDirectory(prefix="fedge-overhead-") as tmp:
        for name in names:
            work = Path(tmp) / name
            work.mkdir()
            rows = run(name, args.agents, args.rounds, shape, work)
            for row in rows:
                print(f"| {name} | {row['round']} | {row['wall_s']:.3f} | {row['train_s_max']:.3f} | "
                      f"{row['wall_s'] - row['train_s_max']:.3f} | {row['checkpoint_s']:.3f} |", flush=True)
            medians[name] = statistics.median(r["wall_s"] - r["train_s_max"] for r in rows[1:])
    print()
    for name, value in medians.items():
        print(f"{name}: median over rounds 2..{args.rounds} of wall_s - train_s_max = {value:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
