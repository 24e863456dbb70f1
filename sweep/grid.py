"""``coordinator sweep --grid FILE``: the reproduction harness. Runs a grid of sessions, resumably, and tabulates them.

A grid file is TOML::

    [sweep]
    seeds = [0, 1]
    baseline = "fedavg"                 # the label reductions are measured against
    [base]                              # config keys applied to every run (same sections as a session config)
    data = { dataset = "fmnist-demo", alpha = 0.3 }
    run = { rounds = 25 }
    [axes]                              # optional: the cartesian product of these dotted keys
    "data.alpha" = [0.1, 0.3, 1.0, 3.0]
    [[method]]
    label = "fedavg"
    algorithm = { name = "fedavg" }
    [[method]]
    label = "dssa-fedprox"
    algorithm = { name = "dssa-fedprox", sparsity = 0.5, scale = 1.5, mu = 0.01 }

Every (method, axes point, seed) is one ordinary ``coordinator start`` with its own local fleet and run directory
under ``OUT/runs/``; a run whose ``report.json`` says done is skipped, a run with a checkpoint is resumed, so a killed
sweep continues where it stopped. ``sweep.runner`` runs the cells (one at a time, ``--jobs N`` at a
time, or as Ray tasks; ``--shard I/N`` takes every N-th cell for a batch scheduler), claims each one, and retries a
failed one before recording it. The summary (``summary.md``, ``summary.csv``, ``accuracy_vs_bytes.png``) is written
from the run directories alone. Knows no algorithm by name.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedge.coordinator.config import ConfigError, from_dict, tomllib

LAST_ROUNDS = 5


@dataclass(frozen=True)
class Cell:
    """One run of the grid."""

    key: str
    label: str
    point: tuple[tuple[str, Any], ...]
    seed: int
    raw: dict[str, Any]


def _set(raw: dict[str, Any], dotted: str, value: Any) -> None:
    section, key = dotted.split(".", 1)
    raw.setdefault(section, {})[key] = value


def expand(grid: dict[str, Any]) -> tuple[list[Cell], str]:
    """All cells of the grid, each with a validated config; and the baseline label."""
    sweep = grid.get("sweep", {})
    seeds = [int(s) for s in sweep.get("seeds", [0])]
    methods = grid.get("method", [])
    if not methods:
        raise ConfigError("the grid has no [[method]]")
    axes = grid.get("axes", {})
    names = sorted(axes)
    cells = []
    for seed in seeds:  # seed-major: a first pass over every method finishes early
        for method, values in itertools.product(methods, itertools.product(*(axes[n] for n in names))):
            label = str(method["label"])
            point = tuple(zip(names, values, strict=True))
            raw = json.loads(json.dumps(grid.get("base", {})))
            raw["algorithm"] = dict(method["algorithm"])
            for dotted, value in point:
                _set(raw, dotted, value)
            for dotted, value in method.get("set", {}).items():
                _set(raw, dotted, value)
            raw.setdefault("run", {})["seed"] = seed
            from_dict(raw)
            tag = "-".join(f"{n.split('.')[-1]}{v}" for n, v in point)
            key = "_".join(x for x in (label, tag, f"seed{seed}") if x)
            cells.append(Cell(key=key, label=label, point=point, seed=seed, raw=raw))
    baseline = str(sweep.get("baseline", methods[0]["label"]))
    return cells, baseline


def load_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def last_rounds_mean(rows: list[dict[str, Any]]) -> float:
    return float(np.mean([x["test_accuracy"] for x in rows[-LAST_ROUNDS:] if x.get("test_accuracy") is not None]))


def summarise(cells: list[Cell], baseline: str, out: Path) -> list[dict[str, Any]]:
    """One row per (method, axes point): accuracy mean +- std over seeds, bytes, reduction against the baseline, the
    accuracy gap (the mean over seeds of the baseline's last-5 mean minus the method's, paired by seed, with its
    range), and whether every round accepted the same clients as the baseline's run of that seed."""
    groups: dict[tuple[str, tuple[tuple[str, Any], ...]], dict[int, list[dict[str, Any]]]] = {}
    for cell in cells:
        rows = load_rows(out / "runs" / cell.key)
        if rows:
            groups.setdefault((cell.label, cell.point), {})[cell.seed] = rows
    table = []
    for (label, point), by_seed in groups.items():
        runs = list(by_seed.values())
        finals = [r[-1]["test_accuracy"] for r in runs if r[-1].get("test_accuracy") is not None]
        down = float(np.mean([sum(x["bytes_down"] for x in r) for r in runs]))
        up = float(np.mean([sum(x["bytes_up"] for x in r) for r in runs]))
        table.append({
            "method": label, **{k: v for k, v in point}, "seeds": len(runs), "rounds": min(len(r) for r in runs),
            "final_accuracy_mean": float(np.mean(finals)) if finals else None,
            "final_accuracy_std": float(np.std(finals)) if finals else None,
            "last5_accuracy_mean": float(np.mean([last_rounds_mean(r) for r in runs])), "bytes_down": down,
            "bytes_up": up, "bytes_total": down + up,
        })
    for row in table:
        base = next((b for b in table if b["method"] == baseline and
                     all(b.get(k) == row.get(k) for k in row if k.startswith(("data.", "round.", "train.")))), None)
        row["byte_reduction"] = 1 - row["bytes_total"] / base["bytes_total"] if base else None
        pairs = []
        if base is not None:
            point = tuple((k, row[k]) for k in row if "." in k)
            mine, theirs = groups[(row["method"], point)], groups[(baseline, point)]
            pairs = [(theirs[seed], mine[seed]) for seed in sorted(mine) if seed in theirs]
        gaps = [100 * (last_rounds_mean(b) - last_rounds_mean(m)) for b, m in pairs]
        row["accuracy_gap_points"] = float(np.mean(gaps)) if gaps else None
        row["gap_min_points"] = min(gaps) if gaps else None
        row["gap_max_points"] = max(gaps) if gaps else None
        row["same_clients_as_baseline"] = (all([x.get("accepted") for x in b] == [x.get("accepted") for x in m]
                                               for b, m in pairs) if pairs else None)
    write_tables(table, out)
    plot(cells, out)
    return table


