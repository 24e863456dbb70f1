"""This device's data: a shard file, or a data callable named in the agent's own TOML (``package.module:callable``).

``DeviceData.open`` reads the shard, or imports and calls the callable (the device's own configuration names it, so
it is allowed by definition) and checks what it returned (``fldata.dataset_from_arrays``). ``refresh`` calls the
callable again, for ``data.refresh = "every-task"``. A shard carries its partition step's statistics; a callable
has none (the session's normalisation comes in the welcome). Never reads anything the coordinator names. Must not
import torch, transports or algorithms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedge.fldata import DataError, dataset_from_arrays, read_shard
from fedge.plugins import PluginError, describe, is_path, load


class LocalDataError(ValueError):
    """This device's own data cannot be read (a shard, a data callable): ``edge-agent`` exits with status 3."""


@dataclass(frozen=True)
class DeviceData:
    """Training and test arrays of this device, what they are, and where they came from."""

    source: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    function: Callable[[], Any] | None = None

    @property
    def from_callable(self) -> bool:
        return self.function is not None

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.train_x.shape[1:])

    @property
    def has_targets(self) -> bool:
        return bool(self.train_y.dtype == np.float32)

    @property
    def num_outputs(self) -> int:
        return int(self.train_y.shape[1]) if self.has_targets else self.num_classes

    @classmethod
    def open(cls, source: str) -> DeviceData:
        """The shard at ``source``, or what the data callable ``source`` returns; ValueError in one line."""
        if is_path(source) and not Path(source).exists():
            return cls.call(source)
        try:
            shard = read_shard(source)
        except DataError as exc:
            raise LocalDataError(str(exc)) from None
        return cls(source, shard.train_x, shard.train_y, shard.test_x, shard.test_y, shard.num_classes,
                   tuple(shard.mean), tuple(shard.std))

    @classmethod
    def call(cls, source: str) -> DeviceData:
        try:
            fn = load(describe("data", source))
        except PluginError as exc:
            raise LocalDataError(f"agent.data: {exc}") from None
        return cls.from_function(fn, source)

    @classmethod
    def from_function(cls, fn: Callable[[], Any], source: str) -> DeviceData:
        """What ``fn()`` returns (a dict or tuple of arrays, ``fldata.dataset_from_arrays``), remembering ``fn``."""
        try:
            returned = fn()
        except Exception as exc:
            raise LocalDataError(f"agent.data {source!r} raised {type(exc).__name__}: {exc}") from None
        try:
            data = dataset_from_arrays(source, returned)
        except DataError as exc:
            raise LocalDataError(f"agent.data: {exc}") from None
        return cls(source, data.train_x, data.train_y, data.test_x, data.test_y, data.num_classes, function=fn)

    def refresh(self) -> DeviceData:
        """The data again (a callable is called again; a shard is what it was)."""
        return DeviceData.from_function(self.function, self.source) if self.function is not None else self
