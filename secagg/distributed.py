"""Distributed noise under secure aggregation (``privacy.mode = "distributed"``; docs/privacy.md, "Distributed"): a
device's change as noisy field words, and the survivors' summed words as their noisy mean change.

A device (``NoisyGrid.encode``) clips its flat change x (d coordinates) to L2 norm ``clip``, pads it to D = 2^m >= d,
rotates it (a randomised Hadamard transform: signs drawn from the round's public seed, then the orthonormal
Walsh-Hadamard transform, so the norm is kept and the mass is spread evenly over the coordinates), scales it by
``scale`` and rounds it stochastically to integers, drawing again until the rounded vector's L2 norm is at most
``sensitivity()`` (conditional rounding with ``beta``: the bound the accountant uses, whatever the rounding drew).
Then it adds Skellam noise, Poisson(noise / 2) - Poisson(noise / 2) per coordinate, of variance ``noise``: each
device adds the central variance divided by the inputs a release needs, so the devices a round cannot release
without carry the whole of it between them; a sum of Skellam variables is a Skellam variable. The words are the
integers modulo 2^bits. The coordinator (``mean``) reads the unmasked sum back signed, divides by ``scale``,
rotates back, keeps the first d coordinates and divides by the count: the mean of the clipped changes plus the
noise, never without it.

The sensitivity bound is that of Kairouz et al. 2021 (the distributed discrete Gaussian, Theorem 15 on conditional
rounding), as the Skellam paper (Agarwal et al. 2021) uses it; ``wrap_scale`` is the largest scale whose sum stays
inside the field with probability at least 1 - 10^-6 per coordinate (a sub-Gaussian tail bound, with every device's
change pointing the same way). Pure numpy; nothing of Fedge beyond this package.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fedge.secagg import field

BETA = math.exp(-0.5)  # conditional rounding: a draw is kept with probability at least 1 - beta
# The largest per-device noise variance: numpy draws Poisson(lambda) in double precision, and above 2^53 its draws
# come in steps of a power of two (the low bits of the sum would carry no noise); 2^41 keeps lambda at 2^40.
MAX_NOISE = 2.0 ** 41
WRAP_PROBABILITY = 1e-6
ROUNDING_TRIES = 64


def padded_size(size: int) -> int:
    """D: the smallest power of two at least ``size`` (1 for an empty vector)."""
    return 1 << max(0, (int(size) - 1).bit_length())


def hadamard(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The orthonormal Walsh-Hadamard transform of a vector of a power-of-two length (its own inverse)."""
    size = values.size
    if size & (size - 1):
        raise ValueError(f"a Hadamard transform of {size} values (not a power of two)")
    out = np.array(values, dtype=np.float64)
    width = 1
    while width < size:
        pairs = out.reshape(-1, 2, width)
        out = np.concatenate((pairs[:, 0] + pairs[:, 1], pairs[:, 0] - pairs[:, 1]), axis=1).reshape(-1)
        width *= 2
    return out / math.sqrt(size)


def rounded_l2_bound(norm: float, dimension: int, beta: float = BETA) -> float:
    """The L2 norm a vector of norm ``norm`` keeps after conditional stochastic rounding to integers in
    ``dimension`` coordinates (Kairouz et al. 2021, Theorem 15; beta = 0: the unconditional norm + sqrt(D))."""
    plain = norm + math.sqrt(dimension)
    if beta <= 0:
        return plain
    squared = norm ** 2 + dimension / 4 + math.sqrt(2 * math.log(1 / beta)) * (norm + math.sqrt(dimension) / 2)
    return min(plain, math.sqrt(squared))


def rounded_l1_bound(l2_bound: float, dimension: int) -> float:
    """An integer vector's L1 norm from its L2 bound: at most sqrt(D) times it, and at most its square."""
    return l2_bound * min(math.sqrt(dimension), l2_bound)


def wrap_scale(bits: int, clip: float, dimension: int, devices: int, multiplier: float, release: int) -> float:
    """The largest scale at which the sum of ``devices`` inputs exceeds half the field with probability at most
    ``WRAP_PROBABILITY`` per coordinate; 0 when no scale does. Each input is a vector of L2 norm ``clip`` rotated
    into ``dimension`` coordinates (every device's pointing the same way: at most devices clip / sqrt(D) per
    coordinate, sub-Gaussian), rounded (spread at most 1/2 each) and noised with variance (scale multiplier clip)^2 /
    ``release`` (the central noise shared among the inputs a release needs)."""
    tail = math.sqrt(2 * math.log(2 / WRAP_PROBABILITY))  # sub-Gaussian: P(|X| > tail sigma) <= WRAP_PROBABILITY
    room = (1 << (bits - 1)) / tail - math.sqrt(devices) / 2
    per_scale = devices * clip / math.sqrt(dimension) + math.sqrt(devices / release) * multiplier * clip
    return max(0.0, room / per_scale)


