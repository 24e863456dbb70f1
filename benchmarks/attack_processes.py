"""The attack harness's headline cell with real processes: a bound session (``coordinator start --bind``) and 10
edge-agent processes on 127.0.0.1, shards from ``coordinator partition`` (fmnist-demo, Dirichlet 0.3), mlp, FedAvg,
the default bounds; one agent is tests/compromised_agent.py (claims 10^9 samples, sends -20 times its model).
A bound fleet has no shard sizes of its own, so the weight cap is derived from round 1's claims.

    .venv/bin/python benchmarks/attack_processes.py --seeds 0 --rounds 10

Prints the clean and the attacked run's final accuracy per seed, the cap and the bounded counts. Every process it
starts is stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def session(workdir: Path, seed: int, rounds: int, clients: int, attacker: str | None,
            extra: Sequence[str] = ()) -> dict[str, Any]:
    """A bound session's report.json; ``attacker``: agent 0 runs tests/compromised_agent.py with it; ``extra``:
    more arguments for ``coordinator start``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    shards = workdir / "shards"
    subprocess.run([sys.executable, "-m", "fedge.runtime.cli", "partition", "--dataset", "fmnist-demo", "--partition",
                    "dirichlet", "--alpha", "0.3", "--clients", str(clients), "--seed", str(seed), "--out",
                    str(shards)], check=True, capture_output=True, env=env, timeout=300)
    run_dir = workdir / "run"
    processes: list[subprocess.Popen[bytes]] = []
    try:
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "fedge.runtime.cli", "start", "--bind", "tcp://127.0.0.1:0", "--expect",
             str(clients), "--rounds", str(rounds), "--seed", str(seed), "--model", "mlp", "--algorithm", "fedavg",
             "--run-dir", str(run_dir), "--set", "run.export_onnx=false", "--quiet", *extra],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        until = time.monotonic() + 120
        while not (run_dir / "endpoint").exists() and time.monotonic() < until:
            time.sleep(0.2)
        address = (run_dir / "endpoint").read_text().strip()
        for i in range(clients):
            client_id = f"pi-{i:02d}"
            head = ["-m", "tests.compromised_agent", attacker] if attacker and i == 0 else ["-m", "fedge.edge_agent"]
            processes.append(subprocess.Popen(
                [sys.executable, *head, "run", "--coordinator", address, "--client-id", client_id, "--data",
                 str(shards / f"client-{i:03d}.npz"), "--state-dir", str(workdir / client_id)],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        processes[0].wait(timeout=1800)
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
    return json.loads((run_dir / "report.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--clients", type=int, default=10)
    args = parser.parse_args(argv)
    for seed in (int(s) for s in args.seeds.split(",")):
        results = {}
        for name, attacker in (("clean", None), ("attacked", "inflate-flip")):
            with tempfile.TemporaryDirectory(prefix="fedge-attack-processes-") as tmp:
                report = session(Path(tmp), seed, args.rounds, args.clients, attacker)
            results[name] = report
            print(json.dumps({"seed": seed, "run": name, "final_test_accuracy": report["final_test_accuracy"],
                              "weight_cap": report["weight_cap"], "capped": report["robust"]["capped"],
                              "clipped": report["robust"]["clipped"]}), flush=True)
        gap = 100 * (results["clean"]["final_test_accuracy"] - results["attacked"]["final_test_accuracy"])
        print(f"seed {seed}: clean {100 * results['clean']['final_test_accuracy']:.1f} %, attacked "
              f"{100 * results['attacked']['final_test_accuracy']:.1f} %, gap {gap:+.1f} points", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
