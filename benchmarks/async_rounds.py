"""Asynchronous buffered rounds against synchronous ones at equal concurrency, on the simulated clock (issue 34).

    python benchmarks/async_rounds.py [--concurrency 30] [--seeds 0,1,2] [--out runs/async-rounds] [--write-docs]
                                      [--quick]

The setup: 100 clients of fmnist-demo (Dirichlet 0.3), an MLP (784-200-200-10; ``--model cnn`` for the paper CNN,
about 40 times the compute here), FedAvg with delta uploads, one local epoch
(Adam, lr 0.001, batches of 64); device speeds LogNormal(0, ``--sigma``) drawn from (seed, client), a task lasting
its steps times 0.05 s over its device's speed, times a jitter (``simulation.timing``). Every variant keeps
``--concurrency`` (C) devices training:

- ``sync``: C selected a round, the round as long as its slowest device;
- ``sync-over``: 1.3 C selected, the C fastest kept, the rest cancelled;
- ``sync-latency``: C selected a round by the latency policy (``round.policy = "latency"``: weighted by each device's
  round times measured so far);
- ``fedasync``: buffer 1 (each update a version), max_staleness 5 C;
- ``fedbuff``: buffer 10, max_staleness max(10, C / 2);
- ``fedbuff-stateful``: the same, with the rule of an algorithm whose devices keep state (ef-*): a device is given
  its next task only once its last update is committed, at its version's flush (what that rule costs).

Both asynchronous variants weigh an update tau versions stale 1/sqrt(1+tau) and divide by the count. The
synchronous run plays ``--rounds`` rounds; its simulated time is every other variant's budget, and a variant stops
once it reaches the target. Evaluation (the 2,000 test images) runs after every version or round and costs no
simulated time.

The target is 95 % of the plain synchronous run's best mean of 5 consecutive evaluations; a variant's time to target
is the first simulated time at which the mean of its last 3 evaluations reaches it. Each run is kept in ``--out``
(one JSON file a variant and seed): a run already there is not run again. Prints the table (and, with
``--write-docs``, replaces its block of docs/results/async.md); figures and ratios, no assertion.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
TARGET_SHARE = 0.95
BEST_WINDOW, RUNNING_WINDOW = 5, 3
VARIANTS = ("sync", "sync-over", "sync-latency", "fedasync", "fedbuff", "fedbuff-stateful")
BEGIN, END = "<!-- async figures: begin -->", "<!-- async figures: end -->"


def load(seed: int, clients: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]:
    from fedge.fldata import load_dataset, normalize, partition

    dataset = load_dataset("fmnist-demo")
    shards = partition(dataset, "dirichlet", clients, seed=seed, alpha=0.3, min_size=10)
    data = [(torch.from_numpy(normalize(s.train_x, dataset.mean, dataset.std)),
             torch.from_numpy(s.train_y.astype(np.int64))) for s in shards]
    test = (torch.from_numpy(normalize(dataset.test_x, dataset.mean, dataset.std)),
            torch.from_numpy(dataset.test_y.astype(np.int64)))
    return data, test


def play(variant: str, seed: int, concurrency: int, rounds: int, sigma: float, clients: int, model: str,
         until_s: float, target: float) -> dict[str, Any]:
    """One run: its rows, and the share of its updates from each tenth of the devices by speed (slowest first)."""
    from fedge.algorithms.base import TrainSettings
    from fedge.algorithms.loop import evaluate
    from fedge.models import ModelSpec, build
    from fedge.models.state import arrays_to_state
    from fedge.protocol.asynchronous import AsyncSettings
    from fedge.simulation.asynchronous import run_async, run_sync
    from fedge.simulation.inprocess import make_fleet
    from fedge.simulation.timing import DeviceTiming

    data, (test_x, test_y) = load(seed, clients)
    spec = ModelSpec(name=model, input_shape=(1, 28, 28), num_classes=10)
    train = TrainSettings(epochs=1, batch_size=64, lr=0.001, optimizer="adam")
    timing = DeviceTiming(step_s=0.05, speed_sigma=sigma, seed=seed)
    scratch = build(spec)

    def evaluated(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        arrays_to_state(scratch, arrays)
        with torch.no_grad():
            accuracy, loss = evaluate(scratch, test_x, test_y)
        return {"test_accuracy": accuracy, "test_loss": loss}

    fleet = make_fleet("fedavg", {"upload": "delta"}, spec, clients=clients, seed=seed)
    recent: list[float] = []

    def reached(row: dict[str, Any]) -> bool:
        recent.append(row["test_accuracy"])
        return len(recent) >= RUNNING_WINDOW and float(np.mean(recent[-RUNNING_WINDOW:])) >= target

    if variant.startswith("sync"):
        selected = math.ceil(1.3 * concurrency) if variant == "sync-over" else concurrency
        timeline = run_sync(fleet, rounds, data, train, timing, cohort=concurrency, selected=selected, seed=seed,
                            evaluate=evaluated, until_s=until_s, stop=reached,
                            policy="latency" if variant == "sync-latency" else "uniform")
    else:
        buffer = 1 if variant == "fedasync" else 10
        staleness = 5 * concurrency if variant == "fedasync" else max(10, concurrency // 2)
        settings = AsyncSettings(concurrency=concurrency, buffer=buffer, max_staleness=staleness)
        timeline = run_async(fleet, settings, data, train, timing, versions=10**9, seed=seed, evaluate=evaluated,
                             until_s=until_s, stop=reached, device_state=variant == "fedbuff-stateful")
    by_speed = sorted(range(clients), key=timing.speed)
    tenth = {client: 10 * rank // clients for rank, client in enumerate(by_speed)}
    counts = np.zeros(10)
    for row in timeline.clients:
        if "refused" not in row:
            counts[tenth[row["client"]]] += 1
    return {"rows": timeline.rows, "deciles": (counts / max(counts.sum(), 1)).tolist()}


def running_mean(rows: list[dict[str, Any]], window: int) -> list[float]:
    """The mean of each evaluation and the ``window`` - 1 before it (-1 before there are that many; a run shorter
    than the window counts as one window)."""
    values = [r["test_accuracy"] for r in rows]
    window = min(window, len(values))
    return [float(np.mean(values[max(0, i - window + 1):i + 1])) if i + 1 >= window else -1.0
            for i in range(len(values))]


def to_target(rows: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first row at which the running mean of 3 evaluations reaches ``target``, with the updates and bytes
    spent up to it; None if it never does."""
    updates = bytes_total = 0
    for row, mean in zip(rows, running_mean(rows, RUNNING_WINDOW), strict=True):
        updates += row["updates"]
        bytes_total += row["bytes_down"] + row["bytes_up"]
        if mean >= target:
            return {"time": row["sim_time_s"], "updates": updates, "bytes": bytes_total, "version": row["round"]}
    return None


