"""Client-level differential privacy on the one aggregation path: DP-FedAvg (McMahan et al. 2018) with fixed or
adaptive clipping (Andrew et al. 2021), as a round applies it. docs/privacy.md states the guarantee.

- ``Mechanism``: a session's settings as the rounds use them: the noise multiplier z of the values, the sampling
  (Poisson: add-or-remove neighbours, the values' sensitivity is C and the centred clip bits' 1/2; a fixed-size
  draw: replace-one, 2C and 1), the fixed denominator (the expected cohort), and adaptive clipping's quantile,
  learning rate and bit noise.
- ``PrivateRound``: one round's private sum. Each update's change (every update group's float values in its shared
  form, ``ServerHalf.shared_form``: the same coordinates for every device) is clipped as one vector to the round's
  clip C_t and added to an exact sum (order-independent, ``protocol.exact_sum``); ``release`` adds Gaussian noise of
  std z * s * C_t to every coordinate of that sum, divides by the expected cohort, and updates the clip from the
  noisy count of unclipped updates: C_{t+1} = C_t exp(-eta (b - gamma)). Round t's noise uses C_t, never C_{t+1}.
- ``fresh_generator``: the generator of one round's noise or of its draw, new from OS entropy each time (never
  from the session seed, which every device receives); nothing of it is kept, so no file gives a round's noise back.
- ``poisson_draw`` and ``fixed_draw``: the cohort, drawn from the whole population, whoever is online.

Pure: numpy and the codec's tensor groups; the accountant (``dp-accounting``) lives in ``coordinator.privacy``.
No clock, no file, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedge.protocol.exact_sum import ExactSum
from fedge.protocol.validation import Unfoldable

SAMPLINGS = ("poisson", "without-replacement")


@dataclass(frozen=True)
class Mechanism:
    """What every private round applies (validated by the coordinator's configuration)."""

    noise_multiplier: float   # z: the values' noise std in units of their sensitivity
    denominator: float        # the fixed divisor of the noisy sum: the expected cohort (q N, or the fixed size)
    sampling: str = "poisson"
    adaptive: bool = False
    target_quantile: float = 0.5
    clip_lr: float = 0.2
    bits_noise: float = 0.0   # sigma_b: the std of the noise on the (centred) sum of the clip bits

    def __post_init__(self) -> None:
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
        if not self.denominator > 0 or self.noise_multiplier < 0:
            raise ValueError("the denominator must be > 0 and the noise multiplier >= 0")

    @property
    def sensitivity(self) -> float:
        """The values' L2 sensitivity in units of the clip: C under add-or-remove, 2C under replace-one."""
        return 1.0 if self.sampling == "poisson" else 2.0

    @property
    def bits_sensitivity(self) -> float:
        """The sensitivity of the clip bits' sum: 1/2 for centred bits under add-or-remove, 1 under replace-one."""
        return 0.5 if self.sampling == "poisson" else 1.0

    def noise_std(self, clip: float) -> float:
        """The std of the Gaussian noise added to every coordinate of the sum of updates clipped to ``clip``."""
        return self.noise_multiplier * self.sensitivity * clip

    @property
    def bits_multiplier(self) -> float:
        """z_b: the bits' noise in units of their sensitivity (infinite when they carry no information: fixed clip)."""
        return self.bits_noise / self.bits_sensitivity if self.adaptive else math.inf

    @property
    def effective_multiplier(self) -> float:
        """The one Gaussian equivalent to the values' and the bits' together: (z^-2 + z_b^-2)^-1/2."""
        return effective_multiplier(self.noise_multiplier, self.bits_multiplier)

    def next_clip(self, clip: float, unclipped: float, reporters: int, noise: float) -> float:
        """Adaptive clipping's step: the estimated fraction of updates that were not clipped,
        b = (sum_i (b_i - 1/2) + noise) / denominator + 1/2, clamped to [0, 1] as TFF's estimator is (the noise
        can take it outside), moves the clip geometrically towards the target
        quantile: C exp(-eta (b - gamma)). ``unclipped``: the number of unclipped updates among ``reporters``;
        ``noise``: one draw of N(0, sigma_b^2)."""
        if not self.adaptive:
            return clip
        estimate = min(1.0, max(0.0, (unclipped - reporters / 2 + noise) / self.denominator + 0.5))  # a fraction
        return clip * math.exp(-self.clip_lr * (estimate - self.target_quantile))


def effective_multiplier(values: float, bits: float) -> float:
    """(z^-2 + z_b^-2)^-1/2; z_b infinite (no bits) gives z."""
    if values <= 0:
        return 0.0
    return 1.0 / math.sqrt(values ** -2 + (0.0 if math.isinf(bits) else bits ** -2))


def values_multiplier(effective: float, bits: float) -> float:
    """The values' z that, with bits of multiplier z_b, makes ``effective`` (the inverse of
    ``effective_multiplier``); ValueError when the bits alone already cost more than ``effective`` allows."""
    if math.isinf(bits):
        return effective
    rest = effective ** -2 - bits ** -2
    if rest <= 0:
        raise ValueError(f"the clip bits' noise (z_b = {bits:.4g}) leaves no budget for the values at an effective "
                         f"noise multiplier of {effective:.4g}: raise privacy.clip_bits_noise")
    return 1.0 / math.sqrt(rest)


@dataclass(frozen=True)
class Clipped:
    """What the private sum did to one update: its raw norm, the scale that put it within the clip, and its clip
    bit (True: neither the device nor the coordinator had to clip it)."""

    client_id: str
    index: int
    norm: float
    scale: float
    unclipped: bool

    def record(self) -> dict[str, Any]:
        """clients.jsonl's fields of the private sum (operator records, not released)."""
        return {"dp_norm": round(self.norm, 6), "dp_scale": round(self.scale, 6), "dp_unclipped": self.unclipped}


@dataclass(frozen=True)
class Release:
    """One released round: each group's noisy mean change, the clip that bounded it, the noise std added to the
    sum, the number of updates in it, and the clip the next round uses."""

    changes: Mapping[str, np.ndarray]
    clip: float
    noise_std: float
    reporters: int
    next_clip: float


def fresh_generator() -> np.random.Generator:
    """A new generator (PCG64) seeded from OS entropy: each draw and each release takes one, so that no state from
    which a released round's noise or cohort could be regenerated is ever kept, checkpointed or fingerprinted."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence()))


def poisson_draw(population: int, rate: float, rng: np.random.Generator) -> list[int]:
    """Each of the population's client indices independently with probability ``rate``."""
    return [int(i) for i in np.flatnonzero(rng.random(population) < rate)]


def fixed_draw(population: int, size: int, rng: np.random.Generator) -> list[int]:
    """``size`` of the population's client indices, without replacement."""
    return sorted(int(i) for i in rng.choice(population, size=min(size, population), replace=False))


class PrivateRound:
    """One round's private sum (see the module docstring): ``add`` each update's change rows, then ``release``."""

    def __init__(self, mechanism: Mechanism, clip: float, rng: np.random.Generator) -> None:
        if not clip > 0:
            raise ValueError(f"the clip must be > 0, got {clip}")
        self.mechanism = mechanism
        self.clip = clip
        self.rng = rng
        self.sums: dict[str, ExactSum] = {}
        self.clipped: list[Clipped] = []

    @property
    def reporters(self) -> int:
        return len(self.clipped)

    def add(self, client_id: str, index: int, rows: Mapping[str, np.ndarray], device_scale: float = 1.0) -> Clipped:
        """One update's change, by group (flat float vectors, the same sizes for every update of the round),
        clipped as one vector to the round's clip and added to the sum: all of it, or (``Unfoldable``: its groups or
        sizes are not the round's) nothing."""
        if self.sums and set(rows) != set(self.sums):
            raise Unfoldable(f"update of {client_id}: groups {sorted(rows)}, the round's sum has {sorted(self.sums)}")
        for name, row in rows.items():
            if name in self.sums and self.sums[name].size != row.size:
                raise Unfoldable(f"update of {client_id}: group {name!r} has {row.size} values, the round's sum "
                                 f"{self.sums[name].size}")
        norm = math.sqrt(sum(float(np.dot(row, row)) for row in rows.values()))
        scale = 1.0 if norm <= self.clip else self.clip / norm
        for name, row in rows.items():
            total = self.sums.get(name)
            if total is None:
                total = self.sums[name] = ExactSum(row.size)
            total.add(np.multiply(row, scale, dtype=np.float64), owned=True)
        record = Clipped(client_id, index, norm, scale, unclipped=scale >= 1.0 and device_scale >= 1.0)
        self.clipped.append(record)
        return record

    def release(self) -> Release | None:
        """The noisy mean change of every group: (sum + N(0, (z s C_t)^2) on every coordinate) / denominator; and
        the next round's clip, from the noisy count of unclipped updates. None, and nothing drawn, when
        no update was added (there is no layout to release a change on)."""
        if not self.reporters:
            return None
        mechanism, rng = self.mechanism, self.rng
        std = mechanism.noise_std(self.clip)
        changes = {}
        for name in sorted(self.sums):
            total = self.sums[name].value()
            total += rng.normal(0.0, std, size=total.size) if std > 0 else 0.0
            changes[name] = (total / mechanism.denominator).astype(np.float32)
        bits_noise = float(rng.normal(0.0, mechanism.bits_noise)) if mechanism.adaptive and \
            mechanism.bits_noise > 0 else 0.0
        unclipped = sum(1 for record in self.clipped if record.unclipped)
        following = mechanism.next_clip(self.clip, unclipped, self.reporters, bits_noise)
        return Release(changes, self.clip, std, self.reporters, following)
