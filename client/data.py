"""This device's data: a shard file, or a data callable named in the agent's own TOML (``package.module:callable``).

``DeviceData.open`` reads the shard, or imports and calls the callable (the device's own configuration names it, so
it is allowed by definition) and checks what it returned (``fldata.dataset_from_arrays``). ``refresh`` calls the
callable again, for ``data.refresh = "every-task"``. A shard carries its partition step's statistics; a callable's
are not the session's (the session's normalisation comes in the welcome). Never reads anything the coordinator names. Must not
import torch, transports or algorithms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedge.fldata import DataError, Dataset, dataset_from_arrays, read_shard
from fedge.plugins import PluginError, describe, is_path, load


class LocalDataError(ValueError):
    """This device's own data cannot be read (a shard, a data callable): ``edge-agent`` exits with status 3."""


@dataclass(frozen=True, eq=False)
class DeviceData(Dataset):
    """This device's training and test arrays (a ``fldata.Dataset`` named by its source). ``partition_stats``:
    ``mean``/``std`` are the partition step's (a shard's), usable as the session's; a callable's are computed here
    and are not (per-device statistics would be a feature shift). ``function``: the callable, for a refresh."""

    partition_stats: bool = False
    function: Callable[[], Any] | None = None

    @property
    def source(self) -> str:
        return self.name

    @property
    def from_callable(self) -> bool:
        return self.function is not None

    @classmethod
    def open(cls, source: str) -> DeviceData:
        """The shard at ``source``, or what the data callable ``source`` returns; LocalDataError in one line."""
        if is_path(source) and not Path(source).exists():
            return cls.call(source)
        try:
            shard = read_shard(source)
        except DataError as exc:
            raise LocalDataError(str(exc)) from None
        return cls(source, shard.train_x, shard.train_y, shard.test_x, shard.test_y, shard.num_classes,
                   tuple(shard.mean), tuple(shard.std), partition_stats=True)

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
        return cls(source, data.train_x, data.train_y, data.test_x, data.test_y, data.num_classes, data.mean,
                   data.std, function=fn)

    def refresh(self) -> DeviceData:
        """The data again (a callable is called again; a shard is what it was)."""
        return DeviceData.from_function(self.function, self.source) if self.function is not None else self
