"""pFedLA's aggregation weights on a chain of 8 clients, judged by the pre-registered criterion (docs/algorithms.md).

    python benchmarks/repro_pfedla.py --seed 11                  # pilot, eta_hn by the rule, T = 200, the verdict
    python benchmarks/repro_pfedla.py --seed 11 --guard --grid   # plus the descriptions: guard on, eta_hn log-grid
    python benchmarks/repro_pfedla.py --quick                    # seconds, for the smoke test
    options: [--out DIR] [--rounds T] [--hn-lr H] [--epochs E] [--train-cap N] [--threads T]

Fashion-MNIST demo, the ``classes`` partition with ``classes_layout = "chain"``: client i holds classes i..i+3
(mod 10), so chain neighbours share 3 classes (client 7 holds 7, 8, 9, 0 and shares class 0 with client 0). pFedLA
(k = 0) on the ``mlp`` model, every client in every round, SGD lr 0.005, batch 32, 1 local epoch on at most 300 images
per client, T = 200 rounds, the hypernetworks starting exactly uniform: the settings docs/algorithms.md
pre-registers (section "pFedLA: the chain reproduction"), none of them tuned here.

eta_hn is fixed before the run by the rule, unless ``--hn-lr`` gives it (then the run is a description): a pilot of
6 rounds at eta_hn = 1e-4 measures gbar (the median over rounds 2-6, clients and layers of ||P g_i^l||, the centred
alpha-gradient) and gamma (the median over clients and layers of max_j |d alpha_i^{l,j}| / (1e-4 ||P g_i^l||) on the
pilot's first step that can move alpha, round 2's), and eta_hn = 0.1 / (gamma T gbar). The verdict is C1-C3 of ``pfedla_criterion`` on alpha at the
evaluation point (the first round whose mean self weight reaches 1.5/8, else the last round, "not formed");
the former strict per-row count is reported beside it, as a description. ``--guard`` adds a run with the |d alpha|
<= 0.01 guard, ``--grid`` runs at the rule's eta_hn x 1/10, 1/3, 3 and 10: descriptions, never the verdict.

Writes into DIR (default ``runs/repro-pfedla``): ``pfedla.png`` (heatmaps at the evaluation point and the weights'
trajectory), ``pfedla.md``, ``pfedla_alpha.csv`` (the layer-averaged matrix at the evaluation point),
``pfedla_runs.csv`` (one line per run), ``pfedla_rounds.csv`` and ``pfedla.json``.
"""

from __future__ import annotations

import os

# The hypernetwork step takes numpy dot products of whole layers; with OpenBLAS threads competing with the training
# for two cores they run tens of times slower. Must be set before numpy is first imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from copy import deepcopy  # noqa: E402
from dataclasses import asdict, dataclass, field, replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _repro_common import (  # noqa: E402
    ClientData,
    Stopwatch,
    as_tensors,
    base_parser,
    command_line,
    markdown_table,
    next_round_accuracy,
    parse_args,
    setup_torch,
    text_table,
    write_csv,
    write_json,
)
from pfedla_figure import plot  # noqa: E402

from fedge.algorithms.hypernetwork import HyperNetwork, descend, normalise  # noqa: E402
from fedge.algorithms.loop import TrainSettings  # noqa: E402
from fedge.fldata import load_dataset, partition  # noqa: E402
from fedge.models import ModelSpec, build  # noqa: E402
from fedge.simulation.inprocess import Fleet, make_fleet, run_round  # noqa: E402
from fedge.sweep import pfedla_criterion as criterion  # noqa: E402

CLIENTS = 8
SPEC = ModelSpec(name="mlp", input_shape=(1, 28, 28), num_classes=10)
PILOT_HN_LR = 1e-4
GUARD = 0.01
GRID = (0.1, 1 / 3, 3.0, 10.0)


@dataclass(frozen=True)
class Settings:
    rounds: int = 200
    epochs: int = 1
    train_cap: int | None = 300
    lr: float = 0.005
    batch_size: int = 32
    classes_per_client: int = 4
    pilot_rounds: int = 6

    @property
    def train(self) -> TrainSettings:
        return TrainSettings(epochs=self.epochs, batch_size=self.batch_size, lr=self.lr, optimizer="sgd")


QUICK = Settings(rounds=4, train_cap=64, pilot_rounds=3)


@dataclass
class Trace:
    """One run: alpha [round, client, layer, client] after each round (round 0: before any), personal accuracy
    [round, client] after each round, the centred alpha-gradient norms [round, client, layer] of each round's HN
    step, and the guard's step scales [round, client]."""

    label: str
    hn_lr: float
    guard: float
    layers: list[str]
    alpha: np.ndarray
    accuracy: np.ndarray
    gradient_norms: np.ndarray
    step_scales: np.ndarray
    verdict: dict[str, Any] = field(default_factory=dict)
    evaluated_round: int = 0
    formed: bool = False


