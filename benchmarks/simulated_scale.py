"""A simulated fleet of many logical clients on this machine: wall time, the summed memory, bytes.

    python benchmarks/simulated_scale.py [--clients 1000] [--fraction 0.1] [--rounds 25] [--workers 0]
        [--backend local] [--algorithm default] [--model cnn] [--set KEY=VALUE ...] [--keep DIR]

Runs ``coordinator start`` with ``fleet.mode = "simulated"`` on fmnist-demo (IID shards: about 12 images a client
at 1,000 clients) and samples, every 200 ms through psutil, the resident set (RSS) of the coordinator and of every
process under it (the backend's workers; with Ray, its raylet, GCS and actors too), summed. Prints the wall time,
the peak of that sum, the coordinator's own peak, the mean round wall time and the bytes both ways from the run's
records, and the client-rounds trained per second. Figures only: no thresholds (docs/scale.md has the table).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

MB = 2**20


def tree_rss(root: psutil.Process) -> tuple[int, int]:
    """(the coordinator's RSS, the RSS summed over it and everything under it), in bytes."""
    try:
        own = root.memory_info().rss
        processes = root.children(recursive=True)
    except psutil.Error:
        return 0, 0
    total = own
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return own, total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--workers", type=int, default=0, help="0: one per core")
    parser.add_argument("--backend", default="local", choices=("inline", "local", "ray"))
    parser.add_argument("--algorithm", default="default",
                        help="an algorithm by name (with its own defaults), or 'default': the embedded default, "
                             "ef-fedprox with keep 0.3, ternary values, mu 0.01")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--set", action="append", default=[], help="more KEY=VALUE settings")
    parser.add_argument("--keep", help="write the run here (default: a temporary directory)")
    args = parser.parse_args()
    run_dir = Path(args.keep or tempfile.mkdtemp(prefix="fedge-scale-")) / "run"
    sets = ["fleet.mode=simulated", f"fleet.backend={args.backend}", f"fleet.workers={args.workers}",
            f"data.clients={args.clients}", "data.partition=iid", f"round.fraction={args.fraction}",
            f"run.rounds={args.rounds}", f"model.name={args.model}", "run.export_onnx=false",
            # naming the algorithm replaces the embedded default's options by the algorithm's own defaults
            *([] if args.algorithm == "default" else [f"algorithm.name={args.algorithm}"]), *args.set]
    command = [sys.executable, "-m", "fedge.runtime.cli", "start", "--run-dir", str(run_dir), "--quiet"]
    for item in sets:
        command += ["--set", item]
    started = time.monotonic()
    process = subprocess.Popen(command)
    root = psutil.Process(process.pid)
    peak_total = peak_own = 0
    while process.poll() is None:
        own, total = tree_rss(root)
        peak_own, peak_total = max(peak_own, own), max(peak_total, total)
        time.sleep(0.2)
    wall_s = time.monotonic() - started
    if process.returncode != 0:
        where = f"; see {run_dir}" if run_dir.exists() else " (refused before it started: the line above says why)"
        print(f"the run failed with exit code {process.returncode}{where}", file=sys.stderr)
        if not args.keep and not run_dir.exists():
            run_dir.parent.rmdir()  # the empty temporary directory made for it
        return 1
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    trained = sum(int(row["reported"]) for row in rows)
    down, up = sum(row["bytes_down"] for row in rows), sum(row["bytes_up"] for row in rows)
    accuracy = rows[-1].get("test_accuracy")
    print(f"simulated fleet: {args.clients} clients, fraction {args.fraction}, {args.rounds} rounds, "
          f"{args.algorithm} on {args.model}, backend {args.backend} ({args.workers or 'one per core'} workers)")
    print(f"  wall time               {wall_s:8.1f} s (whole command: start, partition, rounds, finish)")
    print(f"  mean round              {sum(r['wall_s'] for r in rows) / len(rows):8.2f} s over {len(rows)} rounds")
    print(f"  client-rounds trained   {trained:8d} ({trained / wall_s:.1f} per second of wall time)")
    print(f"  peak RSS, summed        {peak_total / MB:8.0f} MB (coordinator and every process under it)")
    print(f"  peak RSS, coordinator   {peak_own / MB:8.0f} MB")
    print(f"  bytes down / up         {down / 1e6:8.1f} MB / {up / 1e6:.1f} MB")
    print(f"  final test accuracy     {100 * accuracy:8.2f} %" if isinstance(accuracy, float) else
          "  final test accuracy          n/a")
    print(f"  run directory           {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
