"""Weight divergence of FedAvg clients with position-aware neurons on and off (docs/algorithms.md 5.5, runnable check).

    python benchmarks/repro_pan_divergence.py [--out DIR] [--quick] [--seed S] [--threads T]

Fashion-MNIST demo (the bundled stand-in for the paper's MNIST), the ``mlp`` model (784-200-200-10), 10 clients
with Dirichlet label skew alpha = 0.1, FedAvg with every client in every round, 20 rounds; local training: SGD lr 0.01,
momentum 0.9, weight decay 1e-5 (the official FedPAN optimizer), batch 64, 5 local epochs (the paper's E = 5). Two
runs from the same initial weights, partition and batch order: PANs off, and PAN∘ (``pan = "mul"``, A = 0.1, T = 1).
After the local training of each round, for each weight matrix W_l the divergence (1/|S|) sum_k ||W_l^(k) - W̄_l||^2
is measured between the clients' trained models and W̄_l, the aggregate the server forms from them (FedAvg's
data-size-weighted mean); also relative to ||W̄_l||^2. fc1 and fc2 are the hidden (encoded) layers, fc3 the
classifier. Accuracy: the global model on the global test set (2,000 images). ``--quick``: 3 rounds, 1 epoch, 100
images per client. Writes into DIR (default ``runs/repro-pan_divergence``): ``pan_divergence.png``,
``pan_divergence.md``, ``pan_divergence_rounds.csv``, ``pan_divergence_summary.csv`` and ``pan_divergence.json``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from _repro_common import (
    Stopwatch,
    as_tensors,
    base_parser,
    command_line,
    markdown_table,
    parse_args,
    pyplot,
    setup_torch,
    text_table,
    write_csv,
    write_json,
)

from fedge.algorithms.base import load_into
from fedge.algorithms.loop import TrainSettings, evaluate
from fedge.fldata import load_dataset, normalize, partition
from fedge.models import ModelSpec, build, state_to_arrays
from fedge.simulation.inprocess import Fleet, global_arrays, make_fleet, run_round

LAYERS = ("fc1.weight", "fc2.weight", "fc3.weight")
HIDDEN = ("fc1.weight", "fc2.weight")
MODES = {"off": "PANs off", "mul": "PAN∘"}


@dataclass(frozen=True)
class Settings:
    clients: int = 10
    dirichlet_alpha: float = 0.1
    rounds: int = 20
    train_cap: int | None = None
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-5
    batch_size: int = 64
    epochs: int = 5
    pan_a: float = 0.1
    pan_t: float = 1.0

    @property
    def train(self) -> TrainSettings:
        return TrainSettings(epochs=self.epochs, batch_size=self.batch_size, lr=self.lr, optimizer="sgd",
                             momentum=self.momentum, weight_decay=self.weight_decay)


QUICK = Settings(rounds=3, epochs=1, train_cap=100)


@dataclass
class Trace:
    """Per round: divergence [round, layer], relative divergence [round, layer], global test accuracy [round]."""

    divergence: np.ndarray
    relative: np.ndarray
    accuracy: np.ndarray


def divergence(fleet: Fleet, aggregate: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(1/|S|) sum_k ||W^(k) - W̄||^2 per layer over the clients' trained models, and the same over ||W̄||^2."""
    trained = [state_to_arrays(model) for model in fleet.models]
    absolute, relative = np.zeros(len(LAYERS)), np.zeros(len(LAYERS))
    for column, name in enumerate(LAYERS):
        mean = aggregate[name].astype(np.float64)
        absolute[column] = np.mean([np.sum((t[name].astype(np.float64) - mean) ** 2) for t in trained])
        relative[column] = absolute[column] / np.sum(mean**2)
    return absolute, relative


def run(mode: str, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], test: tuple[torch.Tensor, torch.Tensor],
        settings: Settings, seed: int) -> Trace:
    spec = ModelSpec(name="mlp", input_shape=(1, 28, 28), num_classes=10, pan=mode, pan_a=settings.pan_a,
                     pan_t=settings.pan_t)
    fleet = make_fleet("fedavg", {}, spec, settings.clients, seed=seed)
    scratch = build(spec)
    trace = Trace(np.zeros((settings.rounds, len(LAYERS))), np.zeros((settings.rounds, len(LAYERS))),
                  np.zeros(settings.rounds))
    for round_number in range(settings.rounds):
        # Every client takes part, so after the round each fleet model holds that client's trained weights.
        run_round(fleet, round_number, pairs, settings.train, seed=seed)
        aggregate = global_arrays(fleet)
        trace.divergence[round_number], trace.relative[round_number] = divergence(fleet, aggregate)
        load_into(scratch, aggregate)
        trace.accuracy[round_number] = evaluate(scratch, *test)[0]
        cells = ", ".join(f"{n.split('.')[0]} {d:.3g}" for n, d in zip(LAYERS, trace.divergence[round_number],
                                                                         strict=True))
        print(f"  {MODES[mode]} round {round_number + 1:>2}: divergence {cells}; "
              f"test accuracy {trace.accuracy[round_number]:.4f}", flush=True)
    return trace


def summary_rows(traces: dict[str, Trace]) -> list[list[str | int | float]]:
    off, on = traces["off"], traces["mul"]
    rows: list[list[str | int | float]] = []
    for column, name in enumerate(LAYERS):
        a, b = off.divergence[:, column].mean(), on.divergence[:, column].mean()
        ra, rb = off.relative[:, column].mean(), on.relative[:, column].mean()
        kind = "hidden" if name in HIDDEN else "classifier"
        rows.append([f"{name} ({kind})", float(a), float(b), float(b / a), float(ra), float(rb), float(rb / ra)])
    return rows