def table(results: dict[str, dict[int, list[dict[str, Any]]]], seeds: list[int],
          deciles: dict[str, list[list[float]]]) -> tuple[list[str], dict]:
    lines = ["| variant | time to target (s), per seed | mean | vs sync | updates to target | MB to target |",
             "|---|---|---|---|---|---|"]
    summary: dict[str, Any] = {}
    targets = {s: TARGET_SHARE * max(running_mean(results["sync"][s], BEST_WINDOW)) for s in seeds}
    sync_times = [(to_target(results["sync"][s], targets[s]) or {}).get("time", math.nan) for s in seeds]
    for variant in VARIANTS:
        reached = [to_target(results[variant][s], targets[s]) for s in seeds]
        times = [r["time"] if r else math.nan for r in reached]
        mean_time = float(np.mean(times)) if all(r for r in reached) else math.nan
        ratio = float(np.mean(sync_times)) / mean_time if mean_time == mean_time else math.nan
        updates = np.mean([r["updates"] for r in reached if r]) if any(reached) else math.nan
        megabytes = np.mean([r["bytes"] for r in reached if r]) / 1e6 if any(reached) else math.nan
        per_seed = ", ".join(f"{t:.1f}" if t == t else "not reached" for t in times)
        lines.append(f"| {variant} | {per_seed} | {mean_time:.1f} | {ratio:.2f}x | {updates:.0f} | "
                     f"{megabytes:.0f} |")
        summary[variant] = {"times": times, "mean_time": mean_time, "speedup_vs_sync": ratio, "updates": updates,
                            "megabytes": megabytes}
    lines += ["", "The share of each variant's updates (to its target, or to the end of its budget) from each tenth of the "
              "devices by speed, slowest tenth first, averaged over the seeds:", "",
              "| variant | " + " | ".join(f"d{i + 1}" for i in range(10)) + " |", "|---|" + "---|" * 10]
    for variant in VARIANTS:
        shares = np.mean(deciles[variant], axis=0)
        lines.append(f"| {variant} | " + " | ".join(f"{100 * share:.0f} %" for share in shares) + " |")
        summary[variant]["deciles"] = shares.tolist()
    lines.append("")
    lines.append("Targets (95 % of sync's best 5-evaluation mean), per seed: " +
                 ", ".join(f"{s}: {100 * t:.1f} %" for s, t in targets.items()))
    return lines, summary


