"""ef in the cross-device regime, against a criterion fixed before any fix was measured (issue 36).

    python benchmarks/ef_cross_device.py [--out runs/cross-device] [--grid benchmarks/grids/cross-device.toml]
                                         [--write-docs]

Runs the grid with ``coordinator sweep`` (resumably: a finished run is not run again) and judges every method of it
against the grid's baseline (FedAvg), seed by seed on the same selected clients:

- the metric: a run's mean test accuracy over rounds 16-25 (``WINDOW``), the gap being FedAvg's minus the method's,
  in points, paired by seed (the runtime's seeded selection picks the same clients for both; checked round by
  round, and a pair that differs fails the criterion);
- the targets: a mean gap over the seeds of at most 0.5 point, at most 2 points on every seed, and at most 0.05
  times FedAvg's bytes (the encoded packets of both directions, summed over the run and averaged over the seeds).

The grid (benchmarks/grids/cross-device.toml) fixes the rest: 100 simulated clients, 10 a round, fmnist-demo
Dirichlet 0.3, the paper CNN, 25 rounds, seeds 0-4. ``--write-docs`` replaces the criterion's block of
docs/results/partial-participation.md with the table printed. Figures and a verdict; no assertion.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WINDOW = (16, 25)        # rounds whose mean test accuracy is the metric (inclusive)
MEAN_GAP_LIMIT = 0.5     # points, mean over seeds
SEED_GAP_LIMIT = 2.0     # points, every seed
BYTES_LIMIT = 0.05       # the method's bytes / the baseline's
BEGIN, END = "<!-- cross-device criterion: begin -->", "<!-- cross-device criterion: end -->"


@dataclass(frozen=True)
class Verdict:
    method: str
    gaps: dict[int, float]   # seed -> points (baseline minus method)
    window_means: dict[int, tuple[float, float]]  # seed -> (baseline, method) accuracy
    byte_ratio: float
    same_clients: bool

    @property
    def mean_gap(self) -> float:
        return float(np.mean(list(self.gaps.values())))

    @property
    def passed(self) -> bool:
        return (self.same_clients and self.mean_gap <= MEAN_GAP_LIMIT and
                max(self.gaps.values()) <= SEED_GAP_LIMIT and self.byte_ratio <= BYTES_LIMIT)


def window_mean(rows: list[dict[str, Any]]) -> float:
    first, last = WINDOW
    values = [r["test_accuracy"] for r in rows if first <= r["round"] <= last and r.get("test_accuracy") is not None]
    if len(values) != last - first + 1:
        raise ValueError(f"a run has {len(values)} evaluated rounds in {first}..{last}, not {last - first + 1}")
    return float(np.mean(values))


def judge(method: str, baseline: dict[int, list[dict[str, Any]]], runs: dict[int, list[dict[str, Any]]]) -> Verdict:
    """The criterion on the seeds both have (rows: a run's metrics.jsonl)."""
    seeds = sorted(set(baseline) & set(runs))
    if not seeds:
        raise ValueError(f"{method}: no seed finished for both it and the baseline")
    means = {s: (window_mean(baseline[s]), window_mean(runs[s])) for s in seeds}
    gaps = {s: 100 * (b - m) for s, (b, m) in means.items()}
    total = lambda rows: sum(r["bytes_down"] + r["bytes_up"] for r in rows)  # noqa: E731
    ratio = float(np.mean([total(runs[s]) for s in seeds]) / np.mean([total(baseline[s]) for s in seeds]))
    same = all([r.get("accepted") for r in baseline[s]] == [r.get("accepted") for r in runs[s]] for s in seeds)
    return Verdict(method, gaps, means, ratio, same)


def table(verdicts: list[Verdict], baseline: str) -> list[str]:
    first, last = WINDOW
    lines = [f"| method | seeds | {baseline}, rounds {first}-{last} | method, rounds {first}-{last} | gap per seed "
             "(points) | mean gap | bytes vs baseline | same clients | criterion |", "|---|---|---|---|---|---|---|---|---|"]
    for v in verdicts:
        per_seed = ", ".join(f"{s}: {g:+.2f}" for s, g in sorted(v.gaps.items()))
        base = np.mean([b for b, _ in v.window_means.values()])
        mine = np.mean([m for _, m in v.window_means.values()])
        lines.append(f"| {v.method} | {len(v.gaps)} | {100 * base:.2f} % | {100 * mine:.2f} % | {per_seed} | "
                     f"{v.mean_gap:+.2f} | {v.byte_ratio:.3f}x | {'yes' if v.same_clients else 'no'} | "
                     f"{'met' if v.passed else 'missed'} |")
    return lines


def write_docs(lines: list[str], command: str) -> None:
    page = ROOT / "docs" / "results" / "partial-participation.md"
    text = page.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{page} has no {BEGIN} ... {END} block")
    block = "\n".join([BEGIN, "", f"`{command}`", "", *lines, "", END])
    page.write_text(text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", default=str(ROOT / "benchmarks" / "grids" / "cross-device.toml"))
    parser.add_argument("--out", default="runs/cross-device")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()

    from fedge.coordinator.config import ConfigError, tomllib
    from fedge.sweep.grid import command_sweep, expand, load_rows

    try:
        command_sweep(args.grid, args.out, dry_run=False, quiet=True)
    except ConfigError as exc:
        parser.error(str(exc))
    cells, baseline = expand(tomllib.loads(Path(args.grid).read_text()))
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for cell in cells:
        rows = load_rows(Path(args.out) / "runs" / cell.key)
        if len(rows) >= WINDOW[1]:
            runs.setdefault(cell.label, {})[cell.seed] = rows
    verdicts = [judge(label, runs.get(baseline, {}), by_seed) for label, by_seed in runs.items() if label != baseline]
    lines = table(verdicts, baseline)
    print("\n".join(lines))
    print(json.dumps({v.method: {"mean_gap": v.mean_gap, "gaps": v.gaps, "byte_ratio": v.byte_ratio,
                                 "passed": v.passed} for v in verdicts}))
    if args.write_docs:
        grid = Path(args.grid).resolve().relative_to(ROOT)
        write_docs(lines, f"python benchmarks/ef_cross_device.py --grid {grid} --write-docs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