def write_tables(table: list[dict[str, Any]], out: Path) -> None:
    if not table:
        return
    columns = list(dict.fromkeys(k for row in table for k in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(table)
    (out / "summary.csv").write_text(buffer.getvalue())
    lines = ["| method | seeds | rounds | final accuracy (mean ± std) | last-5 mean | bytes down | bytes up | "
             "reduction vs baseline | gap (points), range over seeds | same clients as baseline |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in table:
        extra = " ".join(f"{k}={row[k]}" for k in row if "." in k)
        acc = (f"{100 * row['final_accuracy_mean']:.2f} ± {100 * row['final_accuracy_std']:.2f}"
               if row["final_accuracy_mean"] is not None else "n/a")
        red = f"{100 * row['byte_reduction']:.1f} %" if row["byte_reduction"] is not None else "n/a"
        gap = (f"{row['accuracy_gap_points']:+.2f} ({row['gap_min_points']:+.2f} .. {row['gap_max_points']:+.2f})"
               if row["accuracy_gap_points"] is not None else "n/a")
        same = {True: "yes", False: "no", None: "n/a"}[row["same_clients_as_baseline"]]
        lines.append(f"| {row['method']} {extra} | {row['seeds']} | {row['rounds']} | {acc} | "
                     f"{100 * row['last5_accuracy_mean']:.2f} | {row['bytes_down'] / 1e6:.1f} MB | "
                     f"{row['bytes_up'] / 1e6:.1f} MB | {red} | {gap} | {same} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def machine() -> str:
    """This machine in a few words, as a result's provenance states it."""
    import platform

    import psutil

    try:
        from importlib.metadata import version

        torch = f", torch {version('torch')}"
    except ImportError:  # no importlib.metadata entry for torch: say nothing of it
        torch = ""
    return (f"{platform.machine()}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
            f"Python {platform.python_version()}{torch}")


def write_provenance(out: Path, command: str, baseline: str) -> None:
    """``summary.json`` beside ``summary.csv``: the command, the date and the machine (docs/results/ keeps it as
    ``NAME.json``, and ``fedge.sweep.results`` renders it into the README)."""
    import datetime

    (out / "summary.json").write_text(json.dumps({
        "command": command, "date": datetime.date.today().isoformat(), "machine": machine(),
        "baseline": baseline}, indent=1) + "\n")


def plot(cells: list[Cell], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for label in dict.fromkeys(c.label for c in cells):
        for cell in [c for c in cells if c.label == label][:1]:
            rows = load_rows(out / "runs" / cell.key)
            if not rows:
                continue
            cumulative = np.cumsum([r["bytes_down"] + r["bytes_up"] for r in rows]) / 1e6
            axis.plot(cumulative, [r["test_accuracy"] for r in rows], label=label, marker=".")
    axis.set_xscale("log")
    axis.set_xlabel("cumulative bytes, both directions (MB, log)")
    axis.set_ylabel("test accuracy")
    axis.grid(alpha=0.3)
    if axis.lines:  # no finished cell: an empty plot, and no legend (matplotlib would warn that it has no labels)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / "accuracy_vs_bytes.png", dpi=120)
    plt.close(figure)


def command_sweep(grid_file: str, out_dir: str | None, dry_run: bool, quiet: bool, jobs: int = 1,
                  backend: str = "local", shard: str | None = None, cell_mode: str = "process",
                  ray_address: str = "") -> int:
    """Run the grid (or its shard ``I/N``) and tabulate it; 1 when a cell failed (after its retry), else 0."""
    from fedge.sweep.runner import Plan, parse_shard, run_cells

    try:
        grid = tomllib.loads(Path(grid_file).read_text())
    except FileNotFoundError:
        raise ConfigError(f"grid file not found: {grid_file} (grids live in benchmarks/grids/)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{grid_file} is not valid TOML: {exc}") from None
    cells, baseline = expand(grid)
    part = parse_shard(shard)
    if jobs < 1:
        raise ConfigError("--jobs must be >= 1")
    mine = cells if part is None else cells[part[0] - 1::part[1]]
    out = Path(out_dir or f"runs/sweep-{Path(grid_file).stem}").resolve()  # absolute: Ray nodes share it
    out.mkdir(parents=True, exist_ok=True)
    which = f" (shard {part[0]}/{part[1]}: {len(mine)} of {len(cells)})" if part else ""
    print(f"sweep {grid_file}: {len(mine)} runs into {out}/{which}", flush=True)
    if dry_run:
        for cell in mine:
            print(f"  {cell.key}")
        return 0
    plan = Plan(jobs=jobs, backend=backend, cell_mode=cell_mode, ray_address=ray_address, quiet=quiet)
    outcomes = run_cells(mine, out, plan, lambda n, key, outcome: print(f"[{n}/{len(mine)}] {key}: {outcome}",
                                                                        flush=True))
    summarise(cells, baseline, out)  # every finished cell of the grid, whichever shard ran it
    write_provenance(out, f"coordinator sweep --grid {grid_file}", baseline)
    print((out / "summary.md").read_text() if (out / "summary.md").exists() else "no runs", flush=True)
    failed = [cell.key for cell, outcome in zip(mine, outcomes, strict=True) if outcome.startswith("failed")]
    if failed:
        print(f"{len(failed)} run(s) failed: {', '.join(failed)} (listed in {out / 'failed.jsonl'}); run the "
              "sweep again to retry them", flush=True)
        return 1
    return 0
