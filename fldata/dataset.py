"""The in-memory dataset type, the package's one exception, and per-channel statistics.

Holds `DataError`, `Dataset`, `channel_stats` and `normalize`. Everything else in `fldata` builds on these.
It must not know about file formats, partitioning or any other Fedge package; numpy only.

Conventions: images are uint8 arrays shaped N x C x H x W, labels are int64 arrays shaped N, and the
per-channel mean and std are in [0, 1] pixel units (a pixel p counts as p / 255).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


class DataError(Exception):
    """A dataset file is missing or malformed, or a request cannot be met. The message says which."""


@dataclass(frozen=True, eq=False)
class Dataset:
    """A whole dataset: the training set, the official test set, and the training set's channel statistics."""

    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        check_arrays(self.name, self.train_x, self.train_y, self.num_classes, "train")
        check_arrays(self.name, self.test_x, self.test_y, self.num_classes, "test")
        if self.train_x.shape[1:] != self.test_x.shape[1:]:
            raise DataError(
                f"{self.name}: train images are {self.train_x.shape[1:]} but test images are "
                f"{self.test_x.shape[1:]}"
            )
        check_stats(self.name, self.mean, self.std, self.train_x.shape[1])

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one image."""
        c, h, w = self.train_x.shape[1:]
        return (int(c), int(h), int(w))


def check_arrays(where: str, x: np.ndarray, y: np.ndarray, num_classes: int, part: str) -> None:
    """Raise DataError unless x is uint8 N x C x H x W and y is int64 N with labels in [0, num_classes)."""
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 4:
        raise DataError(f"{where}: {part} images must be a uint8 array N x C x H x W, got {_describe(x)}")
    if not isinstance(y, np.ndarray) or y.dtype != np.int64 or y.ndim != 1:
        raise DataError(f"{where}: {part} labels must be an int64 array of length N, got {_describe(y)}")
    if len(x) != len(y):
        raise DataError(f"{where}: {len(x)} {part} images but {len(y)} {part} labels")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise DataError(f"{where}: num_classes must be a positive integer, got {num_classes!r}")
    if len(y) and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise DataError(
            f"{where}: {part} labels must lie in [0, {num_classes}), found {int(y.min())}..{int(y.max())}"
        )


def check_stats(where: str, mean: Sequence[float], std: Sequence[float], channels: int) -> None:
    """Raise DataError unless mean and std hold one finite number per channel and every std is positive."""
    if len(mean) != channels or len(std) != channels:
        raise DataError(f"{where}: mean and std need {channels} values each, got {len(mean)} and {len(std)}")
    for m, s in zip(mean, std, strict=True):
        if not (_is_number(m) and _is_number(s) and math.isfinite(m) and math.isfinite(s) and s > 0):
            raise DataError(f"{where}: mean/std must be finite numbers with std > 0, got {m!r}/{s!r}")


def channel_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Exact per-channel mean and std of uint8 images N x C x H x W, in [0, 1] pixel units.

    Counts pixel values with a histogram, so it needs no float copy of the data. A channel with no
    spread (or an empty array) gets std 1.0, so that normalising never divides by zero.
    """
    values = np.arange(256, dtype=np.float64) / 255.0
    means: list[float] = []
    stds: list[float] = []
    for c in range(x.shape[1]):
        hist = np.bincount(x[:, c].reshape(-1), minlength=256).astype(np.float64)
        total = hist.sum()
        if total == 0:
            means.append(0.0)
            stds.append(1.0)
            continue
        mean = float(hist @ values / total)
        var = float(hist @ (values - mean) ** 2 / total)
        means.append(mean)
        stds.append(math.sqrt(var) if var > 0 else 1.0)
    return tuple(means), tuple(stds)


def normalize(x_uint8: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """(x / 255 - mean) / std per channel, as float32; x is C x H x W or N x C x H x W uint8."""
    x = np.asarray(x_uint8)
    if x.dtype != np.uint8:
        raise DataError(f"normalize expects uint8 pixels, got {x.dtype}")
    channels = len(mean)
    if x.ndim not in (3, 4) or x.shape[-3] != channels:
        raise DataError(f"normalize: array {x.shape} does not have {channels} channels in axis -3")
    check_stats("normalize", mean, std, channels)
    m = np.asarray(mean, dtype=np.float32).reshape(channels, 1, 1)
    s = np.asarray(std, dtype=np.float32).reshape(channels, 1, 1)
    out = x.astype(np.float32)
    out /= np.float32(255.0)
    out -= m
    out /= s
    return out


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _describe(a: object) -> str:
    if isinstance(a, np.ndarray):
        return f"{a.dtype} array of shape {a.shape}"
    return type(a).__name__
