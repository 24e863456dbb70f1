"""What client-level differential privacy costs in accuracy: DP-FedAvg at several target epsilons against the same
run without privacy, on real Fashion-MNIST split over thousands of simulated clients.

    python benchmarks/privacy_utility.py --out runs/privacy-utility            # the table of docs/results/privacy.md
    python benchmarks/privacy_utility.py --rounds 20 --epsilons 8 --out /tmp/p # a shorter look

Each run is `coordinator start`'s session in this process (a simulated fleet, two worker processes): Fashion-MNIST from
Debian's dataset-fashion-mnist (60,000 training images) as `--clients` IID clients, the MLP, SGD on the clients, a
server step with momentum, Poisson sampling at `--fraction`, delta 1e-5, epsilon calibrated for the planned rounds
(adaptive clipping from `--clip`). The private runs and the non-private one share every other setting. A run whose
report.json says done is not run again, and one interrupted goes on from its checkpoint (resumable). Prints one row
per run and the last-10-round mean accuracy's gap to the non-private run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np


def settings(args: argparse.Namespace, epsilon: float | None) -> list[str]:
    common = ["algorithm.name=fedavg", "algorithm.upload=\"delta\"", "algorithm.weighting=\"uniform\"",
              "model.name=mlp", "data.dataset=fmnist", "data.partition=iid", f"data.clients={args.clients}",
              "fleet.mode=simulated", "fleet.backend=local", "fleet.workers=2", "fleet.heartbeat_s=30", "fleet.liveness_s=3600",
              f"round.fraction={args.fraction}", f"run.rounds={args.rounds}", "run.export_onnx=false",
              f"run.seed={args.seed}", "train.optimizer=sgd", f"train.lr={args.lr}", "train.batch_size=10",
              f"train.epochs={args.epochs}", f"server.lr={args.server_lr}", f"server.momentum={args.momentum}",
              "robust.norm_factor=0", "robust.cap_factor=0"]
    if epsilon is None:
        return common
    private = [s for s in common if not s.startswith(("algorithm.upload", "algorithm.weighting", "robust."))]
    return [*private, "privacy.mode=central", f"privacy.target_epsilon={epsilon}", f"privacy.clip={args.clip}",
            f"privacy.adaptive_clip={'true' if args.adaptive else 'false'}", "privacy.delta=1e-5"]


def run_one(sets: list[str], run_dir: Path) -> dict[str, Any]:
    from fedge.coordinator.config import load_config
    from fedge.coordinator.rundir import RunDir
    from fedge.runtime.launch import plan_resume, play
    from fedge.runtime.plan import plan_session

    report_path = run_dir / "report.json"
    if report_path.exists() and json.loads(report_path.read_text()).get("status") == "done":
        return dict(json.loads(report_path.read_text()))
    if (run_dir / "checkpoint.npz").exists():  # an interrupted run goes on from its checkpoint (its ledger kept)
        return play(plan_resume(run_dir, load_config(run_dir / "config.toml")), RunDir(run_dir), resuming=True)
    return play(plan_session(load_config(None, sets)), RunDir(run_dir), resuming=False)


def last_mean(run_dir: Path, last: int = 10) -> float:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    accuracies = [row["test_accuracy"] for row in rows if row.get("test_accuracy") is not None]
    return float(np.mean(accuracies[-last:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epsilons", default="2,4,8")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--clients", type=int, default=6000)
    parser.add_argument("--fraction", type=float, default=0.05)
    parser.add_argument("--clip", type=float, default=0.1)
    parser.add_argument("--adaptive", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--server-lr", type=float, default=1.0)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    epsilons: list[float | None] = [None, *[float(e) for e in args.epsilons.split(",") if e]]
    results = []
    for epsilon in epsilons:
        name = "non-private" if epsilon is None else f"epsilon-{epsilon:g}"
        started = time.monotonic()
        report = run_one(settings(args, epsilon), args.out / name)
        privacy = report.get("privacy") or {}
        results.append({"run": name, "target_epsilon": epsilon, "epsilon": privacy.get("epsilon"),
                        "noise_multiplier": privacy.get("noise_multiplier"), "final_clip": privacy.get("clip"),
                        "last10_accuracy": last_mean(args.out / name), "wall_s": round(time.monotonic() - started, 1),
                        "rounds": report["rounds_completed"]})
        print(json.dumps(results[-1]), flush=True)
    baseline = results[0]["last10_accuracy"]
    print("\n| run | epsilon (delta 1e-5) | noise multiplier | final clip | accuracy, last 10 rounds | gap, points |")
    print("|---|---|---|---|---|---|")
    for row in results:
        eps = "—" if row["epsilon"] is None else f"{row['epsilon']:.2f}"
        z = "—" if row["noise_multiplier"] is None else f"{row['noise_multiplier']:.3f}"
        clip = "—" if row["final_clip"] is None else f"{row['final_clip']:.3f}"
        print(f"| {row['run']} | {eps} | {z} | {clip} | {100 * row['last10_accuracy']:.1f} % | "
              f"{100 * (baseline - row['last10_accuracy']):+.1f} |")
    (args.out / "summary.json").write_text(json.dumps({"command": vars(args) | {"out": str(args.out)},
                                                       "results": results}, indent=2, default=str))


if __name__ == "__main__":
    main()
