"""One client's data (`ClientShard`), its file format, and the partition summary.

A shard file is an uncompressed .npz (a zip of .npy files, as `np.savez` writes it) holding exactly
`train_x.npy` (uint8 or little-endian float32, N x sample shape), `train_y.npy` (little-endian int64 N classes, or
float32 N x K targets), `test_x.npy`, `test_y.npy`, and `meta.npy`: a 0-d unicode array holding one JSON object with
the keys in `META_KEYS`. Version 1 is the uint8 / int64 shard; a shard with float32 features or targets is version 2. docs/data.md
spells the bytes out. `read_shard` checks everything and never unpickles. This module must not know about
loaders, partitioners or any other Fedge package.
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedge.fldata.dataset import DataError, check_arrays, check_stats

SHARD_FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
ARRAY_NAMES = ("train_x", "train_y", "test_x", "test_y")
META_KEYS = ("format_version", "index", "dataset", "partition", "seed", "num_classes", "mean", "std", "meta")


@dataclass(frozen=True, eq=False)
class ClientShard:
    """One client's training data, its personal test split, and where they came from."""

    index: int
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    dataset: str
    partition: str
    seed: int
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def has_targets(self) -> bool:
        """True when labels are float32 targets N x K (``num_classes`` is then K)."""
        return bool(self.train_y.dtype == np.float32)

    def label_counts(self) -> list[int]:
        """Training samples per class, one int per class (empty for float targets)."""
        if self.has_targets:
            return []
        return [int(c) for c in np.bincount(self.train_y, minlength=self.num_classes)]


def write_shard(path: str | os.PathLike[str], shard: ClientShard) -> None:
    """Write shard to path as a shard .npz, atomically (a temporary file, then a rename)."""
    target = Path(path)
    classic = shard.train_x.dtype == np.uint8 and shard.train_y.dtype == np.int64
    x_dtype = np.dtype(np.uint8) if shard.train_x.dtype == np.uint8 else np.dtype("<f4")
    y_dtype = np.dtype("<i8") if shard.train_y.dtype == np.int64 else np.dtype("<f4")
    meta = {
        "format_version": 1 if classic else SHARD_FORMAT_VERSION,
        "index": int(shard.index),
        "dataset": str(shard.dataset),
        "partition": str(shard.partition),
        "seed": int(shard.seed),
        "num_classes": int(shard.num_classes),
        "mean": [float(v) for v in shard.mean],
        "std": [float(v) for v in shard.std],
        "meta": shard.meta,
    }
    try:
        text = json.dumps(meta, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{target}: shard meta is not plain JSON: {exc}") from None
    tmp = target.with_name(target.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez(
                f,
                train_x=np.ascontiguousarray(shard.train_x, dtype=x_dtype),
                train_y=np.ascontiguousarray(shard.train_y, dtype=y_dtype),
                test_x=np.ascontiguousarray(shard.test_x, dtype=x_dtype),
                test_y=np.ascontiguousarray(shard.test_y, dtype=y_dtype),
                meta=np.array(text),
            )
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise DataError(f"{target}: cannot write shard: {exc}") from None


def read_shard(path: str | os.PathLike[str]) -> ClientShard:
    """The shard stored at path; DataError naming the file if anything is missing, malformed or corrupt."""
    source = Path(path)
    try:
        loaded = np.load(source, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise DataError(f"{source}: a shard must be an .npz archive, found a single .npy array")
        with loaded as npz:
            names = sorted(npz.files)
            if names != sorted((*ARRAY_NAMES, "meta")):
                raise DataError(f"{source}: shard arrays must be {', '.join((*ARRAY_NAMES, 'meta'))}; found {names}")
            arrays = {name: npz[name] for name in ARRAY_NAMES}
            meta_array = npz["meta"]
    except DataError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as exc:
        raise DataError(f"{source}: not a readable shard file: {exc}") from None
    meta = _parse_meta(source, meta_array)
    for name in ARRAY_NAMES:
        allowed: tuple[str, ...] = ("|u1", "<f4") if name.endswith("_x") else ("<i8", "<f4")
        if meta["format_version"] == 1:
            allowed = allowed[:1]
        if arrays[name].dtype.str not in allowed:
            raise DataError(f"{source}: {name} must have dtype {' or '.join(allowed)}, found {arrays[name].dtype.str}")
    for part in ("x", "y"):
        if arrays[f"train_{part}"].dtype != arrays[f"test_{part}"].dtype:
            raise DataError(f"{source}: train_{part} is {arrays[f'train_{part}'].dtype} but test_{part} is "
                            f"{arrays[f'test_{part}'].dtype}")
    where = str(source)
    check_arrays(where, arrays["train_x"], arrays["train_y"], meta["num_classes"], "train")
    check_arrays(where, arrays["test_x"], arrays["test_y"], meta["num_classes"], "test")
    if arrays["test_x"].shape[1:] != arrays["train_x"].shape[1:]:
        raise DataError(f"{source}: test samples {arrays['test_x'].shape[1:]} differ from train samples "
                        f"{arrays['train_x'].shape[1:]}")
    check_stats(where, meta["mean"], meta["std"], arrays["train_x"].shape[1])
    return ClientShard(
        index=meta["index"],
        train_x=arrays["train_x"],
        train_y=arrays["train_y"],
        test_x=arrays["test_x"],
        test_y=arrays["test_y"],
        num_classes=meta["num_classes"],
        mean=tuple(float(v) for v in meta["mean"]),
        std=tuple(float(v) for v in meta["std"]),
        dataset=meta["dataset"],
        partition=meta["partition"],
        seed=meta["seed"],
        meta=meta["meta"],
    )


def _parse_meta(source: Path, array: np.ndarray) -> dict[str, Any]:
    if array.dtype.kind != "U" or array.size != 1:
        raise DataError(f"{source}: meta must be a single unicode string, found {array.dtype.str} {array.shape}")
    try:
        meta = json.loads(str(array.reshape(())))
    except ValueError as exc:
        raise DataError(f"{source}: meta is not valid JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise DataError(f"{source}: meta must be a JSON object")
    meta.setdefault("meta", {})
    if sorted(meta) != sorted(META_KEYS):
        raise DataError(f"{source}: meta keys must be {', '.join(META_KEYS)}; found {', '.join(sorted(meta))}")
    if meta["format_version"] not in READABLE_VERSIONS or isinstance(meta["format_version"], bool):
        raise DataError(f"{source}: shard format version {meta['format_version']!r} is not supported "
                        f"(this reader knows versions {', '.join(map(str, READABLE_VERSIONS))})")
    kinds: dict[str, type] = {"index": int, "seed": int, "num_classes": int, "dataset": str,
                              "partition": str, "mean": list, "std": list, "meta": dict}
    for key, kind in kinds.items():
        value = meta[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise DataError(f"{source}: meta[{key!r}] must be a JSON {kind.__name__}, found {value!r}")
    if meta["index"] < 0 or meta["num_classes"] < 1:
        raise DataError(f"{source}: meta index must be >= 0 and num_classes >= 1")
    return meta


def summary(dataset_name: str, scheme: str, seed: int, shards: Sequence[ClientShard]) -> dict[str, Any]:
    """The partition as plain JSON data: sizes and training label counts per client."""
    return {
        "dataset": dataset_name,
        "partition": scheme,
        "seed": int(seed),
        "clients": [
            {
                "id": int(s.index),
                "train_size": len(s.train_y),
                "test_size": len(s.test_y),
                "label_counts": s.label_counts(),
            }
            for s in shards
        ],
    }
