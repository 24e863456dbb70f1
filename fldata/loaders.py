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
        if s.num_classes != first.num_classes or s.train_x.shape[1:] != first.train_x.shape[1:] or \
                s.train_x.dtype != first.train_x.dtype or s.train_y.dtype != first.train_y.dtype:
            raise DataError(
                f"{f}: {_kind(s)}, but {files[0]} has {_kind(first)}: the shards of one data set must agree"
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


def _kind(shard: ClientShard) -> str:
    labels = f"{shard.num_classes} float32 targets" if shard.has_targets else f"{shard.num_classes} classes"
    return f"{labels} of {shard.train_x.dtype} samples shaped {shard.train_x.shape[1:]}"


def _join(shards: list[ClientShard], part: str) -> np.ndarray:
    return np.concatenate([getattr(s, part) for s in shards])


ARRAY_KEYS = ("train_x", "train_y", "test_x", "test_y")


def dataset_from_arrays(name: str, arrays: object, num_classes: int = 0) -> Dataset:
    """A Dataset from what a data callable returned: a mapping with ``train_x``, ``train_y`` and optionally
    ``test_x``, ``test_y`` and ``num_classes``, or a tuple (train_x, train_y[, test_x, test_y]). Statistics are
    computed from the training part; labels are int64 classes or float32 targets N x K (a float vector N becomes
    N x 1). DataError naming the problem otherwise."""
    if isinstance(arrays, tuple) and len(arrays) in (2, 4):
        arrays = dict(zip(ARRAY_KEYS, arrays, strict=False))
    if not isinstance(arrays, dict):
        raise DataError(f"{name}: a data callable must return a dict with train_x and train_y (and optionally "
                        f"test_x, test_y, num_classes) or a tuple of 2 or 4 arrays, got {type(arrays).__name__}")
    unknown = set(arrays) - {*ARRAY_KEYS, "num_classes"}
    if unknown or "train_x" not in arrays or "train_y" not in arrays:
        raise DataError(f"{name}: a data callable's dict needs train_x and train_y (optional: test_x, test_y, "
                        f"num_classes); got {sorted(arrays)}")
    train_x, train_y = _features(name, arrays["train_x"]), _labels(name, arrays["train_y"])
    if "test_x" in arrays:
        test_x, test_y = _features(name, arrays["test_x"]), _labels(name, arrays.get("test_y"))
    else:
        test_x, test_y = train_x[:0], train_y[:0]
    classes = int(arrays.get("num_classes", num_classes) or 0)
    if train_y.dtype == np.float32:
        classes = int(train_y.shape[1])
    elif classes <= 0:
        classes = int(max(train_y.max(initial=-1), test_y.max(initial=-1))) + 1
    if len(train_x) == 0:
        raise DataError(f"{name}: the data callable returned no training samples")
    mean, std = channel_stats(train_x)
    return Dataset(name=name, train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y,
                   num_classes=max(classes, 1), mean=mean, std=std)


def _features(name: str, x: object) -> np.ndarray:
    array = np.asarray(x)
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    if array.dtype not in (np.uint8, np.float32) or array.ndim < 2:
        raise DataError(f"{name}: features must be uint8 or float32 N x (sample shape), got {array.dtype} "
                        f"{array.shape}")
    return np.ascontiguousarray(array)


def _labels(name: str, y: object) -> np.ndarray:
    array = np.asarray(y)
    if array.dtype.kind in "iu":
        return np.ascontiguousarray(array.astype(np.int64))
    if array.dtype.kind == "f":
        array = array.astype(np.float32)
        return np.ascontiguousarray(array.reshape(-1, 1) if array.ndim == 1 else array)
    raise DataError(f"{name}: labels must be integer classes or float targets, got {array.dtype}")
