"""A device's change as the field words it masks, and the survivors' summed words as their mean change: the grid
of a securely aggregated round (``Grid``) and its settings as a Task carries them (wire format 3.4, ``sa``).

The coordinator chooses the grid for the round: the field's width ``bits``, the clip range of each float tensor (a
change beyond it is clipped: the one bound a device's influence keeps, coordinate by coordinate) and the levels
L = ``field.levels_for(bits, n)`` for the n devices selected, so that their sum never wraps. A device quantises its
change on that grid with unbiased stochastic rounding drawn from (run seed, round, client, attempt), so a simulated
and a real fleet draw the same integers. The sum of the survivors' integers, read back signed and scaled, divided
by their count, is the mean of their quantised changes: an unbiased estimate of their mean change, off by at
most one grid step per coordinate for each device. A grid whose numbers do not make sense is refused
(``ValueError``) by whoever reads it. Pure numpy; nothing of Fedge beyond this package.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fedge.secagg import field
from fedge.secagg.distributed import NoisyGrid
from fedge.secagg.graph import threshold_of
from fedge.secagg.keys import round_context, support_digest
from fedge.secagg.messages import Setup


@dataclass(frozen=True)
class Grid:
    """The field's width, the levels and each float tensor's clip range and number of coordinates."""

    bits: int
    levels: int
    clips: tuple[float, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        field.check_bits(self.bits)
        if self.levels < 1 or 2 * self.levels + 1 > 1 << self.bits:
            raise ValueError(f"{self.levels} levels do not fit a field of {self.bits} bits")
        if len(self.clips) != len(self.sizes) or not self.sizes:
            raise ValueError(f"{len(self.clips)} clip ranges for {len(self.sizes)} float tensors")
        if not all(math.isfinite(c) and c > 0 for c in self.clips) or any(s < 0 for s in self.sizes):
            raise ValueError("every clip range must be finite and above 0")

    @property
    def size(self) -> int:
        return sum(self.sizes)

    @property
    def words(self) -> int:
        """How many field words a device masks: one per coordinate."""
        return self.size

    def clip_per_coordinate(self) -> npt.NDArray[np.float64]:
        return np.repeat(np.asarray(self.clips, np.float64), self.sizes)

    def encode(self, change: npt.NDArray[np.floating], rng: np.random.Generator) -> field.U64:
        """A device's flat change as field words."""
        if change.shape != (self.size,):
            raise ValueError(f"a change of shape {change.shape}; the grid covers {self.size} coordinates")
        return field.lift(field.quantise(change, self.clip_per_coordinate(), self.levels, rng), self.bits)

    def mean(self, total: field.U64, count: int) -> npt.NDArray[np.float64]:
        """The mean change of ``count`` devices whose words summed to ``total``."""
        if count < 1:
            raise ValueError("a mean of no device")
        return field.dequantise(field.signed(total, self.bits), self.clip_per_coordinate(), self.levels) / count


def grid_for(bits: int, clip_range: float, sizes: Sequence[int], devices: int, headroom: float = 1.0) -> Grid:
    """The coordinator's grid for a round of ``devices`` selected: every tensor clipped to ``clip_range``."""
    return Grid(bits, field.levels_for(bits, devices, headroom), tuple(float(clip_range) for _ in sizes),
                tuple(int(s) for s in sizes))


def rounding_rng(seed: int, round_number: int, client_index: int, attempt: int) -> np.random.Generator:
    """The generator of a device's stochastic rounding in one attempt of one round."""
    return np.random.default_rng([seed, round_number, client_index, attempt, 0x5EC])


def task_settings(grid: Grid | NoisyGrid, threshold: float, neighbours: int, graph_seed: int, attempt: int
                  ) -> dict[str, Any]:
    """A Task's ``sa`` map (wire format 3.4); under distributed noise with its ``dp`` map."""
    threshold_of(2, threshold)  # refuses a threshold outside (0.5, 1]
    common = {"threshold": threshold, "neighbours": neighbours, "seed": graph_seed, "attempt": attempt}
    if isinstance(grid, NoisyGrid):
        return {"bits": grid.bits, "levels": 0, "clip": [], **common,
                "dp": {"clip": grid.clip, "scale": grid.scale, "noise": grid.noise, "rotation": grid.rotation_seed,
                       "release": grid.release}}
    return {"bits": grid.bits, "levels": grid.levels, "clip": list(grid.clips), **common}


# The most levels a device rounds its values to itself: float32 carries k * (clip / L) so closely that the secure
# layer rounds it back to k but for a few values in a million (measured at 10 devices: none at 8 bits, 20 at 16, 422
# at 20; 7,118 at 24 bits, where L passes 2^16). Beyond it the secure layer's unbiased rounding is left alone.
DEVICE_ROUNDING_LEVELS = 1 << 16


def value_grid(settings: Mapping[str, Any] | None) -> tuple[float, float]:
    """A Task's grid as one value of a securely aggregated update meets it: the largest magnitude it keeps (the
    smallest clip range) and the grid's step (clip / L, when every tensor has the same clip range and L is at most
    ``DEVICE_ROUNDING_LEVELS``; else 0); (0, 0) when nothing clips coordinate by coordinate (no secure aggregation,
    or distributed noise's L2 clip)."""
    if not settings or settings.get("dp") is not None or not settings.get("clip"):
        return 0.0, 0.0
    clips, levels = [float(c) for c in settings["clip"]], int(settings.get("levels") or 0)
    step = clips[0] / levels if 0 < levels <= DEVICE_ROUNDING_LEVELS and len(set(clips)) == 1 else 0.0
    return min(clips), step


def grid_of(settings: Mapping[str, Any], sizes: Sequence[int]) -> Grid | NoisyGrid:
    """A device's reading of a Task's ``sa`` map over its own float tensors' sizes (checked: ``ValueError``): the
    grid, or under distributed noise (``dp``) the noisy grid."""
    threshold_of(2, float(settings["threshold"]))
    noise = settings.get("dp")
    if noise is not None:
        return NoisyGrid(int(settings["bits"]), sum(int(s) for s in sizes), float(noise["clip"]),
                         float(noise["scale"]), float(noise["noise"]), int(noise["rotation"]), int(noise["release"]))
    return Grid(int(settings["bits"]), int(settings["levels"]), tuple(float(c) for c in settings["clip"]),
                tuple(int(s) for s in sizes))


def setup_of(run_id: str, round_number: int, settings: Mapping[str, Any], size: int,
             support: npt.NDArray[np.int64] | None = None) -> Setup:
    """The round's ``Setup`` as both sides derive it from a Task's ``sa`` map: the keys' context binds the run, the
    round, the attempt and the support masked (None: all ``size`` coordinates)."""
    context = round_context(run_id, round_number, int(settings["attempt"]), support_digest(support, size))
    return Setup(context, int(settings["bits"]), size, float(settings["threshold"]), int(settings["neighbours"]),
                 int(settings["seed"]))
