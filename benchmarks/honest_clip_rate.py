"""How often the norm bound would clip honest updates, for each ``robust.norm_factor``: the runs of the small-budget
grid's setting (fmnist-demo, Dirichlet 0.3, 10 clients, the paper CNN, Adam 1e-3, batch 64) on the simulated fleet
with the norm bound off, then each factor replayed on the raw norms clients.jsonl recorded (the rule of
``protocol.influence``: round 1 and the first round of a phase against their own median, later rounds against the
previous round's). Clipping would change later norms a little; with the rates this low it does not matter.

    .venv/bin/python benchmarks/honest_clip_rate.py --algorithms fedavg,ef-fedprox --seeds 0,1 --rounds 25
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedge.api import run_session, session_config  # noqa: E402

EMBEDDED = {"name": "ef-fedprox", "keep": 0.3, "value_dtype": "ternary", "mu": 0.01}


def norms_of_run(algorithm: str, seed: int, rounds: int) -> list[list[dict[str, float]]]:
    options = EMBEDDED if algorithm == "embedded" else {"name": algorithm}
    config = session_config(run={"rounds": rounds, "seed": seed, "export_onnx": False},
                            data={"dataset": "fmnist-demo", "partition": "dirichlet", "alpha": 0.3, "clients": 10},
                            fleet={"mode": "simulated", "backend": "inline"}, model={"name": "cnn"},
                            train={"epochs": 1, "batch_size": 64, "lr": 0.001, "optimizer": "adam"},
                            algorithm=options, robust={"norm_factor": 0.0})
    with tempfile.TemporaryDirectory(prefix="fedge-clip-") as tmp:
        run_session(config, Path(tmp) / "run")
        rows = [json.loads(line) for line in (Path(tmp) / "run" / "clients.jsonl").read_text().splitlines()]
        phases = {json.loads(line)["round"]: json.loads(line).get("dssa_sparse", 0)
                  for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()}
    by_round: list[list[dict[str, float]]] = []
    for number in range(1, rounds + 1):
        by_round.append([{**r["update_norms"], "_phase": phases.get(number, 0)} for r in rows
                         if r["round"] == number and r.get("available", True)])
    return by_round


def clipped(by_round: list[list[dict[str, float]]], factor: float) -> tuple[int, int]:
    """(updates clipped, updates) under ``factor``."""
    count = total = 0
    previous: dict[str, float] | None = None
    previous_phase = None
    for updates in by_round:
        phase = updates[0]["_phase"] if updates else None
        own = {g: float(np.median([u[g] for u in updates])) for g in updates[0] if g != "_phase"} if updates else {}
        medians = own if previous is None or phase != previous_phase else previous
        for update in updates:
            total += 1
            count += any(update[g] > factor * medians.get(g, float("inf")) for g in update if g != "_phase")
        previous, previous_phase = own, phase
    return count, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", default="fedavg,embedded", help="algorithm names; 'embedded': the default")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--factors", default="1.0,1.25,1.5,2,3")
    args = parser.parse_args(argv)
    factors = [float(f) for f in args.factors.split(",")]
    print("| algorithm | seeds | " + " | ".join(f"norm_factor {f:g}" for f in factors) + " |")
    print("|---|---|" + "---|" * len(factors))
    for algorithm in args.algorithms.split(","):
        runs = [norms_of_run(algorithm, int(seed), args.rounds) for seed in args.seeds.split(",")]
        cells = []
        for factor in factors:
            counts = [clipped(run, factor) for run in runs]
            hit, total = sum(c for c, _ in counts), sum(t for _, t in counts)
            cells.append(f"{hit}/{total} ({100 * hit / total:.1f} %)")
        print(f"| {algorithm} | {args.seeds} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
