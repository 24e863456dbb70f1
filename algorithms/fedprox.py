"""FedProx (Li et al. 2020; docs/algorithms.md section 2): FedAvg plus a proximal pull toward the received model.

The client objective gains (mu/2)||w - x^t||^2 with x^t the model received this round; its gradient mu (w - x^t) is
added to ``.grad`` after the backward pass, which is exact for any optimizer that reads ``.grad``. mu = 0 adds
nothing and the run is FedAvg's bit for bit. The server half is FedAvg's. Must not import a transport.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedge.algorithms import fedavg
from fedge.algorithms.base import Payload


@dataclass(frozen=True)
class Config(fedavg.Config):
    mu: float = 0.01

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mu < 0:
            raise ValueError(f"algorithm.mu must be >= 0, got {self.mu}")


Server = fedavg.Server


def add_proximal_gradient(model: nn.Module, anchor: dict[str, torch.Tensor], mu: float) -> None:
    """grad += mu (w - anchor) for every trainable parameter that has an anchor."""
    if mu == 0:
        return
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.grad is not None and name in anchor:
                param.grad.add_(param.detach() - anchor[name], alpha=mu)


class Client(fedavg.Client):
    """FedAvg's client with the proximal gradient; the anchor is the received model, fixed for the round."""

    config: Config

    def __init__(self, config: Config, client_index: int) -> None:
        super().__init__(config, client_index)
        self.anchor: dict[str, torch.Tensor] = {}

    def on_receive(self, round_number: int, payload: Payload, model: nn.Module) -> None:
        super().on_receive(round_number, payload, model)
        self.anchor = {name: p.detach().clone() for name, p in model.named_parameters()}

    def after_backward(self, model: nn.Module) -> None:
        add_proximal_gradient(model, self.anchor, self.config.mu)
