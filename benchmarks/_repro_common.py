"""Shared pieces of the reproduction commands (``benchmarks/repro_*.py``); not a command itself.

Holds the common command line (``--out``, ``--quick``, ``--seed``, ``--threads``), the data as torch tensors (a
client shard normalised and optionally capped), evaluation of a client's model as it would stand at the start of the
next round, and writers for the outputs every command leaves in its folder: a markdown report, CSV tables, a JSON
summary and a PNG figure. Must not know any one algorithm or reproduction; the commands import it as a sibling
module (``python benchmarks/repro_X.py`` puts ``benchmarks/`` on ``sys.path``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedge.algorithms.base import load_into
from fedge.algorithms.loop import evaluate
from fedge.fldata import ClientShard, normalize
from fedge.simulation.inprocess import Fleet

Cell = str | int | float


@dataclass(frozen=True)
class ClientData:
    """One client's normalised training and personal test tensors."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def base_parser(name: str, description: str) -> argparse.ArgumentParser:
    """The flags every reproduction takes; ``--out`` defaults to ``runs/repro-NAME``. A command adds its own."""
    parser = argparse.ArgumentParser(prog=f"repro_{name}", description=description)
    parser.add_argument("--out", type=Path, default=Path(f"runs/repro-{name}"),
                        help="folder for the figure and the tables")
    parser.add_argument("--quick", action="store_true", help="a tiny run (seconds) for the smoke test")
    parser.add_argument("--seed", type=int, default=0, help="seed of the partition, the models and the batches")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for these models)")
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.seed < 0 or args.threads < 1:
        parser.error("--seed must be >= 0 and --threads >= 1")
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    return args


def command_line(script: str, args: argparse.Namespace) -> str:
    """The command as it was given (every flag), for the report, e.g. ``python benchmarks/repro_x.py --seed 1``."""
    return shlex.join(["python", f"benchmarks/{script}", *args.argv])


def setup_torch(threads: int) -> None:
    torch.set_num_threads(threads)


def as_tensors(shard: ClientShard, train_cap: int | None = None, test_cap: int | None = None,
               seed: int = 0) -> ClientData:
    """The shard normalised with its own mean/std; caps keep a seeded random subset (sorted, so order is kept)."""

    def pick(count: int, cap: int | None, stream: int) -> np.ndarray:
        if cap is None or count <= cap:
            return np.arange(count)
        return np.sort(np.random.default_rng([seed, shard.index, stream]).choice(count, cap, replace=False))

    train = pick(len(shard.train_y), train_cap, 0)
    test = pick(len(shard.test_y), test_cap, 1)
    return ClientData(
        train_x=torch.from_numpy(normalize(shard.train_x[train], shard.mean, shard.std)),
        train_y=torch.from_numpy(shard.train_y[train].astype(np.int64)),
        test_x=torch.from_numpy(normalize(shard.test_x[test], shard.mean, shard.std)),
        test_y=torch.from_numpy(shard.test_y[test].astype(np.int64)),
    )


def next_round_accuracy(fleet: Fleet, index: int, round_number: int, scratch: nn.Module,
                        data: ClientData) -> float:
    """Accuracy on the client's own test split of the model it would hold at the start of the next round: its
    current model (own BN, own retained layers) with the server's next downlink loaded over it. The server half
    and the client half are left untouched."""
    scratch.load_state_dict(fleet.models[index].state_dict())
    payload = fleet.server.downlink(round_number + 1, index)
    load_into(scratch, payload.groups["model"].dense)
    accuracy, _ = evaluate(scratch, data.test_x, data.test_y)
    return accuracy


def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[Cell]]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows([[cell_text(c) for c in row] for row in rows])


def cell_text(value: Cell) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Cell]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell_text(c) for c in row) + " |" for row in rows]
    return lines


def text_table(header: Sequence[str], rows: Sequence[Sequence[Cell]]) -> list[str]:
    """A fixed-width table for the terminal."""
    cells = [list(header)] + [[cell_text(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in cells]


def write_json(path: Path, summary: dict[str, Any]) -> None:
    path.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class Stopwatch:
    """Seconds since construction."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def seconds(self) -> float:
        return time.perf_counter() - self.start
