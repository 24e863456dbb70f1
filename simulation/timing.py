"""How long a task takes on the simulated clock: seeded, per-device speeds and per-task jitter, as pure functions.

A task of ``steps`` local steps on client i lasts steps * step_s / speed_i * jitter_t (+ its packets' bytes /
bandwidth_bps when a bandwidth is set), in simulated seconds:

- speed_i: ``speeds = "lognormal"``: LogNormal(0, speed_sigma), drawn from (seed, client) alone, so a device is as
  fast in every run of the seed and in every variant compared; ``"equal"``: 1 for every device;
- jitter_t: LogNormal(0, jitter_sigma), drawn from (seed, task id) alone.

Nothing here reads a clock or keeps state, so a run that is resumed, or replayed on another backend, draws the same
durations. ``SimulatedClock`` is the time a simulated fleet and its session share (``fleet.clock = "simulated"``): it
moves only when told to. No torch, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SPEED_SALT = 0x5BEED   # keeps the speeds' stream apart from every other use of the run's seed
JITTER_SALT = 0x717E2
SPEED_MODELS = ("lognormal", "equal")


@dataclass(frozen=True)
class DeviceTiming:
    step_s: float = 0.05
    speeds: str = "lognormal"
    speed_sigma: float = 1.0
    jitter_sigma: float = 0.1
    bandwidth_bps: float = 0.0  # 0: transfers take no simulated time
    seed: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.step_s) and self.step_s > 0):
            raise ValueError("the simulated step time (step_s) must be > 0")
        if self.speeds not in SPEED_MODELS:
            raise ValueError(f"speeds must be one of {', '.join(SPEED_MODELS)}, got {self.speeds!r}")
        if self.speed_sigma < 0 or self.jitter_sigma < 0 or self.bandwidth_bps < 0:
            raise ValueError("speed_sigma, jitter_sigma and bandwidth_bps must be >= 0")

    def speed(self, client: int) -> float:
        """Client ``client``'s speed (1: takes step_s a step)."""
        if self.speeds == "equal" or self.speed_sigma == 0:
            return 1.0
        return float(np.random.default_rng([self.seed, client, SPEED_SALT]).lognormal(0.0, self.speed_sigma))

    def jitter(self, task_id: int) -> float:
        if self.jitter_sigma == 0:
            return 1.0
        return float(np.random.default_rng([self.seed, task_id, JITTER_SALT]).lognormal(0.0, self.jitter_sigma))

    def duration(self, client: int, task_id: int, steps: int, nbytes: int = 0) -> float:
        """Simulated seconds from a task's dispatch to its update's arrival."""
        compute = steps * self.step_s / self.speed(client) * self.jitter(task_id)
        return compute + (nbytes * 8 / self.bandwidth_bps if self.bandwidth_bps > 0 else 0.0)


class SimulatedClock:
    """Simulated seconds since the session began: ``clock()`` reads it; only the fleet moves it, forward."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance_to(self, when: float) -> None:
        self.now = max(self.now, when)

    def advance(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)
