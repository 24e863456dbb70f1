"""Record a finished run of one of the README's commands as a result file the README renders.

    python benchmarks/record_run.py runs/RUN default-run --command "coordinator start --rounds 50"

Writes docs/results/run-NAME.json: the command, today's date, this machine, and the run's own figures from its
report.json and metrics.jsonl (rounds, final test accuracy, bytes both ways, wall time, the median of each round's
time beyond its slowest agent's training). ``python -m fedge.sweep.results`` then renders it into the README.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from pathlib import Path

from fedge.sweep.grid import machine

ROOT = Path(__file__).resolve().parents[1]


def figures(run_dir: Path) -> dict[str, object]:
    report = json.loads((run_dir / "report.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    beyond = [row["wall_s"] - row["train_s_max"] for row in rows
              if row.get("wall_s") is not None and row.get("train_s_max") is not None]
    return {"algorithm": report["algorithm"], "rounds": report["rounds_completed"],
            "final_test_accuracy": report["final_test_accuracy"],
            "bytes_total": report["total_bytes_down"] + report["total_bytes_up"], "wall_s": report["wall_s"],
            "beyond_training_s": statistics.median(beyond) if beyond else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("name")
    parser.add_argument("--command", required=True, help="the command as the README shows it")
    args = parser.parse_args()
    record = {"command": args.command, "date": datetime.date.today().isoformat(), "machine": machine(),
              **figures(args.run_dir)}
    out = ROOT / "docs" / "results" / f"run-{args.name}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{out}: {record}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
