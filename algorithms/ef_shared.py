"""ef-shared-fedavg / ef-shared-fedprox: ef with one uplink support per round, which the coordinator publishes
(docs/ef.md, "One support for every device"), so that every device's values lie on the same coordinates in the same
order: what a sum over devices needs that never sees one device's update (secure aggregation), and what a robust
rule or a private sum needs of compressed updates.

- Server: ef's server half (``algorithms.ef``: the public model, keyframes, catch-ups, its residual), with the
  round's support S_t published in every task as the group ``support`` (a mask, its values zero: near the mask's
  entropy on the wire, and counted in the downlink's bytes). In the first ``dense_rounds`` rounds S_t is every
  coordinate (so every coordinate's rate is estimated at once); then it holds k coordinates (k from ``keep``, as ef's):
  the k - r largest estimates of what the devices hold of each coordinate (its rate, the mean change it brought per
  round waited when it was last in a support, smoothed by ``smoothing``, times the rounds it has waited since), and
  r = ceil(``explore`` k) that have waited longest, ties in an order drawn by (session seed, round): no coordinate
  waits more than ceil(N / r) rounds, so a device's residual stays bounded whatever the estimates (while fewer
  estimates are nonzero, the waiting part fills the rest). An update is refused unless its values are bound to
  S_t (its CRC).
- Client: ef's client half (it trains from the round's public model, its replica checked by version and CRC), but
  its update is u = y - P + e_i sent on S_t only, as values without indices (``masked-values`` selecting S_t), in
  ``value_dtype``; e_i <- u - decoded(sent) on S_t and u elsewhere (error feedback: no coordinate's change is lost,
  it waits until the coordinate is in a support). Clipped under the task's bound as ef's.
Integer buffers travel dense as in ef. Must not import a transport.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
from torch import nn

from fedge import codec
from fedge.algorithms import ef
from fedge.algorithms.base import Arrays, ClientUpdate, Payload, ServerContext, wrapper_config
from fedge.algorithms.ef_meta import EfUpdate
from fedge.algorithms.keyframes import float_layout
from fedge.algorithms.sparse import NO_GRID, FlatLayout, ValueGrid, fitted
from fedge.codec import SparseSection, TensorGroup
from fedge.protocol.payload import DELTA_GROUP, SECURE_CONTRIBUTORS, SUPPORT_GROUP


@dataclass(frozen=True)
class Config(ef.Config):
    explore: float = 0.5     # the fraction of the support given to the coordinates that waited longest
    smoothing: float = 0.5   # beta of each coordinate's rate estimate (0: the last observation alone)
    dense_rounds: int = 1    # the first rounds whose support is every coordinate (every rate estimated at once)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.explore <= 1:
            raise ValueError(f"algorithm.explore must lie in (0, 1], got {self.explore}")
        if not 0 <= self.smoothing < 1:
            raise ValueError(f"algorithm.smoothing must lie in [0, 1), got {self.smoothing}")
        if isinstance(self.dense_rounds, bool) or not isinstance(self.dense_rounds, int) or self.dense_rounds < 0:
            raise ValueError(f"algorithm.dense_rounds must be an int >= 0, got {self.dense_rounds!r}")


def make_config(base_module: ModuleType, options: Mapping[str, Any]) -> Config:
    return wrapper_config(Config, base_module, options)  # type: ignore[no-any-return]


def support_of(score: np.ndarray, age: np.ndarray, keep: float, explore: float, seed: int, round_number: int
               ) -> np.ndarray:
    """S_t as a bool mask of k coordinates: the k - r largest scores among the nonzero ones (ties by flat index),
    then the r (or more, while fewer scores are nonzero) that have waited longest (``age``), ties in an order drawn
    by (seed, round). So no coordinate waits more than ceil(N / r) rounds, whatever the scores."""
    size = int(score.size)
    count = codec.retained_count(size, keep=keep)
    drawn = min(count, max(1, math.ceil(explore * count)))
    magnitude = np.abs(score.astype(np.float64))
    nonzero = np.flatnonzero(magnitude > 0)
    top = min(count - drawn, int(nonzero.size))
    mask = np.zeros(size, dtype=bool)
    if top:
        order = np.lexsort((nonzero, -magnitude[nonzero]))  # largest first, ties by flat index
        mask[nonzero[order[:top]]] = True
    rest = np.flatnonzero(~mask)
    ties = np.random.default_rng([seed, round_number, 0x5EED]).random(rest.size)
    mask[rest[np.lexsort((ties, -age[rest]))[:count - top]]] = True
    return mask


def support_group(layout: FlatLayout, mask: np.ndarray) -> TensorGroup:
    """The published support: the mask, its values zero (int8, so that they cost next to nothing)."""
    count = int(np.count_nonzero(mask))
    return TensorGroup(sparse=SparseSection.with_mask(layout.names, layout.shapes, mask, np.zeros(count, np.float32)),
                       value_dtype="int8")


def support_from(groups: Mapping[str, TensorGroup], layout: FlatLayout) -> np.ndarray:
    """The support a task publishes (ValueError when it carries none over these tensors)."""
    group = groups.get(SUPPORT_GROUP)
    section = None if group is None else group.sparse
    if section is None or section.kind != "mask" or section.mask is None or section.names != layout.names or \
            section.shapes != layout.shapes:
        raise ValueError(f"ef-shared: the task publishes no support over the model's float tensors (group "
                         f"{SUPPORT_GROUP!r})")
    return np.asarray(section.mask, dtype=bool)


def on_support(layout: FlatLayout, support: np.ndarray, update: np.ndarray, value_dtype: str,
               dense: Mapping[str, np.ndarray], clip: float = 0.0, grid: ValueGrid = NO_GRID
               ) -> tuple[TensorGroup, np.ndarray, float]:
    """``update`` sent on ``support`` (values bound to it, no indices): the group, the new residual (the update
    off the support, what the grid and the decoding moved on it) and the scale that fit the values
    under ``clip`` (0: none)."""
    indices = np.flatnonzero(support)
    values = np.ascontiguousarray(update[indices], dtype=np.float32)
    group, received, scale = fitted(layout, indices, values, value_dtype, dense, clip, lambda wire: SparseSection.
                                    masked_values(layout.names, layout.shapes, support, wire, select=True), grid)
    residual = np.array(update, dtype=np.float32)
    residual[indices] = values - received
    return group, residual, scale


class Server(ef.Server):
    """ef's server half, publishing the round's support and folding values on it."""

    config: Config

    def __init__(self, config: Config, initial: Arrays, context: ServerContext, base_module: ModuleType) -> None:
        super().__init__(config, initial, context, base_module)
        self.rate = np.zeros(self.layout.size, dtype=np.float32)  # each coordinate's mean change per round
        self.age = np.zeros(self.layout.size, dtype=np.int64)       # rounds since it was last in a support
        self.supports: tuple[int, np.ndarray] | None = None  # the round whose support is cached, and it
        self.summed = 0  # the devices in the round's securely aggregated mean (0: none folded)

    def support(self, round_number: int) -> np.ndarray:
        """S_t, drawn once per round from what the devices are estimated to hold when the round opens: each
        coordinate's rate times the rounds it has waited (its pending change, as the devices' residuals hold it)."""
        if self.supports is None or self.supports[0] != round_number:
            pending = self.rate * (self.age + 1).astype(np.float32)
            self.supports = (round_number, np.ones(self.layout.size, dtype=bool)
                             if round_number <= self.config.dense_rounds else
                             support_of(pending, self.age, self.config.keep, self.config.explore, self.context.seed,
                                        round_number))
        return self.supports[1]

    def downlink(self, round_number: int, client_index: int) -> Payload:
        payload = super().downlink(round_number, client_index)
        groups = {**payload.groups, SUPPORT_GROUP: support_group(self.layout, self.support(round_number))}
        return Payload(groups=groups, meta=payload.meta)

    def section_problem(self, round_number: int, section: SparseSection | None) -> str:
        """Its float values must be bound to the round's support (masked values selecting it, no indices): its CRC,
        and one value for each of the support's coordinates, tensor by tensor."""
        if section is None or section.kind != "masked-values" or not section.select or \
                section.names != self.layout.names or section.shapes != self.layout.shapes or \
                section.mask_crc != codec.mask_crc(self.support(round_number)):
            return "an ef-shared update carries its float values on the round's published support (values bound " \
                   "to it, no indices)"
        counts = tuple(int(np.count_nonzero(part)) for part in self.layout.parts(self.support(round_number)).values())
        if tuple(section.counts) != counts or section.values.size != sum(counts):
            return f"an ef-shared update carries {section.values.size} values ({list(section.counts)} by tensor); " \
                   f"the round's support has {sum(counts)} ({list(counts)})"
        return ""

    def positions(self, round_number: int, section: SparseSection) -> np.ndarray:
        return np.flatnonzero(self.support(round_number))

    def fold(self, round_number: int, update: ClientUpdate) -> None:
        """ef's fold, or a securely aggregated round's mean (a ``delta`` group on the round's support, against the
        round's public model): every device it sums holds the round's keyframe now."""
        if DELTA_GROUP not in update.payload.groups:
            super().fold(round_number, update)
            return
        group = update.payload.groups[DELTA_GROUP]
        problem = self.section_problem(round_number, group.sparse)
        if problem or group.sparse is None:
            raise ValueError(problem)
        contributors = update.payload.meta.get(SECURE_CONTRIBUTORS, (update.index,))
        for index in contributors:
            self.model.note_holds(int(index), self.model.key_version)
        self.summed += len(contributors)
        if self.folding is None:
            self.folding, self.stale = ef.FlatMean(self.layout.size), 0
        self.folding.add(group.sparse.values, self.positions(round_number, group.sparse), 1.0, group.dense)

    def reported(self, folding: ef.FlatMean) -> int:
        """A securely aggregated mean is one fold of every device it sums: the keyframe clock counts them all (else
        a full round looked like one device of many, and keyframes stopped)."""
        return self.summed or folding.count

    def shared_form(self, round_number: int, update: ClientUpdate) -> ClientUpdate | None:
        """Every update of a round already lies on one support; one against an older public model joins no sum."""
        return update if EfUpdate.from_meta(update.payload.meta).base == self.model.version else None

    def close_round(self, round_number: int) -> dict[str, Any]:
        folding = self.folding
        if folding is not None and folding.count:
            support = self.support(round_number)
            observed = folding.mean()[support] / (self.age[support] + 1)  # what it gathered over the rounds waited
            beta = self.config.smoothing
            self.rate[support] = (beta * self.rate[support] + (1 - beta) * observed).astype(np.float32)
            self.age += 1
            self.age[support] = 0
        metrics = super().close_round(round_number)
        self.summed = 0
        return {**metrics, "ef_support": int(np.count_nonzero(self.support(round_number)))}

    def state_dict(self) -> tuple[Arrays, dict[str, Any]]:
        arrays, meta = super().state_dict()
        arrays["rate"], arrays["age"] = self.rate, self.age
        return arrays, meta

    def load_state_dict(self, arrays: Arrays, meta: dict[str, Any]) -> None:
        super().load_state_dict(arrays, meta)
        self.rate = np.array(arrays["rate"], dtype=np.float32)
        self.age = np.array(arrays["age"], dtype=np.int64)
        self.supports = None


class Client(ef.Client):
    """ef's client half, sending its update (with its residual) on the round's support."""

    config: Config

    def __init__(self, config: Config, client_index: int, base_module: ModuleType) -> None:
        super().__init__(config, client_index, base_module)
        self.support: np.ndarray | None = None

    def on_receive(self, round_number: int, payload: Payload, model: nn.Module) -> None:
        super().on_receive(round_number, payload, model)
        self.support = support_from(payload.groups, float_layout(self.start))

    def compressed(self, layout: FlatLayout, update: np.ndarray, integers: Arrays
                   ) -> tuple[TensorGroup, np.ndarray, float]:
        if self.support is None:
            raise RuntimeError("ef-shared: an update before its task's support came")
        return on_support(layout, self.support, update, self.config.value_dtype, integers, self.clip, self.grid)
