"""The typed contract between the runtime and an algorithm: what an agent calls on a client half (``ClientHalf``;
what the coordinator calls on a server half, ``ServerHalf`` and ``GlobalModelServer``, is torch-free and lives in
``protocol.server_half``), the defaults of the optional hooks (``BaseServer``, the streaming base; ``HeldServer``,
the batch base; ``BaseClient``), the load-time rule that a half is one or the other (``aggregation_refusal``), and
hook delegation for wrappers over a base algorithm (``WrappedServer``, ``WrappedClient``). Must not import a transport; knows models only through the torch module the loop trains.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from fedge.algorithms.base import Arrays, ClientUpdate, LocalStats, Payload, TrainSettings
from fedge.protocol.server_half import ServerHalf


class ClientHalf(Protocol):
    """What an agent (and THE loop) calls on an algorithm's client half. ``BaseClient`` gives every optional hook
    its default (no use of the initial model or of the round's norm bounds, no extra loss, nothing before training or after a backward pass or a
    step, every weight trainable, nothing to freeze, predictions from the received model)."""

    @property
    def inference_after_training(self) -> bool:
        """Predictions use the model as trained on the device (True) or as received (False)."""
    def initial_model(self, arrays: Arrays) -> None:
        """The session's initial model as this device built it (the model spec and the session seed), given once
        when the half is made (ef rebuilds its first public model from it instead of receiving it)."""
    def on_receive(self, round_number: int, payload: Payload, model: nn.Module) -> None:
        """Load what the round's task carries into the model (and the half's own state)."""
    def on_bounds(self, round_number: int, norm_bounds: Mapping[str, float]) -> None:
        """The L2 bound the coordinator applies to each update group's change this round (the task's
        ``norm_bounds``, by group name, ``*`` for every group; empty when none is known yet), given after
        ``on_receive``: a half that keeps what it does not send (ef's residual) clips what it sends to it."""
    def on_value_grid(self, round_number: int, bound: float, step: float) -> None:
        """The grid this round's values are summed on (0: none), given after ``on_bounds``: secure aggregation
        clips every coordinate beyond ``bound`` and rounds it to a multiple of ``step`` at random; a half that keeps
        what it does not send (ef's residual) clamps what it sends to ``bound`` and rounds it to the grid itself, so
        that neither loses anything."""
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
    def clip_scale(self) -> float:
        """After ``make_update``: the factor this round's update was scaled by to fit the task's norm bounds (1.0:
        untouched), which the agent reports in its Update for the coordinator's records."""
    def trainable_masks(self) -> dict[str, np.ndarray] | None:
        """For the meter: per prunable tensor, True where a weight is trainable this round; None: all of them."""
    def freeze(self, frozen: Mapping[str, np.ndarray]) -> None:
        """Keep per-coordinate state untouched where ``frozen`` is True (DSSA's retained coordinates)."""
    def state_dict(self) -> Arrays:
        """The device state kept between rounds (committed in two phases by the agent)."""
    def load_state_dict(self, state: Arrays) -> None:
        """The inverse of ``state_dict``; an empty map is a new device."""


class BaseServer:
    """The streaming base: the defaults of ``ServerHalf``'s optional hooks. A subclass folds each update as it
    arrives (``fold``) and closes the round (``close_round``); an algorithm that needs every update at once
    subclasses ``HeldServer`` instead."""

    # True when the half's devices keep state from one task to the next (ef's residual and replica): in an
    # asynchronous session such a device is given its next task only once its last update is committed
    device_state = False

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

    def change_reference(self, round_number: int, client_index: int) -> Arrays | None:
        return None

    def influence_phase(self, round_number: int) -> str:
        return ""

    def shared_form(self, round_number: int, update: ClientUpdate) -> ClientUpdate | None:
        return update


class BaseClient:
    """The defaults of ``ClientHalf``'s optional hooks."""

    @property
    def inference_after_training(self) -> bool:
        return False

    def initial_model(self, arrays: Arrays) -> None:
        return None

    def on_bounds(self, round_number: int, norm_bounds: Mapping[str, float]) -> None:
        return None

    def on_value_grid(self, round_number: int, bound: float, step: float) -> None:
        return None

    def clip_scale(self) -> float:
        return 1.0

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


class HeldServer(BaseServer):
    """The batch base, for an algorithm that needs every update of a round at once (pFedLA, fedcos): the runtime's
    ``fold`` holds each update, and ``close_round`` hands them, in client order, to the one aggregation hook such
    an algorithm has, ``aggregate_held``. A subclass overrides neither ``fold`` nor ``close_round``
    (``aggregation_refusal`` refuses it at load)."""

    def fold(self, round_number: int, update: ClientUpdate) -> None:
        held: dict[int, list[ClientUpdate]] = self.__dict__.setdefault("_held", {})
        held.setdefault(round_number, []).append(update)

    def close_round(self, round_number: int) -> dict[str, Any]:
        held: dict[int, list[ClientUpdate]] = self.__dict__.pop("_held", {})
        updates = sorted(held.get(round_number, []), key=lambda u: u.index)
        return dict(self.aggregate_held(round_number, updates)) if updates else {}

    def aggregate_held(self, round_number: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
        """Aggregate the round's accepted updates (in client order, at least one); returns metrics."""
        raise NotImplementedError(f"{type(self).__name__} subclasses HeldServer and must define aggregate_held")


STREAMING_HOOKS = ("fold", "close_round")
BATCH_HOOKS = ("aggregate_held",)
RETIRED_HOOKS = ("aggregate", "aggregate_folded")  # no runtime calls them: defining one is a mistake


def aggregation_refusal(cls: type) -> str:
    """Why a server half's class cannot aggregate on the one path, in one line naming the class and the method,
    or '': a batch half (``HeldServer``) that overrides a streaming hook, a streaming half that defines the batch
    hook, or a method named like a hook the runtime never calls."""
    name = f"{cls.__module__}.{cls.__qualname__}"
    for hook in RETIRED_HOOKS:
        if hasattr(cls, hook):
            return (f"{name}.{hook} is not a hook of the aggregation contract and would never be called: a streaming "
                    "half overrides fold and close_round; a batch half subclasses HeldServer and overrides "
                    "aggregate_held")
    if issubclass(cls, HeldServer):
        for klass in cls.__mro__:
            if klass is HeldServer:
                break
            for hook in STREAMING_HOOKS:
                if hook in vars(klass):
                    return (f"{name} subclasses the batch base HeldServer but overrides {hook} (in "
                            f"{klass.__qualname__}): its only aggregation hook is aggregate_held")
        if getattr(cls, "aggregate_held") is HeldServer.aggregate_held:  # noqa: B009
            return f"{name} subclasses the batch base HeldServer but does not define aggregate_held"
        return ""
    for hook in BATCH_HOOKS:
        if hasattr(cls, hook):
            return (f"{name}.{hook} is the batch hook, but {cls.__qualname__} is a streaming half (it does not "
                    "subclass HeldServer): override fold and close_round, or subclass HeldServer")
    return ""


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

    def change_reference(self, round_number: int, client_index: int) -> Arrays | None:
        return self.base.change_reference(round_number, client_index)

    def influence_phase(self, round_number: int) -> str:
        return self.base.influence_phase(round_number)

    def shared_form(self, round_number: int, update: ClientUpdate) -> ClientUpdate | None:
        return self.base.shared_form(round_number, update)


class WrappedClient(BaseClient):
    """Hook delegation for wrapper algorithms (DSSA, ef-*): every training hook goes to ``self.base``, the base
    algorithm's client half; a wrapper overrides only what it changes and calls these for the rest."""

    base: ClientHalf

    @property
    def inference_after_training(self) -> bool:
        return self.base.inference_after_training

    def initial_model(self, arrays: Arrays) -> None:
        self.base.initial_model(arrays)

    def on_bounds(self, round_number: int, norm_bounds: Mapping[str, float]) -> None:
        self.base.on_bounds(round_number, norm_bounds)

    def on_value_grid(self, round_number: int, bound: float, step: float) -> None:
        self.base.on_value_grid(round_number, bound, step)

    def clip_scale(self) -> float:
        return self.base.clip_scale()

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
