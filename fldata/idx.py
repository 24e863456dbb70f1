"""Fashion-MNIST in the IDX format: the file reader and the `fmnist` loader.

An IDX file is a 4-byte big-endian magic number (two zero bytes, a type code, the number of dimensions),
one big-endian uint32 per dimension, then the values in C order. Fashion-MNIST uses type 0x08 (uint8):
images have magic 0x00000803 (N x 28 x 28), labels 0x00000801 (N). Files may be gzip-compressed; gzip is
recognised by its own magic bytes, not by the file name. This module must not know about partitioning,
other datasets or any other Fedge package.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from fedge.fldata.dataset import DataError, Dataset, channel_stats

IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801
DEFAULT_FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FMNIST_ENV = "FEDGE_FMNIST_DIR"
FMNIST_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}
FMNIST_CLASSES = 10
_GZIP_MAGIC = b"\x1f\x8b"


def read_idx(path: Path, magic: int) -> np.ndarray:
    """The uint8 array stored in one IDX file (plain or gzip), checking the magic number and the length."""
    try:
        raw = path.read_bytes()
        if raw[:2] == _GZIP_MAGIC:
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: cannot read IDX file: {exc}") from None
    if len(raw) < 4:
        raise DataError(f"{path}: too short to be an IDX file ({len(raw)} bytes)")
    (found,) = struct.unpack(">I", raw[:4])
    if found != magic:
        raise DataError(f"{path}: IDX magic number is 0x{found:08x}, expected 0x{magic:08x}")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: IDX header truncated ({len(raw)} bytes)")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(shape, dtype=np.int64))
    if len(raw) - header != expected:
        raise DataError(
            f"{path}: IDX header says shape {shape} ({expected} bytes of data) but the file holds "
            f"{len(raw) - header} bytes after the header"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def find_idx_file(directory: Path, stem: str) -> Path:
    """The file `stem` or `stem.gz` in directory (the uncompressed one wins), or DataError naming both."""
    for name in (stem, stem + ".gz"):
        candidate = directory / name
        if candidate.is_file():
            return candidate
    raise DataError(f"{directory / stem}: missing (looked for {stem} and {stem}.gz in {directory})")


def fmnist_dir(path: str | None) -> Path:
    """The Fashion-MNIST directory: the given path, else $FEDGE_FMNIST_DIR, else the Debian location."""
    if path:
        return Path(path)
    env = os.environ.get(FMNIST_ENV)
    return Path(env) if env else DEFAULT_FMNIST_DIR


def load_fmnist(path: str | None = None) -> Dataset:
    """The full Fashion-MNIST dataset (60,000 train / 10,000 test) from a directory of IDX files."""
    directory = fmnist_dir(path)
    if not directory.is_dir():
        raise DataError(
            f"{directory}: Fashion-MNIST directory not found (install the Debian package "
            f"dataset-fashion-mnist, set ${FMNIST_ENV}, or pass the directory holding the IDX files)"
        )
    parts: dict[str, np.ndarray] = {}
    for part, stem in FMNIST_FILES.items():
        file = find_idx_file(directory, stem)
        parts[part] = read_idx(file, IMAGES_MAGIC if part.endswith("_x") else LABELS_MAGIC)
    for split in ("train", "test"):
        x, y = parts[f"{split}_x"], parts[f"{split}_y"]
        if len(x) != len(y):
            raise DataError(
                f"{directory}: {FMNIST_FILES[split + '_x']} holds {len(x)} images but "
                f"{FMNIST_FILES[split + '_y']} holds {len(y)} labels"
            )
        if len(y) and int(y.max()) >= FMNIST_CLASSES:
            raise DataError(f"{directory / FMNIST_FILES[split + '_y']}: label {int(y.max())} is not in 0..9")
    train_x = parts["train_x"][:, None, :, :]
    mean, std = channel_stats(train_x)
    return Dataset(
        name="fmnist",
        train_x=train_x,
        train_y=parts["train_y"].astype(np.int64),
        test_x=parts["test_x"][:, None, :, :],
        test_y=parts["test_y"].astype(np.int64),
        num_classes=FMNIST_CLASSES,
        mean=mean,
        std=std,
    )
