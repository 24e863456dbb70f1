"""Bytes on the wire with a team's own model: FedAvg against Fedge's compressed mode and DSSA, same data, same rounds.

A 1-D CNN plugin (benchmarks/sensor_plugin.py, resolved by its import path like any user's model) on 12,000
synthetic 6-axis sensor windows (6 x 64, float32, 6 classes), Dirichlet(0.3) over 10 clients, 10 rounds, every
client every round, in process through the real codec (every downlink and uplink is encoded to a real packet and
decoded back; the figures are those packets' sizes). Prints, per algorithm, the bytes each way, the saving against
FedAvg and the final test accuracy, all measured in this one run. docs/api.md, "Bytes with your own model", holds
its output.

    python benchmarks/byom_bytes.py [--rounds 10] [--clients 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedge.algorithms.loop import TrainSettings  # noqa: E402
from fedge.algorithms.task import evaluate_task, make_task  # noqa: E402
from fedge.fldata import dataset_from_arrays, normalize, partition  # noqa: E402
from fedge.models import ModelSpec, arrays_to_state, build, parameter_count  # noqa: E402
from fedge.simulation.inprocess import make_fleet, run_round  # noqa: E402

PLUGIN = "benchmarks.sensor_plugin:activity_cnn"
RUNS = [("fedavg", {}), ("ef-fedprox", {"keep": 0.3, "value_dtype": "ternary", "mu": 0.01}),
        ("dssa-fedprox", {"sparsity": 0.5}), ("dssa-fedprox", {"sparsity": 0.5, "warmup_rounds": 3}),
        ("dssa-fedprox", {"sparsity": 0.5, "warmup_rounds": 2})]


def run(name: str, options: dict[str, Any], rounds: int, clients: int) -> dict[str, Any]:
    from benchmarks.sensor_plugin import activity_windows

    dataset = dataset_from_arrays("activity", activity_windows())
    shards = partition(dataset, "dirichlet", clients, seed=0, alpha=0.3)
    data = [(torch.from_numpy(normalize(s.train_x, dataset.mean, dataset.std)), torch.from_numpy(s.train_y))
            for s in shards]
    spec = ModelSpec(name=PLUGIN, input_shape=dataset.input_shape, num_classes=dataset.num_outputs)
    settings = TrainSettings(epochs=1, batch_size=64, lr=1e-3, optimizer="adam")
    fleet = make_fleet(name, options, spec, clients=clients, seed=0)
    started = time.monotonic()
    for round_number in range(1, rounds + 1):
        run_round(fleet, round_number, data, settings, seed=0)
    model = build(spec)
    arrays = fleet.server.evaluation_arrays()
    arrays_to_state(model, dict(arrays), strict=False)
    test_x = torch.from_numpy(normalize(dataset.test_x, dataset.mean, dataset.std))
    metrics = evaluate_task(model, test_x, torch.from_numpy(dataset.test_y), make_task())
    return {"algorithm": name, "options": options, "bytes_down": sum(fleet.bytes_down),
            "bytes_up": sum(fleet.bytes_up), "test_accuracy": metrics["accuracy"],
            "params": parameter_count(model), "wall_s": time.monotonic() - started}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.clients < 2:
        parser.error("--rounds must be >= 1 and --clients >= 2")
    torch.set_num_threads(1)
    rows = [run(name, options, args.rounds, args.clients) for name, options in RUNS]
    dense = rows[0]["bytes_down"] + rows[0]["bytes_up"]
    for row in rows:
        row["saving_vs_fedavg"] = 1 - (row["bytes_down"] + row["bytes_up"]) / dense
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"plugin {PLUGIN}: {rows[0]['params']:,} parameters; 12,000 windows (6 x 64), {args.clients} clients, "
          f"Dirichlet 0.3, {args.rounds} rounds, all clients every round")
    print(f"{'algorithm':<50} {'down MB':>9} {'up MB':>9} {'saving':>8} {'test acc':>9} {'wall s':>7}")
    for row in rows:
        label = row["algorithm"] + ("" if not row["options"] else " " + ",".join(
            f"{k}={v}" for k, v in row["options"].items()))
        print(f"{label:<50} {row['bytes_down'] / 1e6:>9.3f} {row['bytes_up'] / 1e6:>9.3f} "
              f"{100 * row['saving_vs_fedavg']:>7.1f}% {100 * row['test_accuracy']:>8.2f}% {row['wall_s']:>7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
