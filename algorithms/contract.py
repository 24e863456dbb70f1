"""The typed contract between the runtime and an algorithm: what the coordinator calls on a server half
(``ServerHalf``) and an agent on a client half (``ClientHalf``), the defaults of their optional hooks
(``BaseServer``, ``BaseClient``), hook delegation for wrappers over a base algorithm (``WrappedServer``,
``WrappedClient``), and the accessors a wrapper may use on a base that keeps one global model
(``GlobalModelServer``). Must not import a transport; knows models only through the torch module the loop trains.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from fedge.algorithms.base import Arrays, ClientUpdate, LocalStats, Payload, TrainSettings


class ServerHalf(Protocol):
    """What the coordinator calls on an algorithm's server half. ``BaseServer`` gives every optional hook its
    default (``select``: the runtime's own selection; ``check_update``: nothing to add; ``missed``, ``forget``:
    nothing to do; ``pruned_evaluation_arrays``: none); an algorithm overrides what it needs."""

    def select(self, round_number: int, available: Sequence[int], rng: np.random.Generator) -> list[int] | None:
        """The clients of this round among ``available``, or None for the runtime's fraction/count rule."""
    def downlink(self, round_number: int, client_index: int) -> Payload:
        """What client ``client_index`` receives in this round."""
    def check_update(self, round_number: int, update: ClientUpdate) -> str:
        """A reason to refuse an update that ``aggregate`` could not use (a group, tensor or meta key), or ''."""
    def aggregate(self, round_number: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        """Fold the round's accepted updates into the server state; returns metrics for metrics.jsonl."""
    def fold(self, round_number: int, update: ClientUpdate) -> None:
        """Take one accepted update of the round as it arrives (the coordinator then drops its tensors)."""
    def aggregate_folded(self, round_number: int) -> dict[str, Any]:
        """Close the round over what was folded: the same state, bit for bit, as ``aggregate`` of those updates,
        whatever order they were folded in; returns metrics for metrics.jsonl."""
    def missed(self, round_number: int, client_indices: Sequence[int]) -> None:
        """Selected clients that sent nothing before the round closed."""
    def forget(self, client_index: int) -> None:
        """Drop what the server half assumes of a device's state (it failed a round, or left the session)."""
    def evaluation_arrays(self) -> Arrays | None:
        """The global model to evaluate, or None when the algorithm keeps none."""
    def pruned_evaluation_arrays(self) -> Arrays | None:
        """A second model to evaluate (DSSA's pruned one), or None."""
    def state_dict(self) -> tuple[Arrays, dict[str, Any]]:
        """Everything needed to resume: arrays and JSON-able meta (the checkpoint)."""
    def load_state_dict(self, arrays: Arrays, meta: dict[str, Any]) -> None:
        """The inverse of ``state_dict``."""


class ClientHalf(Protocol):
    """What an agent (and THE loop) calls on an algorithm's client half. ``BaseClient`` gives every optional hook
    its default (no use of the initial model, no extra loss, nothing before training or after a backward pass or a
    step, every weight trainable, nothing to freeze, predictions from the received model)."""

    @property
    def inference_after_training(self) -> bool:
        """Predictions use the model as trained on the device (True) or as received (False)."""
    def initial_model(self, arrays: Arrays) -> None:
        """The session's initial model as this device built it (the model spec and the session seed), given once
        when the half is made (ef rebuilds its first public model from it instead of receiving it)."""
    def on_receive(self, round_number: int, payload: Payload, model: nn.Module) -> None:
        """Load what the round's task carries into the model (and the half's own state)."""
    def before_training(self, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor,
                        settings: TrainSettings) -> None:
        """Called once before the first step of a round."""
    def extra_loss(self, model: nn.Module) -> torch.Tensor | None:
        """A term added to the task's loss, or None."""
    def after_backward(self, model: nn.Module) -> None:
        """Called after each backward pass, before the optimizer step (gradient corrections)."""
    def after_step(self, model: nn.Module) -> None:
        """Called after each optimizer step."""
    def make_update(self, round_number: int, model: nn.Module, stats: LocalStats) -> Payload:
        """What the device uploads for this round."""
    def trainable_masks(self) -> dict[str, np.ndarray] | None:
        """For the meter: per prunable tensor, True where a weight is trainable this round; None: all of them."""
    def freeze(self, frozen: Mapping[str, np.ndarray]) -> None:
        """Keep per-coordinate state untouched where ``frozen`` is True (DSSA's retained coordinates)."""
    def state_dict(self) -> Arrays:
        """The device state kept between rounds (committed in two phases by the agent)."""
    def load_state_dict(self, state: Arrays) -> None:
        """The inverse of ``state_dict``; an empty map is a new device."""


class GlobalModelServer(ServerHalf, Protocol):
    """A server half that keeps one global model, which a wrapper (DSSA) may read and replace between the base's
    steps: FedAvg's, FedProx's and SCAFFOLD's."""

    def global_model(self) -> Arrays:
        """The global model x (the server half's own arrays: a caller copies before it changes them)."""
    def set_global_model(self, arrays: Arrays) -> None:
        """Replace the global model x."""


class BaseServer:
    """The defaults of ``ServerHalf``'s optional hooks. The batch default of streaming aggregation: ``fold`` keeps
    each update and ``aggregate_folded`` calls ``aggregate`` on them in client order (an algorithm that needs every
    update at once, as pFedLA and fedcos do, keeps this; one with an incremental path overrides both)."""

    def fold(self, round_number: int, update: ClientUpdate) -> None:
        self.__dict__.setdefault("_folded", []).append(update)

    def aggregate_folded(self, round_number: int) -> dict[str, Any]:
        held: list[ClientUpdate] = sorted(self.__dict__.pop("_folded", []), key=lambda u: u.index)
        aggregate = getattr(self, "aggregate")  # noqa: B009 - every server half has one; BaseServer declares none
        return dict(aggregate(round_number, held)) if held else {}

    def select(self, round_number: int, available: Sequence[int], rng: np.random.Generator) -> list[int] | None:
        return None

    def check_update(self, round_number: int, update: ClientUpdate) -> str:
        return ""

    def missed(self, round_number: int, client_indices: Sequence[int]) -> None:
        return None

    def forget(self, client_index: int) -> None:
        return None

    def pruned_evaluation_arrays(self) -> Arrays | None:
        return None


class BaseClient:
    """The defaults of ``ClientHalf``'s optional hooks."""

    @property
    def inference_after_training(self) -> bool:
        return False

    def initial_model(self, arrays: Arrays) -> None:
        return None

    def before_training(self, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor,
                        settings: TrainSettings) -> None:
        return None

    def extra_loss(self, model: nn.Module) -> torch.Tensor | None:
        return None

    def after_backward(self, model: nn.Module) -> None:
        return None

    def after_step(self, model: nn.Module) -> None:
        return None

    def trainable_masks(self) -> dict[str, np.ndarray] | None:
        return None

    def freeze(self, frozen: Mapping[str, np.ndarray]) -> None:
        return None


class WrappedServer(BaseServer):
    """Hook delegation for wrapper algorithms (DSSA): every optional hook and the evaluation go to ``self.base``,
    the base algorithm's server half; a wrapper overrides only what it changes."""

    base: ServerHalf

    def select(self, round_number: int, available: Sequence[int], rng: np.random.Generator) -> list[int] | None:
        return self.base.select(round_number, available, rng)

    def check_update(self, round_number: int, update: ClientUpdate) -> str:
        return self.base.check_update(round_number, update)

    def missed(self, round_number: int, client_indices: Sequence[int]) -> None:
        self.base.missed(round_number, client_indices)

    def forget(self, client_index: int) -> None:
        self.base.forget(client_index)

    def evaluation_arrays(self) -> Arrays | None:
        return self.base.evaluation_arrays()

    def pruned_evaluation_arrays(self) -> Arrays | None:
        return self.base.pruned_evaluation_arrays()


class WrappedClient(BaseClient):
    """Hook delegation for wrapper algorithms (DSSA, ef-*): every training hook goes to ``self.base``, the base
    algorithm's client half; a wrapper overrides only what it changes and calls these for the rest."""

    base: ClientHalf

    @property
    def inference_after_training(self) -> bool:
        return self.base.inference_after_training

    def initial_model(self, arrays: Arrays) -> None:
        self.base.initial_model(arrays)

    def before_training(self, model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor,
                        settings: TrainSettings) -> None:
        self.base.before_training(model, inputs, labels, settings)

    def extra_loss(self, model: nn.Module) -> torch.Tensor | None:
        return self.base.extra_loss(model)

    def after_backward(self, model: nn.Module) -> None:
        self.base.after_backward(model)

    def after_step(self, model: nn.Module) -> None:
        self.base.after_step(model)

    def trainable_masks(self) -> dict[str, np.ndarray] | None:
        return self.base.trainable_masks()

    def freeze(self, frozen: Mapping[str, np.ndarray]) -> None:
        self.base.freeze(frozen)
