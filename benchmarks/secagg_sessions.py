"""What secure aggregation costs in whole sessions: a fleet of agent processes on this machine, FedAvg with delta
uploads and uniform weights in plaintext, and the same with ``secagg.enabled`` (its bits as given), side by side.

    python benchmarks/secagg_sessions.py                      # 10 agents, the paper CNN, 5 rounds, 16 bits
    python benchmarks/secagg_sessions.py --agents 10 --rounds 5 --bits 16 32 --write docs/results/secure-aggregation.md
    python benchmarks/secagg_sessions.py --algorithm dssa-fedavg --write docs/results/secure-aggregation.md
    python benchmarks/secagg_sessions.py --algorithm ef-shared-fedprox --write docs/results/secure-aggregation.md

Per device and round (means over every client row of rounds 2 on), from the agents' meter: the Update packet, every
packet the device sent (the Update, its keys, shares and reveal, heartbeats) and every packet it received (the Task,
the roster, its delivery of shares, the unmask request, commits, heartbeats); the ratios to the plaintext run's and
to 4 bytes (float32) and 8 bytes (Flower's int64 layout) per parameter, and of all packets down to 4 bytes per
parameter (what a dense float32 Task costs); the round's wall time and the last round's
test accuracy. ``--write`` appends the table, the command and the machine to a Markdown file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _results import append_section

COMMON = ["algorithm.upload=\"delta\"", "algorithm.weighting=\"uniform\"", "run.export_onnx=false",
          "data.partition=\"iid\""]


def run(sets: list[str], run_dir: Path) -> dict[str, Any]:
    args = [a for s in sets for a in ("--set", s)]
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "fedge.runtime.cli", "start", "--quiet", *args, "--run-dir",
                           str(run_dir)], capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{run_dir.name}: coordinator exited {done.returncode}: {done.stderr.strip()[-500:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    clients = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text().splitlines()]
    later = [c for c in clients if c["round"] >= 2 and c.get("available", True)]
    return {
        "update": statistics.mean(c["bytes_up"] for c in later),
        "up": statistics.mean(c["bytes_payload_up"] for c in later),
        "down": statistics.mean(c["bytes_payload_down"] for c in later),
        "wall": statistics.median(r["wall_s"] for r in rows[1:]),
        "accuracy": rows[-1]["test_accuracy"],
        "failed": sum(1 for r in rows if r.get("secagg_failed")),
        "session_s": time.monotonic() - began,
    }


def parameters(model: str) -> int:
    from fedge.models import ModelSpec, build, state_to_arrays

    arrays = state_to_arrays(build(ModelSpec(model, (1, 28, 28), 10), seed=0))
    return sum(int(a.size) for a in arrays.values() if a.dtype.kind == "f")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--algorithm", default="fedavg", help="fedavg, fedprox, dssa-fedavg, dssa-fedprox (DSSA "
                        "with one warm-up round: rounds 2 on are its sparse rounds), ef-shared-fedavg or "
                        "ef-shared-fedprox")
    parser.add_argument("--train-limit", type=int, default=600)
    parser.add_argument("--bits", type=int, nargs="+", default=[16])
    parser.add_argument("--write", type=Path, default=None, help="a Markdown file for the results")
    args = parser.parse_args()
    if args.agents < 3:
        parser.error("secure aggregation needs at least 3 agents")
    sets = [*COMMON, f"algorithm.name=\"{args.algorithm}\"", f"fleet.local_agents={args.agents}",
            f"run.rounds={args.rounds}", f"model.name=\"{args.model}\"", f"data.train_limit={args.train_limit}"]
    if args.algorithm.startswith("dssa"):
        sets.append("algorithm.warmup_rounds=1")
    size = parameters(args.model)
    with tempfile.TemporaryDirectory(prefix="fedge-secagg-") as work:
        results = {"plaintext": run(sets, Path(work) / "plaintext")}
        for bits in args.bits:
            results[f"secagg, {bits} bits"] = run([*sets, "secagg.enabled=true", f"secagg.bits={bits}"],
                                                  Path(work) / f"secagg-{bits}")
    plain = results["plaintext"]
    lines = [f"`{args.algorithm}`, {args.agents} agent processes, model `{args.model}` ({size:,} float parameters), fmnist-demo IID "
             f"shards of {args.train_limit} samples, {args.rounds} rounds; per device and round, rounds 2-{args.rounds}:",
             "",
             "| run | Update packet (B) | / plaintext | / (4 B x params) | / (8 B x params) | all packets up (B) | "
             "all packets down (B) | down / (4 B x params) | round wall (median) | last accuracy | failed rounds |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['update']:,.0f} | {r['update'] / plain['update']:.3f} | "
                     f"{r['update'] / (4 * size):.3f} | {r['update'] / (8 * size):.3f} | {r['up']:,.0f} | "
                     f"{r['down']:,.0f} | {r['down'] / (4 * size):.3f} | {r['wall']:.2f} s | {r['accuracy']:.4f} | "
                     f"{r['failed']} |")
    for name, r in results.items():
        if name != "plaintext":
            lines.append("")
            lines.append(f"{name}: the stages' packets besides the Update, per device and round: "
                         f"{(r['up'] - r['update']) - (plain['up'] - plain['update']):,.0f} B up, "
                         f"{r['down'] - plain['down']:,.0f} B down (against the plaintext run's other packets)")
    table = "\n".join(lines)
    print(table)
    if args.write is not None:  # appended: one section per run of the script
        append_section(args.write, "secagg_sessions.py", "Secure aggregation in sessions: measured",
                       "[secure-aggregation.md](../secure-aggregation.md)", table)

if __name__ == "__main__":
    main()