def write_docs(lines: list[str], command: str, concurrency: int, sigma: float) -> None:
    page = ROOT / "docs" / "results" / "async.md"
    what = f"figures C={concurrency} sigma={sigma:g}"
    begin, end = BEGIN.replace("figures", what), END.replace("figures", what)
    text = page.read_text() if page.exists() else ""
    block = "\n".join([begin, "", f"### C = {concurrency}, σ = {sigma:g}", "", f"`{command}`", "", *lines, "", end])
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    page.write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=30)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rounds", type=int, default=40, help="the synchronous run's rounds (its time: the budget)")
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--model", default="mlp", choices=("mlp", "cnn"))
    parser.add_argument("--out", type=Path, default=Path("runs/async-rounds"))
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a tiny run (seconds) for the smoke test")
    args = parser.parse_args()
    if args.quick:
        args.concurrency, args.rounds, args.clients, args.seeds = 4, 2, 12, "0"  # (12: a stateful buffer of 10)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.concurrency < 1 or args.rounds < 1 or args.clients < math.ceil(1.3 * args.concurrency):
        parser.error("need --concurrency >= 1, --rounds >= 1 and --clients >= 1.3 x --concurrency")
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[int, list[dict[str, Any]]]] = {v: {} for v in VARIANTS}
    deciles: dict[str, list[list[float]]] = {v: [] for v in VARIANTS}
    for seed in seeds:
        for variant in VARIANTS:
            path = args.out / f"{args.model}-c{args.concurrency}-s{args.sigma:g}-{variant}-seed{seed}.json"
            if path.exists():
                kept = json.loads(path.read_text())
                results[variant][seed], deciles[variant] = kept["rows"], deciles[variant] + [kept["deciles"]]
                continue
            sync = results["sync"].get(seed)
            budget = sync[-1]["sim_time_s"] if sync else math.inf
            target = TARGET_SHARE * max(running_mean(sync, BEST_WINDOW)) if sync else math.inf
            began = time.perf_counter()
            run = play(variant, seed, args.concurrency, args.rounds, args.sigma, args.clients, args.model, budget,
                       target)
            print(f"{variant} seed {seed}: {len(run['rows'])} rows, {time.perf_counter() - began:.0f} s",
                  file=sys.stderr)
            path.write_text(json.dumps(run))
            results[variant][seed], deciles[variant] = run["rows"], deciles[variant] + [run["deciles"]]
    lines, summary = table(results, seeds, deciles)
    print("\n".join(lines))
    print(json.dumps(summary))
    if args.write_docs and not args.quick:
        command = f"python benchmarks/async_rounds.py --concurrency {args.concurrency} --seeds {args.seeds} " \
                  f"--rounds {args.rounds} --sigma {args.sigma:g} --model {args.model} --out {args.out} --write-docs"
        write_docs(lines, command, args.concurrency, args.sigma)
    return 0


if __name__ == "__main__":
    sys.exit(main())
