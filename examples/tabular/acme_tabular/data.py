"""The team's data: scikit-learn's bundled Wisconsin breast-cancer set (569 rows, 30 float features, 2 classes).

The data ships inside scikit-learn's wheel (``sklearn/datasets/data/breast_cancer.csv``): nothing is downloaded.
Source: W. N. Street, W. H. Wolberg and O. L. Mangasarian, "Nuclear feature extraction for breast tumor
diagnosis", 1993 (UCI Machine Learning Repository, CC BY 4.0); cite it when you publish results on it.

``breast_cancer()`` is a Fedge data callable (arrays in memory, a fixed 80/20 split); ``python -m
acme_tabular.data --out shards/ --clients 3`` converts it into Fedge shard files for devices.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np


def breast_cancer() -> dict[str, Any]:
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    x = np.asarray(bunch.data, dtype=np.float32)
    y = np.asarray(bunch.target, dtype=np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    cut = int(0.8 * len(y))
    train, test = order[:cut], order[cut:]
    return {"train_x": x[train], "train_y": y[train], "test_x": x[test], "test_y": y[test], "num_classes": 2}


def main() -> None:
    from fedge.fldata import dataset_from_arrays, partition, write_shard

    parser = argparse.ArgumentParser(description="write Fedge shards of the breast-cancer set")
    parser.add_argument("--out", required=True)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from pathlib import Path

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dataset = dataset_from_arrays("breast-cancer", breast_cancer())
    for shard in partition(dataset, "iid", args.clients, seed=args.seed):
        write_shard(out / f"client-{shard.index:03d}.npz", shard)
    print(f"wrote {args.clients} shards to {out}/ (mean/std of the 30 features in each shard's meta)")


if __name__ == "__main__":
    main()
