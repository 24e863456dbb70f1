"""The PAN shuffle test (docs/algorithms.md 5.3-5.4): shuffle error against the amplitude A for PAN+ and PAN∘.

    python benchmarks/pan_shuffle.py [--out DIR] [--seeds 3] [--amplitudes 0,0.01,0.05,0.1,0.25,0.5,0.75]

The network is the 5.4 dry run's: an MLP with four hidden layers of width 64, He-normal weights, zero biases, T = 1,
inputs x ~ N(0, 1) (a batch of 512), every hidden layer shuffled by a full random permutation (the official
generator with r = 1, P_sf = 1). For each seed, one network and one set of permutations serve every A and both modes,
so the curves differ only by the encoding. Prints a table (mean and spread over seeds, and the ratio PAN∘ / PAN+) and
writes ``pan_shuffle.png`` and ``pan_shuffle.json`` into DIR (default ``runs/pan-shuffle``). Runs in seconds on a CPU.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedge.models.shuffle import PAN_MODES as MODES
from fedge.models.shuffle import shuffle_errors as measure

DEFAULT_AMPLITUDES = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75)


def report(amplitudes: Sequence[float], errors: dict[str, np.ndarray]) -> list[str]:
    lines = [f"{'A':>6}  {'PAN+ Err':>18}  {'PAN∘ Err':>18}  {'∘/+':>6}"]
    for column, amplitude in enumerate(amplitudes):
        cells = []
        for mode in MODES:
            values = errors[mode][:, column]
            cells.append(f"{values.mean():.3g} ± {values.std():.2g}".rjust(18))
        plus, mul = errors["add"][:, column].mean(), errors["mul"][:, column].mean()
        ratio = f"{mul / plus:6.2f}" if amplitude > 0 else "     -"
        lines.append(f"{amplitude:6.2f}  {cells[0]}  {cells[1]}  {ratio}")
    return lines


def plot(amplitudes: Sequence[float], errors: dict[str, np.ndarray], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(5.5, 3.8))
    for mode, label in MODES.items():
        values = errors[mode]
        axes.errorbar(amplitudes, values.mean(0), yerr=values.std(0), marker="o", capsize=3, label=label)
    axes.set_xlabel("amplitude A")
    axes.set_ylabel("shuffle error ||h_sf - h|| / J_L")
    axes.set_title(f"PAN shuffle test: MLP 4x64, T = 1, {errors['add'].shape[0]} seeds")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pan-shuffle", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/pan-shuffle"), help="folder for the PNG and JSON")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--amplitudes", default=",".join(str(a) for a in DEFAULT_AMPLITUDES),
                        help="comma-separated amplitudes A")
    args = parser.parse_args(argv)
    amplitudes = [float(a) for a in args.amplitudes.split(",") if a.strip()]
    if args.seeds < 1 or not amplitudes or min(amplitudes) < 0:
        parser.error("need --seeds >= 1 and non-negative amplitudes")
    errors = measure(amplitudes, args.seeds)
    for line in report(amplitudes, errors):
        print(line)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(amplitudes, errors, args.out / "pan_shuffle.png")
    summary = {"amplitudes": amplitudes, "seeds": args.seeds,
               "errors": {MODES[mode]: values.tolist() for mode, values in errors.items()}}
    (args.out / "pan_shuffle.json").write_text(json.dumps(summary, indent=2))
    print(f"wrote {args.out / 'pan_shuffle.png'} and {args.out / 'pan_shuffle.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
