"""What distributed noise (``privacy.mode = "distributed"``) costs in epsilon, against central DP at the same noise
multiplier, how often its sums wrap, and how long a device takes to encode.

    python benchmarks/distributed_noise.py
    python benchmarks/distributed_noise.py --write docs/results/distributed-noise.md

1. Epsilon after ``--rounds`` rounds at delta 1e-5, for the paper CNN's 688,138 float parameters (D = 2^20 after
   padding), 10 devices a round released with at least 7 inputs (a complete graph of 10 at threshold 0.6): the
   Skellam accountant at 16, 20 and 32 bits (the scale each width allows), the Gaussian mechanism at q = 1 (what the
   Skellam bound tends to), and central DP's Poisson-sampled Gaussian at q = 0.1 (10 of 100 devices a round), as
   ``coordinator.privacy.epsilon_of`` accounts it.
2. Wraps: ``--wrap-rounds`` rounds of 10 devices whose clipped changes all point the same way (the worst case), over
   65,536 coordinates at 16 bits and the scale ``wrap_scale`` chooses; the sums' integers before reduction, counted
   beyond half the field.
3. A device's encoding time (clip, rotation, conditional rounding, Skellam noise) for the paper CNN, on this machine.
"""

from __future__ import annotations

import argparse
import math
import platform
import time
from pathlib import Path

import numpy as np
from _results import append_section

from fedge.coordinator.privacy import epsilon_of as central_epsilon
from fedge.coordinator.skellam import SkellamRound, epsilon_of, total_rdp
from fedge.secagg.distributed import NoisyGrid, padded_size, rounded_l1_bound, skellam, wrap_scale

PARAMETERS = 688_138
DEVICES, RELEASE, POPULATION = 10, 7, 100
DELTA = 1e-5


def distributed_epsilon(bits: int, multiplier: float, rounds: int) -> tuple[float, float]:
    dimension = padded_size(PARAMETERS)
    scale = wrap_scale(bits, 1.0, dimension, DEVICES, multiplier, RELEASE)
    grid = NoisyGrid(bits, PARAMETERS, 1.0, scale, (scale * multiplier) ** 2 / RELEASE, 0, RELEASE)
    l2 = grid.sensitivity()
    accounted = SkellamRound(l2, rounded_l1_bound(l2, dimension), grid.noise * RELEASE)
    return epsilon_of(total_rdp([accounted] * rounds), DELTA), scale


def wraps(rounds: int, rng: np.random.Generator) -> tuple[int, int]:
    bits, size, multiplier = 16, 65_536, 1.0
    scale = wrap_scale(bits, 1.0, size, DEVICES, multiplier, RELEASE)
    grid = NoisyGrid(bits, size, 1.0, scale, (scale * multiplier) ** 2 / RELEASE, 1, RELEASE)
    change = np.full(size, 1.0 / math.sqrt(size))
    count = 0
    for _ in range(rounds):
        total = sum(grid.integers(change, rng) + skellam(grid.noise, grid.padded, rng) for _ in range(DEVICES))
        count += int((np.abs(total) >= 1 << (bits - 1)).sum())
    return count, rounds * size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--wrap-rounds", type=int, default=100)
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    lines = [f"Epsilon at delta {DELTA:g} after {args.rounds} rounds: the paper CNN ({PARAMETERS:,} parameters), "
             f"{DEVICES} devices a round released with at least {RELEASE} inputs, clip 1:", "",
             "| noise multiplier | distributed, 16 bits | 20 bits | 32 bits | Gaussian, q = 1 | central, Poisson q = 0.1 "
             "(10 of 100) | distributed 32 bits / central |", "|---|---|---|---|---|---|---|"]
    for multiplier in (0.5, 1.0, 2.0):
        distributed = [distributed_epsilon(bits, multiplier, args.rounds) for bits in (16, 20, 32)]
        gaussian = central_epsilon("poisson", 1, 1.0, multiplier, args.rounds, DELTA, "rdp")
        central = central_epsilon("poisson", POPULATION, DEVICES, multiplier, args.rounds, DELTA, "rdp")
        cells = " | ".join(f"{e:.3g} (scale {s:.3g})" for e, s in distributed)
        lines.append(f"| {multiplier} | {cells} | {gaussian:.3g} | {central:.3g} | {distributed[2][0] / central:.1f} |")
    rng = np.random.default_rng(0)
    count, total = wraps(args.wrap_rounds, rng)
    lines += ["", f"Wraps at 16 bits, {DEVICES} aligned devices, noise multiplier 1, the scale wrap_scale chooses: "
                  f"{count} of {total:,} coordinate sums (the bound: at most {total * 1e-6:.1f} expected)."]
    grid = NoisyGrid(16, PARAMETERS, 1.0, 100.0, 50.0, 2, RELEASE)
    change = rng.normal(0, 1e-3, PARAMETERS)
    started = time.perf_counter()
    for _ in range(3):
        grid.encode(change, rng)
    lines += ["", f"A device's encoding of the paper CNN's change (clip, rotation into 2^20, rounding, noise): "
                  f"{(time.perf_counter() - started) / 3:.2f} s on this machine ({platform.machine()}, one core)."]
    table = "\n".join(lines)
    print(table)
    if args.write is not None:
        append_section(args.write, "distributed_noise.py", "Distributed noise: measured",
                       "[privacy.md](../privacy.md), \"Distributed\",", table)

if __name__ == "__main__":
    main()
