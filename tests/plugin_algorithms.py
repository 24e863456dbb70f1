"""An algorithm plugin for the tests: FedAvg with a server step size (x <- x + eta (mean - x)), and two broken
ones (a server half without the optional hooks, and one overriding a hook no runtime calls)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedge.algorithms import fedavg
from fedge.algorithms.base import ClientUpdate


@dataclass(frozen=True)
class StepConfig(fedavg.Config):
    server_lr: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.server_lr <= 1:
            raise ValueError(f"algorithm.server_lr must be in (0, 1], got {self.server_lr}")


class StepServer(fedavg.Server):
    """FedAvg's streaming half with one change: the round's close moves x only eta of the way to the mean."""

    config: StepConfig

    def close_round(self, round_number: int) -> dict[str, Any]:
        before = {name: array.copy() for name, array in self.model.items()}
        super().close_round(round_number)
        eta = self.config.server_lr
        for name, old in before.items():
            if fedavg.is_float(old):
                self.model[name] = (old + eta * (self.model[name].astype(np.float64) - old)).astype(old.dtype)
        return {"server_lr": eta}


class ServerStep:
    """What an algorithm plugin names: Config, Server and Client."""

    Config = StepConfig
    Server = StepServer
    Client = fedavg.Client


class Bare:
    """A server half that skipped the base class: it lacks the optional hooks."""

    def downlink(self, round_number: int, client_index: int) -> Any:
        return None


class Broken:
    Config = StepConfig
    Server = Bare
    Client = fedavg.Client


class OldStepServer(fedavg.Server):
    """The mistake the contract refuses: a streaming half overriding a hook no runtime calls."""

    def aggregate(self, round_number: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        return {}


class Mixed:
    Config = StepConfig
    Server = OldStepServer
    Client = fedavg.Client
