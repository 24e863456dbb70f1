"""FedBN against FedAvg under feature shift (docs/algorithms.md section 7, check 5 and the paper's claim).

    python benchmarks/repro_fedbn.py [--out DIR] [--quick] [--seed S] [--threads T]

Fashion-MNIST demo, the ``feature-shift`` partition (each client's images pass through its own rotation, contrast,
brightness and noise, on its test split too), the ``cnn-bn`` model, 5 clients, every client in every round, SGD
lr 0.01 batch 32, 1 local epoch, 20 rounds; each client's training set is capped at 600 images (the paper's digits
clients hold about 744) to fit a 2-core CPU. Both algorithms start from the same model and see the same batches.
Metric: after each round, every client's model as it would start the next round (FedAvg: the global model;
FedBN: the shared tensors plus the client's own BatchNorm) is evaluated on the client's own test split; the mean
over clients is the curve. ``--quick``: 3 rounds on 128 images per client. Writes into DIR (default
``runs/repro-fedbn``): ``fedbn.png``, ``fedbn.md`` (settings and tables), ``fedbn_rounds.csv`` (per round and
client), ``fedbn_summary.csv`` and ``fedbn.json``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from _repro_common import (
    ClientData,
    Stopwatch,
    as_tensors,
    base_parser,
    command_line,
    markdown_table,
    next_round_accuracy,
    parse_args,
    pyplot,
    setup_torch,
    text_table,
    write_csv,
    write_json,
)

from fedge.algorithms.loop import TrainSettings
from fedge.fldata import load_dataset, partition
from fedge.models import ModelSpec, build
from fedge.simulation.inprocess import make_fleet, run_round

ALGORITHMS = ("fedavg", "fedbn")
SPEC = ModelSpec(name="cnn-bn", input_shape=(1, 28, 28), num_classes=10)


@dataclass(frozen=True)
class Settings:
    clients: int = 5
    rounds: int = 20
    train_cap: int = 600
    test_cap: int | None = None
    lr: float = 0.01
    batch_size: int = 32
    epochs: int = 1

    @property
    def train(self) -> TrainSettings:
        return TrainSettings(epochs=self.epochs, batch_size=self.batch_size, lr=self.lr, optimizer="sgd")


QUICK = Settings(rounds=3, train_cap=128, test_cap=100)


def run(name: str, data: Sequence[ClientData], settings: Settings, seed: int) -> np.ndarray:
    """Personal accuracy [round, client] of one algorithm."""
    fleet = make_fleet(name, {}, SPEC, settings.clients, seed=seed)
    scratch = build(SPEC)
    pairs = [(d.train_x, d.train_y) for d in data]
    accuracy = np.zeros((settings.rounds, settings.clients))
    for round_number in range(settings.rounds):
        run_round(fleet, round_number, pairs, settings.train, seed=seed)
        for index in range(settings.clients):
            accuracy[round_number, index] = next_round_accuracy(fleet, index, round_number, scratch, data[index])
        print(f"  {name} round {round_number + 1:>2}: mean personal accuracy {accuracy[round_number].mean():.4f}",
              flush=True)
    return accuracy


def summary_rows(results: dict[str, np.ndarray]) -> list[list[str | int | float]]:
    rows: list[list[str | int | float]] = []
    for name, accuracy in results.items():
        mean = accuracy.mean(axis=1)
        best = int(mean.argmax())
        rows.append([name, float(mean[-1]), float(mean[best]), best + 1, *[float(a) for a in accuracy[-1]]])
    return rows


def plot(results: dict[str, np.ndarray], path: Path, title: str) -> None:
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(6.0, 3.8))
    colours = {"fedavg": "tab:blue", "fedbn": "tab:orange"}
    for name, accuracy in results.items():
        rounds = np.arange(1, accuracy.shape[0] + 1)
        for column in accuracy.T:
            axes.plot(rounds, column, color=colours[name], alpha=0.2, linewidth=0.8)
        axes.plot(rounds, accuracy.mean(axis=1), color=colours[name], marker="o", markersize=3,
                  label=f"{name} (mean of clients)")
    axes.set_xlabel("round")
    axes.set_ylabel("personal test accuracy")
    axes.set_title(title, fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(base_parser("fedbn", __doc__.splitlines()[0]), argv)
    setup_torch(args.threads)
    settings = QUICK if args.quick else Settings()
    watch = Stopwatch()
    shards = partition(load_dataset("fmnist-demo"), "feature-shift", settings.clients, seed=args.seed)
    data = [as_tensors(s, settings.train_cap, settings.test_cap, seed=args.seed) for s in shards]
    results = {name: run(name, data, settings, args.seed) for name in ALGORITHMS}
    seconds = watch.seconds()

    clients = [f"client {i}" for i in range(settings.clients)]
    header = ["algorithm", "final mean acc", "best mean acc", "best round", *clients]
    rows = summary_rows(results)
    print("\n".join(text_table(header, rows)))
    gap = float(results["fedbn"].mean(axis=1)[-1] - results["fedavg"].mean(axis=1)[-1])
    print(f"FedBN - FedAvg, final mean personal accuracy: {gap:+.4f}; {seconds:.1f} s")

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    title = (f"FedBN vs FedAvg, FMNIST-demo feature shift, cnn-bn, {settings.clients} clients, "
             f"{settings.train_cap}/client, seed {args.seed}")
    plot(results, out / "fedbn.png", title)
    write_csv(out / "fedbn_summary.csv", header, rows)
    round_rows: list[list[str | int | float]] = [[name, r + 1, i, float(acc[r, i])] for name, acc in results.items()
                  for r in range(acc.shape[0]) for i in range(acc.shape[1])]
    write_csv(out / "fedbn_rounds.csv", ["algorithm", "round", "client", "accuracy"], round_rows)
    transforms = [s.meta["transform"] for s in shards]
    report = [
        "# FedBN vs FedAvg under feature shift", "",
        f"Command: `{command_line('repro_fedbn.py', args)}`; "
        f"{seconds:.0f} s with {args.threads} torch thread(s).", "",
        f"Settings: {asdict(settings)}", "",
        *markdown_table(header, rows), "",
        f"FedBN - FedAvg, final mean personal accuracy: {gap:+.4f}", "",
        "Client transforms: " + "; ".join(
            f"{i}: rot {t['rotation_deg']:+.1f} deg, contrast {t['contrast']:.2f}, "
            f"brightness {t['brightness']:+.2f}, noise {t['noise_std']:.3f}" for i, t in enumerate(transforms)), "",
    ]
    (out / "fedbn.md").write_text("\n".join(report))
    write_json(out / "fedbn.json", {
        "settings": asdict(settings), "seed": args.seed, "seconds": round(seconds, 1), "quick": args.quick,
        "accuracy": {name: acc.tolist() for name, acc in results.items()},
        "final_mean": {name: float(acc.mean(axis=1)[-1]) for name, acc in results.items()},
        "best_mean": {name: float(acc.mean(axis=1).max()) for name, acc in results.items()},
        "transforms": transforms,
    })
    print(f"wrote {out / 'fedbn.png'}, {out / 'fedbn.md'} and the CSV/JSON tables")
    return 0


if __name__ == "__main__":
    sys.exit(main())