def read_alpha(fleet: Fleet) -> np.ndarray:
    """alpha[i, l, j] for every client i, layer l and client j, via the server half's ``aggregation_weights``."""
    return np.stack([fleet.server.aggregation_weights(i) for i in range(CLIENTS)])


def run(data: Sequence[ClientData], settings: Settings, rounds: int, seed: int, hn_lr: float, guard: float,
        label: str, evaluate: bool = True) -> Trace:
    fleet = make_fleet("pfedla", {"hn_lr": hn_lr, "max_alpha_change": guard}, SPEC, CLIENTS, seed=seed)
    scratch = build(SPEC)
    pairs = [(d.train_x, d.train_y) for d in data]
    layers = fleet.server.layer_names
    alpha = np.zeros((rounds + 1, CLIENTS, len(layers), CLIENTS))
    alpha[0] = read_alpha(fleet)
    accuracy = np.full((rounds + 1, CLIENTS), np.nan)
    norms = np.zeros((rounds + 1, CLIENTS, len(layers)))
    scales = np.ones((rounds + 1, CLIENTS))
    for round_number in range(rounds):
        run_round(fleet, round_number, pairs, settings.train, seed=seed)
        alpha[round_number + 1] = read_alpha(fleet)
        for index in range(CLIENTS):
            norms[round_number + 1, index] = criterion.centred_norms(fleet.server.last_gradients[index])
            scales[round_number + 1, index] = fleet.server.last_step_scales[index]
            if evaluate:
                accuracy[round_number + 1, index] = next_round_accuracy(fleet, index, round_number, scratch,
                                                                        data[index])
        if evaluate and ((round_number + 1) % 25 == 0 or round_number + 1 == rounds):
            mean_self = criterion.mean_self_weight(alpha[round_number + 1].mean(axis=1))
            print(f"  {label} round {round_number + 1:>3}: mean self weight {mean_self:.4f}; mean personal "
                  f"accuracy {np.nanmean(accuracy[round_number + 1]):.4f}", flush=True)
    return Trace(label, hn_lr, guard, layers, alpha, accuracy, norms, scales)


def step_gains(network: HyperNetwork, index: int, gradient: np.ndarray) -> np.ndarray:
    """max_j |d alpha_i^{l,j}| / (eta ||P g_i^l||) per layer for one HN step at eta = 1e-4 from ``network``'s
    current psi, taken on a float64 copy: in float32 the step moves alpha by less than float32 resolves near 1/8."""
    copy = deepcopy(network).double()
    alpha = normalise(copy(), index)
    before = alpha.detach().clone()
    descend(copy, alpha, gradient, PILOT_HN_LR)
    with torch.no_grad():
        change = (normalise(copy(), index) - before).abs().amax(dim=1).numpy()
    return change / (PILOT_HN_LR * criterion.centred_norms(gradient))


def pilot(data: Sequence[ClientData], settings: Settings, seed: int) -> tuple[float, float]:
    """(gbar, gamma) as the rule defines them, from a pilot at eta_hn = 1e-4.

    gamma is read on round 2's step, the first that can move alpha: in round 1 every stored theta_j is still the
    initial model, so theta_bar does not depend on alpha, the alpha-gradient is the same for every j and P g = 0
    (a 0 / 0 ratio)."""
    fleet = make_fleet("pfedla", {"hn_lr": PILOT_HN_LR}, SPEC, CLIENTS, seed=seed)
    pairs = [(d.train_x, d.train_y) for d in data]
    norms, gains = [], []
    for round_number in range(settings.pilot_rounds):
        before = [deepcopy(n) for n in fleet.server.networks] if round_number == 1 else None
        run_round(fleet, round_number, pairs, settings.train, seed=seed)
        gradients = [fleet.server.last_gradients[i] for i in range(CLIENTS)]
        if round_number >= 1:  # rounds 2..pilot_rounds
            norms += [criterion.centred_norms(g) for g in gradients]
        if before is not None:
            gains += [step_gains(before[i], i, gradients[i]) for i in range(CLIENTS)]
    return float(np.median(norms)), float(np.median(gains))


def finite(value: Any) -> Any:
    """``value`` with every nan replaced by None (JSON has no nan)."""
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return None if isinstance(value, float) and value != value else value


