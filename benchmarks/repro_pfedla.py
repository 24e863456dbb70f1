"""pFedLA's aggregation weights on a chain of 8 clients (ALGORITHMS.md 6.6, Figs. 5-6 and the proxy check).

    python benchmarks/repro_pfedla.py [--out DIR] [--quick] [--seed S] [--threads T]
        [--rounds R] [--hn-lr H] [--epochs E] [--train-cap N] [--no-reference]

Fashion-MNIST demo, the ``classes`` partition with ``classes_layout = "chain"``: client i holds classes i..i+3
(mod 10) and shares 3 of them with clients i-1 and i+1, 2 with i+-2, 1 with i+-3 (client 7 holds 7, 8, 9, 0, so it
also shares class 0 with client 0). pFedLA (k = 0) on the ``mlp`` model, every client in every round, SGD lr 0.005
batch 32 (ALGORITHMS.md 6.3 for FMNIST), 1 local epoch on at most 300 images per client, 60 rounds.

The hypernetwork learning rate: ALGORITHMS.md 6.3 gives eta_hn = 5e-3 with 10 local epochs and 600 rounds. On a CPU
budget the rows then do not move off their random initialisation (at most 0.003 after 30 rounds of 10 full epochs;
docs/reproductions.md has the measurements), so the main run uses eta_hn = 1 (``--hn-lr``, 200x the paper's) to
compress the time scale, and a reference run with eta_hn = 5e-3 and otherwise the same settings is reported beside
it. alpha_i (rows over the 8 clients, one row per layer fc1, fc2, fc3) is read through the server half's read-only
``Server.aggregation_weights(i)``.

The check (ALGORITHMS.md 6.6, fixed, not tuned): on the layer-averaged alpha, client i PASSES when its self weight is
the largest in its row and each chain neighbour's weight (i-1 and i+1 where they exist) is above the mean weight of
the other, non-neighbour clients. The run PASSES when every client does. Writes into DIR (default
``runs/repro-pfedla``): ``pfedla.png`` (heatmap, per-layer heatmaps, the weights' trajectory), ``pfedla.md``,
``pfedla_alpha.csv`` (the layer-averaged matrix), ``pfedla_check.csv``, ``pfedla_rounds.csv`` and ``pfedla.json``.
``--quick``: 4 rounds on 64 images per client (no reference run).
"""

from __future__ import annotations

import os

# The hypernetwork step takes numpy dot products of whole layers; with OpenBLAS threads competing with the training
# for two cores they run tens of times slower. Must be set before numpy is first imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from dataclasses import asdict, dataclass, replace  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from _repro_common import (  # noqa: E402
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

from fedge.algorithms.inprocess import Fleet, make_fleet, run_round  # noqa: E402
from fedge.algorithms.loop import TrainSettings  # noqa: E402
from fedge.fldata import load_dataset, partition  # noqa: E402
from fedge.models import ModelSpec, build  # noqa: E402

CLIENTS = 8
SPEC = ModelSpec(name="mlp", input_shape=(1, 28, 28), num_classes=10)
PAPER_HN_LR = 5e-3


@dataclass(frozen=True)
class Settings:
    rounds: int = 60
    hn_lr: float = 1.0
    epochs: int = 1
    train_cap: int | None = 300
    lr: float = 0.005
    batch_size: int = 32
    classes_per_client: int = 4

    @property
    def train(self) -> TrainSettings:
        return TrainSettings(epochs=self.epochs, batch_size=self.batch_size, lr=self.lr, optimizer="sgd")


QUICK = Settings(rounds=4, train_cap=64)


@dataclass
class Trace:
    """alpha [round, client, layer, client] after each round, personal accuracy [round, client], layer names."""

    alpha: np.ndarray
    accuracy: np.ndarray
    layers: list[str]


def read_alpha(fleet: Fleet) -> np.ndarray:
    """alpha[i, l, j] for every client i, layer l and client j, via the server half's ``aggregation_weights``."""
    return np.stack([fleet.server.aggregation_weights(i) for i in range(CLIENTS)])


def neighbours(index: int) -> list[int]:
    return [j for j in (index - 1, index + 1) if 0 <= j < CLIENTS]


