"""The `partition` command: show how a dataset splits among clients, and optionally write the shards.

    coordinator partition --dataset fmnist-demo --partition dirichlet --clients 10 --alpha 0.3 --seed 0
    python -m fedge.fldata partition --dataset fmnist-demo --partition classes --clients 10 --json
    python -m fedge.fldata partition --dataset fmnist --partition iid --clients 10 --out shards/

The coordinator mounts `add_partition_arguments` and `run_partition` under its own CLI. Errors print one
line to stderr and return 2. This module must not know about the coordinator or any other Fedge package.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedge.fldata.dataset import DataError
from fedge.fldata.loaders import DATASETS, USER_SHARDS, load_dataset
from fedge.fldata.partition import PARTITIONERS, partition
from fedge.fldata.schemes import LAYOUTS
from fedge.fldata.shard import ClientShard, summary, write_shard


def add_partition_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the partition command's options to parser."""
    parser.add_argument("--dataset", required=True, choices=(*DATASETS, USER_SHARDS), help="dataset name")
    parser.add_argument("--partition", required=True, choices=PARTITIONERS, help="partition scheme")
    parser.add_argument("--clients", required=True, type=int, help="number of clients")
    parser.add_argument("--alpha", type=float, default=0.3, help="Dirichlet concentration (default 0.3)")
    parser.add_argument("--seed", type=int, default=0, help="seed for every random choice (default 0)")
    parser.add_argument("--classes-per-client", type=int, default=4, help="classes partition: k (default 4)")
    parser.add_argument("--classes-layout", choices=LAYOUTS, default="random",
                        help="classes partition: random sets, or the chain i..i+k-1 (default random)")
    parser.add_argument("--dominant-classes", type=int, default=2,
                        help="dominant partition: dominant classes per client (default 2)")
    parser.add_argument("--min-size", type=int, default=10, help="fewest training samples per client (default 10)")
    parser.add_argument("--data-dir", default=None, help="directory holding the dataset files")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    parser.add_argument("--out", type=Path, default=None,
                        help="write one shard per client here: client-000.npz, client-001.npz, ...")


def run_partition(args: argparse.Namespace) -> int:
    """Partition as args say, print the table (or JSON), write shards with --out; 0 on success, 2 on error."""
    try:
        dataset = load_dataset(args.dataset, args.data_dir)
        shards = partition(
            dataset, args.partition, args.clients, seed=args.seed, alpha=args.alpha,
            classes_per_client=args.classes_per_client, dominant_classes=args.dominant_classes,
            classes_layout=args.classes_layout, min_size=args.min_size,
        )
        written = write_all(args.out, shards) if args.out is not None else []
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    info = summary(dataset.name, args.partition, args.seed, shards)
    if args.json:
        print(json.dumps(info))
    else:
        print(table(info, args))
    if written:
        where = f"wrote {len(written)} shards to {args.out} ({written[0].name} .. {written[-1].name})"
        print(where, file=sys.stderr if args.json else sys.stdout)
    return 0


def write_all(out: Path, shards: Sequence[ClientShard]) -> list[Path]:
    """Write shards to out/client-NNN.npz, creating out; the paths written."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"{out}: cannot create the output directory: {exc}") from None
    paths = []
    for shard in shards:
        path = out / f"client-{shard.index:03d}.npz"
        write_shard(path, shard)
        paths.append(path)
    return paths


def table(info: dict[str, Any], args: argparse.Namespace) -> str:
    """The summary as a fixed-width table: one row per client, one column per class."""
    clients = info["clients"]
    num_classes = len(clients[0]["label_counts"]) if clients else 0
    width = max(5, *(len(str(n)) for c in clients for n in c["label_counts"])) if clients else 5
    detail = {"dirichlet": f", alpha {args.alpha}", "classes": f", {args.classes_per_client} classes per client "
              f"({args.classes_layout})", "dominant": f", {args.dominant_classes} dominant classes"}
    lines = [
        f"{info['dataset']}: {info['partition']} partition{detail.get(args.partition, '')}, seed {info['seed']}, "
        f"{len(clients)} clients",
        "",
        f"{'client':>6} {'train':>7} {'test':>6}   training samples per class",
        f"{'':>6} {'':>7} {'':>6}   " + " ".join(f"{c:>{width}}" for c in range(num_classes)),
    ]
    for c in clients:
        counts = " ".join(f"{n:>{width}}" for n in c["label_counts"])
        lines.append(f"{c['id']:>6} {c['train_size']:>7} {c['test_size']:>6}   {counts}")
    totals = [sum(c["label_counts"][k] for c in clients) for k in range(num_classes)]
    lines.append(f"{'total':>6} {sum(c['train_size'] for c in clients):>7} "
                 f"{sum(c['test_size'] for c in clients):>6}   " + " ".join(f"{n:>{width}}" for n in totals))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m fedge.fldata partition ...`."""
    parser = argparse.ArgumentParser(prog="python -m fedge.fldata", description="Fedge data tools")
    commands = parser.add_subparsers(dest="command", required=True)
    add_partition_arguments(commands.add_parser("partition", help="split a dataset among clients"))
    args = parser.parse_args(argv)
    return run_partition(args)