def skellam(variance: float, size: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """Skellam noise of ``variance`` per coordinate: the difference of two Poisson(variance / 2) draws."""
    half = variance / 2
    return rng.poisson(half, size).astype(np.int64) - rng.poisson(half, size).astype(np.int64)


def device_noise_rng() -> np.random.Generator:
    """A device's noise generator, seeded from the operating system's entropy: nobody can redraw its noise."""
    return np.random.default_rng(secrets.randbits(128))


@dataclass(frozen=True)
class NoisyGrid:
    """A round's distributed-noise encoding: the field's width, the coordinates, the L2 clip, the scale, each
    device's noise variance (integer units), the rotation's public seed, and the fewest inputs whose sum may be
    unmasked (each device's noise is that count's share of the central noise: a device refuses to help unmask a sum
    of fewer, ``secure_device``)."""

    bits: int
    size: int
    clip: float
    scale: float
    noise: float
    rotation_seed: int
    release: int = 1
    beta: float = BETA

    def __post_init__(self) -> None:
        field.check_bits(self.bits)
        numbers = (self.clip, self.scale, self.noise, self.beta)
        if self.size < 1 or not all(math.isfinite(v) for v in numbers) or self.clip <= 0 or self.scale <= 0 or \
                self.noise < 0 or not 0 <= self.beta < 1 or self.release < 1:
            raise ValueError("a noisy grid needs coordinates, a clip and a scale above 0, a noise variance >= 0, "
                             "beta in [0, 1) and a release of at least one input")
        if self.noise > MAX_NOISE:
            raise ValueError(f"a noise variance of {self.noise:.3g} per device: above {MAX_NOISE:.3g} the Poisson "
                             "draws lose their low bits")

    @property
    def padded(self) -> int:
        return padded_size(self.size)

    @property
    def words(self) -> int:
        """How many field words a device masks: the rotated, padded vector's D."""
        return self.padded

    def signs(self) -> npt.NDArray[np.float64]:
        rng = np.random.default_rng([self.rotation_seed, 0xDD9])
        return rng.integers(0, 2, self.padded).astype(np.float64) * 2 - 1

    def rotate(self, values: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
        padded = np.zeros(self.padded, np.float64)
        padded[:self.size] = values
        return hadamard(padded * self.signs())

    def unrotate(self, rotated: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
        return (hadamard(np.asarray(rotated, np.float64)) * self.signs())[:self.size]

    def sensitivity(self) -> float:
        """The L2 bound of one device's rounded input, integer units: what one device can move the sum by."""
        return rounded_l2_bound(self.scale * self.clip, self.padded, self.beta)

    def integers(self, change: npt.NDArray[np.floating], rng: np.random.Generator) -> npt.NDArray[np.int64]:
        """A device's change clipped, rotated, scaled and rounded (conditionally: within ``sensitivity``)."""
        if change.shape != (self.size,):
            raise ValueError(f"a change of shape {change.shape}; the grid covers {self.size} coordinates")
        values = np.asarray(change, np.float64)
        norm = float(np.linalg.norm(values))
        if norm > self.clip:
            values = values * (self.clip / norm)
        scaled = self.rotate(values) * self.scale
        floor = np.floor(scaled)
        bound = self.sensitivity()
        for _ in range(ROUNDING_TRIES):
            rounded = (floor + (rng.random(scaled.size) < scaled - floor)).astype(np.int64)
            if float(np.linalg.norm(rounded.astype(np.float64))) <= bound:
                return rounded
        raise ValueError(f"no rounding within the sensitivity bound in {ROUNDING_TRIES} draws")

    def encode(self, change: npt.NDArray[np.floating], rng: np.random.Generator,
               noise_rng: np.random.Generator | None = None) -> field.U64:
        """A device's field words: its rounded input plus its Skellam noise (from ``noise_rng``, by default the
        operating system's entropy), modulo 2^bits."""
        noisy = self.integers(change, rng) + skellam(self.noise, self.padded, noise_rng or device_noise_rng())
        return field.lift(noisy, self.bits)

    def mean(self, total: field.U64, count: int) -> npt.NDArray[np.float64]:
        """The noisy mean change of ``count`` devices whose words summed to ``total``."""
        if count < 1:
            raise ValueError("a mean of no device")
        return self.unrotate(field.signed(total, self.bits) / self.scale) / count