@dataclass(frozen=True)
class Verdict:
    """One client's row of the check."""

    client: int
    self_weight: float
    max_other: float
    neighbours: tuple[float, ...]
    others_mean: float
    self_largest: bool
    neighbours_above: bool

    @property
    def passed(self) -> bool:
        return self.self_largest and self.neighbours_above


def check(matrix: np.ndarray) -> list[Verdict]:
    """The per-client verdicts on a layer-averaged (N, N) alpha matrix."""
    verdicts = []
    for i, row in enumerate(matrix):
        near = neighbours(i)
        others = [j for j in range(CLIENTS) if j != i and j not in near]
        others_mean = float(row[others].mean())
        verdicts.append(Verdict(
            client=i, self_weight=float(row[i]), max_other=float(np.delete(row, i).max()),
            neighbours=tuple(float(row[j]) for j in near), others_mean=others_mean,
            self_largest=bool(all(row[i] > row[j] for j in range(CLIENTS) if j != i)),
            neighbours_above=bool(all(row[j] > others_mean for j in near))))
    return verdicts


def run(data: Sequence[ClientData], settings: Settings, seed: int, label: str) -> Trace:
    fleet = make_fleet("pfedla", {"hn_lr": settings.hn_lr}, SPEC, CLIENTS, seed=seed)
    layers = fleet.server.layer_names
    scratch = build(SPEC)
    pairs = [(d.train_x, d.train_y) for d in data]
    alpha = np.zeros((settings.rounds, CLIENTS, len(layers), CLIENTS))
    accuracy = np.zeros((settings.rounds, CLIENTS))
    for round_number in range(settings.rounds):
        run_round(fleet, round_number, pairs, settings.train, seed=seed)
        alpha[round_number] = read_alpha(fleet)
        for index in range(CLIENTS):
            accuracy[round_number, index] = next_round_accuracy(fleet, index, round_number, scratch, data[index])
        if (round_number + 1) % 10 == 0 or round_number + 1 == settings.rounds:
            passed = sum(r.passed for r in check(alpha[round_number].mean(axis=1)))
            print(f"  {label} round {round_number + 1:>3}: {passed}/{CLIENTS} clients pass; mean personal "
                  f"accuracy {accuracy[round_number].mean():.4f}", flush=True)
    return Trace(alpha, accuracy, layers)


def collapsed(matrix: np.ndarray) -> int:
    """Rows whose every layer is exactly one-hot on the client itself (the hypernetwork's ReLUs died)."""
    return int(sum(np.all(matrix[i, :, i] == 1.0) for i in range(CLIENTS)))


def weight_classes(matrix: np.ndarray) -> tuple[float, float, float]:
    """Mean self weight, mean chain-neighbour weight, mean weight of the rest."""
    own = np.mean([matrix[i, i] for i in range(CLIENTS)])
    near = np.mean([matrix[i, j] for i in range(CLIENTS) for j in neighbours(i)])
    rest = np.mean([matrix[i, j] for i in range(CLIENTS) for j in range(CLIENTS) if abs(i - j) > 1])
    return float(own), float(near), float(rest)


