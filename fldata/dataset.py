"""The in-memory dataset type, the package's one exception, and per-channel statistics.

Holds `DataError`, `Dataset`, `channel_stats` and `normalize`. Everything else in `fldata` builds on these.
It must not know about file formats, partitioning or any other Fedge package; numpy only.

Conventions: features are uint8 or float32 arrays shaped N x (per-sample shape): images N x C x H x W, sensor
windows N x C x L, tabular rows N x F. Labels are int64 classes shaped N, or float32 targets shaped N x K
(regression, multi-label). Statistics are per channel, the first per-sample axis (a tabular row's features are its
channels); for uint8 features they are in [0, 1] units (a value p counts as p / 255).
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
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one sample: (C, H, W) for images, (C, L) for sensor windows, (F,) for tabular rows."""
        return tuple(int(d) for d in self.train_x.shape[1:])

    @property
    def has_targets(self) -> bool:
        """True when labels are float32 targets (N x K) rather than int64 classes."""
        return bool(self.train_y.dtype == np.float32)

    @property
    def num_outputs(self) -> int:
        """What a model must output per sample: one score per class, or one value per target."""
        return int(self.train_y.shape[1]) if self.has_targets else self.num_classes


def check_arrays(where: str, x: np.ndarray, y: np.ndarray, num_classes: int, part: str) -> None:
    """Raise DataError unless x is uint8 or float32 N x ... (at least one axis per sample, float32 finite) and y is
    int64 N with labels in [0, num_classes), or float32 N x num_classes finite targets."""
    if not isinstance(x, np.ndarray) or x.dtype not in (np.uint8, np.float32) or x.ndim < 2:
        raise DataError(f"{where}: {part} features must be a uint8 or float32 array N x (sample shape), "
                        f"got {_describe(x)}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise DataError(f"{where}: num_classes must be a positive integer, got {num_classes!r}")
    if x.dtype == np.float32 and not np.isfinite(x).all():
        raise DataError(f"{where}: {part} features hold NaN or infinite values")
    if isinstance(y, np.ndarray) and y.dtype == np.float32:
        if y.ndim != 2 or y.shape[1] != num_classes:
            raise DataError(f"{where}: {part} targets must be a float32 array N x {num_classes}, got {_describe(y)}")
        if not np.isfinite(y).all():
            raise DataError(f"{where}: {part} targets hold NaN or infinite values")
    elif not isinstance(y, np.ndarray) or y.dtype != np.int64 or y.ndim != 1:
        raise DataError(f"{where}: {part} labels must be int64 classes of length N or float32 targets N x K, "
                        f"got {_describe(y)}")
    if len(x) != len(y):
        raise DataError(f"{where}: {len(x)} {part} samples but {len(y)} {part} labels")
    if y.dtype == np.int64 and len(y) and (int(y.min()) < 0 or int(y.max()) >= num_classes):
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
    """Exact per-channel (axis 1) mean and std of N x C x ... features: uint8 in [0, 1] units, float32 as stored.

    uint8 values are counted with a histogram, so no float copy of the data is made; float32 channels are summed in
    float64. A channel with no spread (or an empty array) gets std 1.0, so that normalising never divides by zero.
    """
    if x.dtype == np.float32:
        return _float_stats(x)
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


def _float_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    means: list[float] = []
    stds: list[float] = []
    for c in range(x.shape[1]):
        values = x[:, c].astype(np.float64).reshape(-1)
        if values.size == 0:
            means.append(0.0)
            stds.append(1.0)
            continue
        mean = float(values.mean())
        std = float(values.std())
        means.append(mean)
        stds.append(std if std > 0 else 1.0)
    return tuple(means), tuple(stds)


def normalize(x: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """Features N x C x ... as float32: uint8 divided by 255, then (x - mean) / std per channel (axis 1); float32
    standardised as stored. The session's statistics, never a device's own."""
    x = np.asarray(x)
    if x.dtype not in (np.uint8, np.float32):
        raise DataError(f"normalize expects uint8 or float32 features, got {x.dtype}")
    channels = len(mean)
    if x.ndim < 2 or x.shape[1] != channels:
        raise DataError(f"normalize: array {x.shape} does not have {channels} channels in axis 1")
    check_stats("normalize", mean, std, channels)
    shape = (channels, *([1] * (x.ndim - 2)))
    m = np.asarray(mean, dtype=np.float32).reshape(shape)
    s = np.asarray(std, dtype=np.float32).reshape(shape)
    out = x.astype(np.float32)  # always a copy
    if x.dtype == np.uint8:
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
