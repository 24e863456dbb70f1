"""What the runtime calls on an algorithm's server half (``ServerHalf``; ``GlobalModelServer`` for a half that
keeps one global model a wrapper may replace), and the one aggregation path every driver and test takes
(``Aggregation``: fold each accepted update as it arrives, then close the round). Torch-free: the protocol objects
call a server half through this contract without importing an algorithm. The defaults of the optional hooks and
the streaming and batch bases are in ``algorithms.contract``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from fedge.protocol.payload import Arrays, ClientUpdate, Payload


class ServerHalf(Protocol):
    """What the coordinator calls on an algorithm's server half. ``algorithms.contract.BaseServer`` gives every
    optional hook its default (``select``: the runtime's own selection; ``check_update``: nothing to add;
    ``missed``, ``forget``: nothing to do; ``pruned_evaluation_arrays``: none); an algorithm overrides what it
    needs. Aggregation streams: ``fold`` each accepted update, then ``close_round``."""

    def select(self, round_number: int, available: Sequence[int], rng: np.random.Generator) -> list[int] | None:
        """The clients of this round among ``available``, or None for the runtime's fraction/count rule."""
    def downlink(self, round_number: int, client_index: int) -> Payload:
        """What client ``client_index`` receives in this round."""
    def check_update(self, round_number: int, update: ClientUpdate) -> str:
        """A reason to refuse an update that ``fold`` could not use (a group, tensor or meta key), or ''."""
    def fold(self, round_number: int, update: ClientUpdate) -> None:
        """Take one accepted update of the round as it arrives (the coordinator then drops its tensors)."""
    def close_round(self, round_number: int) -> dict[str, Any]:
        """Close the round over what was folded (called only when something was): the same state, bit for bit,
        whatever order the updates were folded in; returns metrics for metrics.jsonl."""
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


class GlobalModelServer(ServerHalf, Protocol):
    """A server half that keeps one global model, which a wrapper (DSSA) may read and replace between the base's
    steps: FedAvg's, FedProx's and SCAFFOLD's."""

    def global_model(self) -> Arrays:
        """The global model x (the server half's own arrays: a caller copies before it changes them)."""
    def set_global_model(self, arrays: Arrays) -> None:
        """Replace the global model x."""


class Aggregation:
    """One round's aggregation on a server half: the one path every driver (a session, the in-process driver) and
    every test takes. ``fold`` each accepted update as it arrives, then ``close``, which calls the half's
    ``close_round`` only when something was folded (a round with no update leaves the server state as it was)."""

    def __init__(self, server: ServerHalf, round_number: int) -> None:
        self.server = server
        self.round = round_number
        self.folded = 0

    def fold(self, update: ClientUpdate) -> None:
        self.server.fold(self.round, update)
        self.folded += 1

    def close(self) -> dict[str, Any]:
        return dict(self.server.close_round(self.round)) if self.folded else {}


def aggregate_round(server: ServerHalf, round_number: int, updates: Sequence[ClientUpdate]) -> dict[str, Any]:
    """``updates`` folded in the order given and the round closed (``Aggregation``); the round's metrics."""
    aggregation = Aggregation(server, round_number)
    for update in updates:
        aggregation.fold(update)
    return aggregation.close()
