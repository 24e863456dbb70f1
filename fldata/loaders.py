"""`load_dataset`: every dataset by name, including the bundled demo and a user's own shard directory.

Names: "fmnist" (the full Fashion-MNIST IDX files), "fmnist-demo" (the class-balanced subset shipped in
fldata/demo/), "cifar10" (the python batches), "svhn" (the .mat files), and "npz" (a directory of shard
files, see `fldata.shard`). The file formats live in `fldata.idx`, `fldata.cifar`, `fldata.svhn`; this
module only picks the reader. It must not know about partitioning or any other Fedge package.
"""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedge.fldata.cifar import load_cifar10
from fedge.fldata.dataset import DataError, Dataset, channel_stats
from fedge.fldata.idx import FMNIST_CLASSES, load_fmnist
from fedge.fldata.shard import ClientShard, read_shard
from fedge.fldata.svhn import load_svhn

DATASETS = ("fmnist", "fmnist-demo", "cifar10", "svhn")
USER_SHARDS = "npz"
DEMO_FILE = "fmnist-demo.npz"
DEMO_ARRAYS = ("train_x", "train_y", "test_x", "test_y", "train_source_index", "test_source_index")


def load_dataset(name: str, path: str | None = None) -> Dataset:
    """The dataset called name (one of DATASETS, or "npz" with path a directory of shard files)."""
    loaders: dict[str, Callable[[str | None], Dataset]] = {
        "fmnist": load_fmnist,
        "fmnist-demo": load_demo,
        "cifar10": load_cifar10,
        "svhn": load_svhn,
        USER_SHARDS: load_shard_dir,
    }
    if name not in loaders:
        raise DataError(f"unknown dataset {name!r}; choose one of {', '.join((*DATASETS, USER_SHARDS))}")
    return loaders[name](path)


DEMO_PATH = Path(__file__).resolve().parent / "demo" / DEMO_FILE


def load_demo(path: str | None = None) -> Dataset:
    """The bundled fmnist-demo set (12,000 train / 2,000 test, 10 balanced classes).

    path, if given, is another copy of the demo file (or a directory holding fmnist-demo.npz).
    """
    source = Path(path) if path else DEMO_PATH
    if source.is_dir():
        source = source / DEMO_FILE
    try:
        with source.open("rb") as f, np.load(f, allow_pickle=False) as npz:
            if sorted(npz.files) != sorted(DEMO_ARRAYS):
                raise DataError(f"{source}: demo arrays must be {', '.join(DEMO_ARRAYS)}, found {npz.files}")
            arrays = {name: npz[name] for name in DEMO_ARRAYS}
    except DataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise DataError(f"{source}: cannot read the demo data set: {exc}") from None
    for part in ("train_y", "test_y"):
        if arrays[part].dtype != np.uint8:
            raise DataError(f"{source}: {part} must be uint8, found {arrays[part].dtype}")
    mean, std = channel_stats(arrays["train_x"])
    return Dataset(
        name="fmnist-demo",
        train_x=arrays["train_x"],
        train_y=arrays["train_y"].astype(np.int64),
        test_x=arrays["test_x"],
        test_y=arrays["test_y"].astype(np.int64),
        num_classes=FMNIST_CLASSES,
        mean=mean,
        std=std,
    )


def load_shard_dir(path: str | None) -> Dataset:
    """A user's data set: the shard files (*.npz, in name order) in directory path, joined together.

    Train is every shard's train part, test every shard's test part. The shards must agree on the number of
    classes and the image shape; their mean and std are kept when all agree, else recomputed from train.
    """
    if not path:
        raise DataError("the npz dataset needs a directory of shard files (--data-dir)")
    source = Path(path)
    if source.is_file():
        files = [source]
    elif source.is_dir():
        files = sorted(source.glob("*.npz"))
        if not files:
            raise DataError(f"{source}: no shard files (*.npz) in this directory")
    else:
        raise DataError(f"{source}: no such shard file or directory")
    shards = [read_shard(f) for f in files]
    first = shards[0]
    for f, s in zip(files, shards, strict=True):
        if s.num_classes != first.num_classes or s.train_x.shape[1:] != first.train_x.shape[1:]:
            raise DataError(
                f"{f}: {s.num_classes} classes of {s.train_x.shape[1:]} images, but {files[0]} has "
                f"{first.num_classes} classes of {first.train_x.shape[1:]} images"
            )
    train_x = np.concatenate([s.train_x for s in shards])
    if all(s.mean == first.mean and s.std == first.std for s in shards):
        mean, std = first.mean, first.std
    else:
        mean, std = channel_stats(train_x)
    return Dataset(
        name=USER_SHARDS,
        train_x=train_x,
        train_y=np.concatenate([s.train_y for s in shards]),
        test_x=_join(shards, "test_x"),
        test_y=_join(shards, "test_y"),
        num_classes=first.num_classes,
        mean=mean,
        std=std,
    )


def _join(shards: list[ClientShard], part: str) -> np.ndarray:
    return np.concatenate([getattr(s, part) for s in shards])