def judge(trace: Trace, overlap: np.ndarray) -> None:
    """Fill in the evaluation point and the verdict of C1-C3 there."""
    mean_self = [criterion.mean_self_weight(a.mean(axis=1)) for a in trace.alpha[1:]]
    index, formed = criterion.evaluation_point(mean_self, CLIENTS)
    trace.evaluated_round, trace.formed = index + 1, formed
    trace.verdict = criterion.judge(trace.alpha[index + 1], overlap)


def summary_row(trace: Trace) -> list[str | int | float]:
    v = trace.verdict
    c1, c2, c3 = v["C1"], v["C2"], v["C3"]
    return [trace.label, trace.hn_lr, trace.guard or "off", trace.evaluated_round,
            "formed" if trace.formed else "not formed", c1["p"], c1["rows_self_max"], c1["rows_self_above_mean"],
            "PASS" if c1["passed"] else "FAIL", c2["rho"], c2["D"], c2["p"], "PASS" if c2["passed"] else "FAIL",
            c3["one_hot_layer_rows"], "PASS" if c3["passed"] else "FAIL", v["strict_rows"],
            "PASS" if v["passed"] else "FAIL", float(np.nanmean(trace.accuracy[trace.evaluated_round])),
            float(np.nanmean(trace.accuracy[-1]))]