def plot(trace: Trace, reference: Trace | None, path: Path, title: str) -> None:
    plt = pyplot()
    columns = 2 + len(trace.layers)
    figure, axes = plt.subplots(1, columns, figsize=(3.3 * columns, 3.4),
                                gridspec_kw={"width_ratios": [1.3] + [1.0] * len(trace.layers) + [1.4]})
    final = trace.alpha[-1]
    panels = [("mean over layers", final.mean(axis=1))] + [(name, final[:, li]) for li, name in
                                                             enumerate(trace.layers)]
    mean = panels[0][1]
    low, top = float(mean.min()), float(mean.max())
    per_layer = (min(float(m.min()) for _, m in panels[1:]), max(float(m.max()) for _, m in panels[1:]))
    for position, (ax, (name, matrix)) in enumerate(zip(axes, panels, strict=False)):
        scale = (low, top) if position == 0 else per_layer
        image = ax.imshow(matrix, cmap="viridis", vmin=scale[0], vmax=scale[1])
        ax.set_title(f"α, {name}", fontsize=9)
        ax.set_xticks(range(CLIENTS))
        ax.set_yticks(range(CLIENTS))
        ax.tick_params(labelsize=7)
        ax.set_xlabel("client j (weight given to)", fontsize=8)
        if position in (0, len(panels) - 1):
            figure.colorbar(image, ax=ax, fraction=0.046).ax.tick_params(labelsize=7)
    axes[0].set_ylabel("client i (row)", fontsize=8)
    for i in range(CLIENTS):
        for j in range(CLIENTS):
            colour = "black" if mean[i, j] > low + 0.6 * (top - low) else "white"
            axes[0].text(j, i, f"{mean[i, j]:.2f}", ha="center", va="center", fontsize=5.5, color=colour)
    ax = axes[-1]
    for run_trace, style, tag in ((trace, "-", "main"), (reference, ":", "η_hn 5e-3")):
        if run_trace is None:
            continue
        series = np.array([weight_classes(a.mean(axis=1)) for a in run_trace.alpha])
        rounds = np.arange(1, len(series) + 1)
        for column, (name, colour) in enumerate((("self", "tab:red"), ("neighbours", "tab:orange"),
                                                 ("others", "tab:blue"))):
            ax.plot(rounds, series[:, column], style, color=colour, label=f"{name} ({tag})")
    passing = ax.twinx()
    passing.step(np.arange(1, len(trace.alpha) + 1), [sum(v.passed for v in check(a.mean(axis=1)))
                                                      for a in trace.alpha], where="mid", color="grey",
                 alpha=0.5, linewidth=1.0)
    passing.set_ylim(0, CLIENTS + 0.5)
    passing.set_ylabel("clients passing (grey, main run)", fontsize=7)
    passing.tick_params(labelsize=7)
    ax.set_title("mean α by relation", fontsize=9)
    ax.set_xlabel("round", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser("pfedla", __doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, help="override the number of rounds")
    parser.add_argument("--hn-lr", type=float, help="override the main run's hypernetwork learning rate")
    parser.add_argument("--epochs", type=int, help="override the local epochs")
    parser.add_argument("--train-cap", type=int, help="override the images per client (0: all)")
    parser.add_argument("--no-reference", action="store_true", help="skip the eta_hn = 5e-3 reference run")
    return parse_args(parser, argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    setup_torch(args.threads)
    settings = QUICK if args.quick else Settings()
    overrides = {"rounds": args.rounds, "hn_lr": args.hn_lr, "epochs": args.epochs}
    settings = replace(settings, **{k: v for k, v in overrides.items() if v is not None})
    if args.train_cap is not None:
        settings = replace(settings, train_cap=args.train_cap or None)
    watch = Stopwatch()
    shards = partition(load_dataset("fmnist-demo"), "classes", CLIENTS, seed=args.seed,
                       classes_per_client=settings.classes_per_client, classes_layout="chain")
    data = [as_tensors(s, settings.train_cap, seed=args.seed) for s in shards]
    trace = run(data, settings, args.seed, f"η_hn {settings.hn_lr:g}")
    reference = None
    if not (args.quick or args.no_reference or settings.hn_lr == PAPER_HN_LR):
        reference = run(data, replace(settings, hn_lr=PAPER_HN_LR), args.seed, f"η_hn {PAPER_HN_LR:g}")
    seconds = watch.seconds()

    matrix = trace.alpha[-1].mean(axis=1)
    verdicts = check(matrix)
    overall = all(v.passed for v in verdicts)
    alpha_header = ["client i \\ j", *[str(j) for j in range(CLIENTS)]]
    alpha_rows: list[list[str | int | float]] = [[i, *[float(x) for x in row]] for i, row in enumerate(matrix)]
    check_header = ["client", "classes", "self", "max other", "neighbours", "others mean", "self largest",
                    "neighbours above", "verdict"]
    check_rows: list[list[str | int | float]] = [[
        v.client, " ".join(str(c) for c in shards[v.client].meta["classes"]), v.self_weight, v.max_other,
        " ".join(f"{x:.4f}" for x in v.neighbours), v.others_mean, "yes" if v.self_largest else "no",
        "yes" if v.neighbours_above else "no", "PASS" if v.passed else "FAIL"] for v in verdicts]
    print(f"alpha averaged over layers {trace.layers}, after round {settings.rounds} (eta_hn {settings.hn_lr:g}):")
    print("\n".join(text_table(alpha_header, alpha_rows)))
    print("\n".join(text_table(check_header, check_rows)))
    print(f"OVERALL: {'PASS' if overall else 'FAIL'} ({sum(v.passed for v in verdicts)}/{CLIENTS} clients)")
    lines_reference: list[str] = []
    reference_summary: dict[str, object] | None = None
    if reference is not None:
        ref_matrix = reference.alpha[-1].mean(axis=1)
        ref_verdicts = check(ref_matrix)
        moved = float(np.abs(reference.alpha[-1] - reference.alpha[0]).max())
        ref_passed = sum(v.passed for v in ref_verdicts)
        lines_reference = [
            f"Reference run, eta_hn = {PAPER_HN_LR:g} (ALGORITHMS.md): {ref_passed}/{CLIENTS} clients pass "
            f"({'PASS' if ref_passed == CLIENTS else 'FAIL'}); the largest change of any alpha entry between rounds 1 "
            f"and {settings.rounds} is {moved:.2g}; self / neighbour / other mean weights "
            + " / ".join(f"{x:.4f}" for x in weight_classes(ref_matrix))
            + f"; final mean personal accuracy {reference.accuracy[-1].mean():.4f}."]
        reference_summary = {"hn_lr": PAPER_HN_LR, "alpha_mean_over_layers": ref_matrix.tolist(),
                             "clients_passed": ref_passed, "max_alpha_change": moved,
                             "final_mean_accuracy": float(reference.accuracy[-1].mean())}
        print(lines_reference[0])
    print(f"final mean personal accuracy {trace.accuracy[-1].mean():.4f}; {seconds:.1f} s")

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    title = (f"pFedLA, FMNIST-demo chain (4 classes/client), MLP, η_hn {settings.hn_lr:g}, "
             f"after round {settings.rounds}, seed {args.seed}")
    plot(trace, reference, out / "pfedla.png", title)
    write_csv(out / "pfedla_alpha.csv", alpha_header, alpha_rows)
    write_csv(out / "pfedla_check.csv", check_header, check_rows)
    passes = [sum(v.passed for v in check(a.mean(axis=1))) for a in trace.alpha]
    round_rows: list[list[str | int | float]] = [
        [r + 1, passes[r], collapsed(trace.alpha[r]), *weight_classes(trace.alpha[r].mean(axis=1)),
         float(trace.accuracy[r].mean())] for r in range(settings.rounds)]
    round_header = ["round", "clients passing", "one-hot rows", "mean self", "mean neighbour", "mean other",
                    "mean personal acc"]
    write_csv(out / "pfedla_rounds.csv", round_header, round_rows)
    every = max(1, settings.rounds // 10)
    report = [
        "# pFedLA aggregation weights on a chain of 8 clients", "",
        f"Command: `{command_line('repro_pfedla.py', args)}`; "
        f"{seconds:.0f} s with {args.threads} torch thread(s).", "",
        f"Settings: {asdict(settings)}", "",
        f"alpha averaged over layers {trace.layers} after round {settings.rounds} (row i: the weights client i's "
        "model is built from):", "",
        *markdown_table(alpha_header, alpha_rows), "",
        *markdown_table(check_header, check_rows), "",
        f"OVERALL: {'PASS' if overall else 'FAIL'} ({sum(v.passed for v in verdicts)}/{CLIENTS} clients)", "",
        *lines_reference, "",
        "Trajectory (every few rounds):", "",
        *markdown_table(round_header, [row for row in round_rows if int(row[0]) % every == 0]), "",
    ]
    (out / "pfedla.md").write_text("\n".join(report))
    write_json(out / "pfedla.json", {
        "settings": asdict(settings), "seed": args.seed, "seconds": round(seconds, 1), "quick": args.quick,
        "layers": trace.layers, "alpha_mean_over_layers": matrix.tolist(),
        "alpha_per_layer": trace.alpha[-1].tolist(), "check": [{**asdict(v), "passed": v.passed} for v in verdicts],
        "passed": overall, "clients_passing_per_round": passes,
        "accuracy": trace.accuracy.tolist(), "reference": reference_summary,
    })
    print(f"wrote {out / 'pfedla.png'}, {out / 'pfedla.md'} and the CSV/JSON tables")
    return 0


if __name__ == "__main__":
    sys.exit(main())