def plot(traces: dict[str, Trace], path: Path, title: str) -> None:
    plt = pyplot()
    figure, axes = plt.subplots(1, len(LAYERS) + 1, figsize=(13.0, 3.4))
    colours = {"off": "tab:blue", "mul": "tab:red"}
    for mode, trace in traces.items():
        rounds = np.arange(1, len(trace.accuracy) + 1)
        for column, name in enumerate(LAYERS):
            axes[column].plot(rounds, trace.divergence[:, column], color=colours[mode], marker="o", markersize=3,
                              label=MODES[mode])
            axes[column].set_title(f"{name}{' (hidden)' if name in HIDDEN else ' (classifier)'}", fontsize=9)
            axes[column].set_ylabel("(1/|S|) Σ ||W_k - W̄||²", fontsize=8)
        axes[-1].plot(rounds, trace.accuracy, color=colours[mode], marker="o", markersize=3, label=MODES[mode])
    axes[-1].set_title("global model, global test set", fontsize=9)
    axes[-1].set_ylabel("accuracy", fontsize=8)
    for ax in axes:
        ax.set_xlabel("round", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    axes[0].legend(fontsize=8)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = base_parser("pan_divergence", __doc__.splitlines()[0])
    parser.add_argument("--pan-a", type=float, help="override the PAN∘ amplitude A")
    parser.add_argument("--lr", type=float, help="override the local learning rate")
    parser.add_argument("--rounds", type=int, help="override the number of rounds")
    args = parse_args(parser, argv)
    setup_torch(args.threads)
    settings = QUICK if args.quick else Settings()
    overrides = {"pan_a": args.pan_a, "lr": args.lr, "rounds": args.rounds}
    settings = replace(settings, **{k: v for k, v in overrides.items() if v is not None})
    watch = Stopwatch()
    dataset = load_dataset("fmnist-demo")
    shards = partition(dataset, "dirichlet", settings.clients, seed=args.seed, alpha=settings.dirichlet_alpha)
    data = [as_tensors(s, settings.train_cap, seed=args.seed) for s in shards]
    pairs = [(d.train_x, d.train_y) for d in data]
    test = (torch.from_numpy(normalize(dataset.test_x, dataset.mean, dataset.std)),
            torch.from_numpy(dataset.test_y.astype(np.int64)))
    traces = {mode: run(mode, pairs, test, settings, args.seed) for mode in MODES}
    seconds = watch.seconds()

    header = ["layer", "div off", "div on", "on/off", "rel div off", "rel div on", "rel on/off"]
    rows = summary_rows(traces)
    accuracy_header = ["run", "final test acc", "best test acc"]
    accuracy_rows: list[list[str | int | float]] = [
        [MODES[m] + (f" A={settings.pan_a:g}" if m == "mul" else ""), float(t.accuracy[-1]), float(t.accuracy.max())]
        for m, t in traces.items()]
    print("mean over rounds of the per-round divergence:")
    print("\n".join(text_table(header, rows)))
    print("\n".join(text_table(accuracy_header, accuracy_rows)))
    print(f"{seconds:.1f} s")

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    sizes = [len(s.train_y) for s in shards]
    title = (f"FedAvg, MLP, FMNIST-demo, {settings.clients} clients Dir({settings.dirichlet_alpha}), "
             f"E={settings.epochs}, seed {args.seed}: PANs off vs PAN∘ A={settings.pan_a}")
    plot(traces, out / "pan_divergence.png", title)
    write_csv(out / "pan_divergence_summary.csv", header, rows)
    round_rows: list[list[str | int | float]] = [
        [m, r + 1, *[float(v) for v in t.divergence[r]], *[float(v) for v in t.relative[r]], float(t.accuracy[r])]
        for m, t in traces.items() for r in range(len(t.accuracy))]
    write_csv(out / "pan_divergence_rounds.csv",
              ["pan", "round", *[f"div {n}" for n in LAYERS], *[f"rel {n}" for n in LAYERS], "test accuracy"],
              round_rows)
    report = [
        "# Weight divergence with PANs on and off", "",
        f"Command: `{command_line('repro_pan_divergence.py', args)}`;"
        f" {seconds:.0f} s with {args.threads} torch thread(s).", "",
        f"Settings: {asdict(settings)}; client training-set sizes {sizes}", "",
        "Mean over rounds of the per-round divergence:", "",
        *markdown_table(header, rows), "",
        *markdown_table(accuracy_header, accuracy_rows), "",
    ]
    (out / "pan_divergence.md").write_text("\n".join(report))
    write_json(out / "pan_divergence.json", {
        "settings": asdict(settings), "seed": args.seed, "seconds": round(seconds, 1), "quick": args.quick,
        "layers": list(LAYERS), "client_sizes": sizes,
        "runs": {m: {"divergence": t.divergence.tolist(), "relative": t.relative.tolist(),
                     "accuracy": t.accuracy.tolist()} for m, t in traces.items()},
        "mean_divergence": {m: dict(zip(LAYERS, t.divergence.mean(0).tolist(), strict=True))
                            for m, t in traces.items()},
        "final_accuracy": {m: float(t.accuracy[-1]) for m, t in traces.items()},
    })
    print(f"wrote {out / 'pan_divergence.png'}, {out / 'pan_divergence.md'} and the CSV/JSON tables")
    return 0


if __name__ == "__main__":
    sys.exit(main())