SUMMARY_HEADER = ["run", "eta_hn", "guard", "eval round", "structure", "C1 p", "self max rows", "self > mean rows",
                  "C1", "C2 rho", "C2 D", "C2 p", "C2", "one-hot rows", "C3", "strict rows", "verdict",
                  "acc at eval", "acc final"]


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = base_parser("pfedla", __doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, help="override T, the number of rounds (the rule uses it too)")
    parser.add_argument("--hn-lr", type=float, help="skip the rule and use this eta_hn (a description, no verdict)")
    parser.add_argument("--epochs", type=int, help="override the local epochs")
    parser.add_argument("--train-cap", type=int, help="override the images per client (0: all)")
    parser.add_argument("--guard", action="store_true", help="also run with the |d alpha| <= 0.01 guard")
    parser.add_argument("--grid", action="store_true", help="also run at the eta_hn x 1/10, 1/3, 3, 10")
    args = parse_args(parser, argv)
    if (args.rounds is not None and args.rounds < 1) or (args.hn_lr is not None and args.hn_lr <= 0):
        parser.error("--rounds must be >= 1 and --hn-lr > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    setup_torch(args.threads)
    settings = QUICK if args.quick else Settings()
    overrides = {"rounds": args.rounds, "epochs": args.epochs}
    settings = replace(settings, **{k: v for k, v in overrides.items() if v is not None})
    if args.train_cap is not None:
        settings = replace(settings, train_cap=args.train_cap or None)
    watch = Stopwatch()
    shards = partition(load_dataset("fmnist-demo"), "classes", CLIENTS, seed=args.seed,
                       classes_per_client=settings.classes_per_client, classes_layout="chain")
    overlap = criterion.overlap_matrix([s.meta["classes"] for s in shards])
    data = [as_tensors(s, settings.train_cap, seed=args.seed) for s in shards]

    rule: dict[str, float] | None = None
    if args.hn_lr is None:
        gbar, gamma = pilot(data, settings, args.seed)
        hn_lr = criterion.eta_rule(gbar, gamma, settings.rounds)
        rule = {"hn_lr": PILOT_HN_LR, "rounds": settings.pilot_rounds, "gbar": gbar, "gamma": gamma,
                 "rule_hn_lr": hn_lr, "seconds": round(watch.seconds(), 1)}
        print(f"pilot at eta_hn {PILOT_HN_LR:g}: gbar {gbar:.6g}, gamma {gamma:.6g} -> eta_hn = 0.1 / (gamma T gbar) "
              f"= {hn_lr:.6g} for T = {settings.rounds}", flush=True)
    else:
        hn_lr = args.hn_lr
    main_label = "rule" if rule else "given"
    runs = [run(data, settings, settings.rounds, args.seed, hn_lr, 0.0, main_label)]
    if args.guard:
        runs.append(run(data, settings, settings.rounds, args.seed, hn_lr, GUARD, f"{main_label}, guard"))
    if args.grid:
        runs += [run(data, settings, settings.rounds, args.seed, hn_lr * f, 0.0, f"{main_label} x {f:.3g}")
                 for f in GRID]
    for trace in runs:
        judge(trace, overlap)
    seconds = watch.seconds()
    main_run = runs[0]
    verdict = main_run.verdict["passed"] if rule else None

    matrix = main_run.alpha[main_run.evaluated_round].mean(axis=1)
    alpha_header = ["client i \\ j", *[str(j) for j in range(CLIENTS)]]
    alpha_rows: list[list[str | int | float]] = [[i, *[float(x) for x in row]] for i, row in enumerate(matrix)]
    summary = [summary_row(trace) for trace in runs]
    print(f"alpha averaged over layers {main_run.layers} at round {main_run.evaluated_round} "
          f"({'formed' if main_run.formed else 'not formed'}; eta_hn {hn_lr:.6g}):")
    print("\n".join(text_table(alpha_header, alpha_rows)))
    print("\n".join(text_table(SUMMARY_HEADER, summary)))
    outcome = "PASS" if verdict else "FAIL" if verdict is not None else "no verdict (--hn-lr given)"
    print(f"VERDICT (seed {args.seed}, C1-C3 on the rule's run): {outcome}; {seconds:.1f} s")

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    title = (f"pFedLA, FMNIST-demo chain, MLP, η_hn {hn_lr:.3g}, round {main_run.evaluated_round} of "
             f"{settings.rounds} ({'formed' if main_run.formed else 'not formed'}), seed {args.seed}: {outcome}")
    plot(main_run, runs[1:], overlap, out / "pfedla.png", title)
    write_csv(out / "pfedla_alpha.csv", alpha_header, alpha_rows)
    write_csv(out / "pfedla_runs.csv", SUMMARY_HEADER, summary)
    round_header = ["run", "round", "mean self", "3 shared", "2 shared", "1 shared", "0 shared", "strict rows",
                    "median |Pg|", "min guard scale", "mean personal acc"]
    round_rows: list[list[str | int | float]] = []
    for trace in runs:
        for r in range(1, settings.rounds + 1):
            layer_mean = trace.alpha[r].mean(axis=1)
            three, two, one, none, own = criterion.relation_means(layer_mean, overlap)
            round_rows.append([trace.label, r, own, three, two, one, none, criterion.strict_rows(layer_mean),
                               float(np.median(trace.gradient_norms[r])), float(trace.step_scales[r].min()),
                               float(np.nanmean(trace.accuracy[r]))])
    write_csv(out / "pfedla_rounds.csv", round_header, round_rows)
    every = max(1, settings.rounds // 10)
    pilot_lines = ([f"Pilot ({settings.pilot_rounds} rounds at eta_hn = {PILOT_HN_LR:g}): gbar = {rule['gbar']:.6g}, "
                    f"gamma = {rule['gamma']:.6g}, so eta_hn = 0.1 / (gamma * {settings.rounds} * gbar) = "
                    f"{hn_lr:.6g}.", ""] if rule else
                   [f"eta_hn = {hn_lr:g} given with --hn-lr: a description, not the pre-registered run.", ""])
    report = [
        "# pFedLA aggregation weights on a chain of 8 clients", "",
        f"Command: `{command_line('repro_pfedla.py', args)}`; {seconds:.0f} s with {args.threads} torch thread(s).",
        "", f"Settings: {asdict(settings)}", "", *pilot_lines,
        f"alpha averaged over layers {main_run.layers} at the evaluation point, round {main_run.evaluated_round} "
        f"({'the mean self weight reached 1.5/8' if main_run.formed else 'not formed: the last round'}); row i: the "
        "weights client i's model is built from:", "",
        *markdown_table(alpha_header, alpha_rows), "",
        *markdown_table(SUMMARY_HEADER, summary), "",
        f"VERDICT (C1-C3 on the first run): {outcome}", "",
        "Trajectory of the first run (every few rounds):", "",
        *markdown_table(round_header, [row for row in round_rows[:settings.rounds] if int(row[1]) % every == 0]), "",
    ]
    (out / "pfedla.md").write_text("\n".join(report))
    write_json(out / "pfedla.json", finite({
        "settings": asdict(settings), "seed": args.seed, "seconds": round(seconds, 1), "quick": args.quick,
        "pilot": rule, "hn_lr": hn_lr, "layers": main_run.layers, "overlap": overlap.tolist(),
        "verdict": verdict, "alpha_mean_over_layers": matrix.tolist(),
        "alpha_per_layer": main_run.alpha[main_run.evaluated_round].tolist(),
        "runs": [{"label": t.label, "hn_lr": t.hn_lr, "guard": t.guard, "evaluated_round": t.evaluated_round,
                  "formed": t.formed, "criterion": t.verdict, "accuracy": t.accuracy[1:].tolist(),
                  "alpha_final_mean_over_layers": t.alpha[-1].mean(axis=1).tolist()} for t in runs],
    }))
    print(f"wrote {out / 'pfedla.png'}, {out / 'pfedla.md'} and the CSV/JSON tables")
    return 0


if __name__ == "__main__":
    sys.exit(main())
