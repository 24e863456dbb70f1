"""Distributed noise in a session (``privacy.mode = "distributed"``; docs/privacy.md, "Distributed"): each round's
noisy grid, and the accounting of the rounds whose noisy sum the coordinator learned.

``SessionNoise.grid`` chooses a round's ``secagg.distributed.NoisyGrid``: the L2 clip ``privacy.clip``, the largest
scale whose sum stays inside the field (``wrap_scale``, for the devices selected; no larger than keeps each device's
noise variance within ``MAX_NOISE``), and each device's share of the
central variance (scale z clip)^2, divided among the inputs the round needs before it is released less the
``privacy.tolerate_colluders`` devices that may collude with the coordinator and subtract their own shares (each
device adds sigma^2 / (r - c); the accountant counts only the r - c honest shares). ``account``
writes the round's line to privacy.jsonl (fsynced) before the noisy mean is kept or folded: its sensitivities and
variance, from which ``coordinator.skellam`` bounds its RDP; epsilon is that of every line so far, so a round redone
after a crash is accounted again and epsilon never decreases. With ``privacy.max_epsilon`` a round whose grid would
take epsilon past it is never opened (``BudgetSpent``): it is known, and checked, before any device is asked for
anything, since its accounting depends on its grid alone. Knows no transport and no algorithm.
"""

from __future__ import annotations

import logging
import math
import secrets
from typing import Any

from fedge.coordinator.rundir import RunDir
from fedge.coordinator.sections import PrivacySection
from fedge.coordinator.skellam import ORDERS, SkellamRound, epsilon_of, total_rdp
from fedge.secagg.distributed import MAX_NOISE, NoisyGrid, padded_size, rounded_l1_bound, wrap_scale

log = logging.getLogger("fedge.coordinator")

RELEASE_LOG = "privacy.jsonl"


class BudgetSpent(Exception):
    """The next round's release would take epsilon past ``privacy.max_epsilon``: the session ends before it."""


class SessionNoise:
    """See the module docstring."""

    def __init__(self, settings: PrivacySection, population: int, run_dir: RunDir) -> None:
        self.multiplier, self.clip, self.max_epsilon = settings.noise_multiplier, settings.clip, settings.max_epsilon
        self.colluders = settings.tolerate_colluders
        self.delta = settings.delta or min(1e-5, 0.1 / max(population, 1))
        self.run_dir = run_dir
        self.rounds = [SkellamRound(float(line["l2"]), float(line["l1"]), float(line["variance"]))
                       for line in run_dir.read_jsonl(RELEASE_LOG)]
        self.epsilon = epsilon_of(total_rdp(self.rounds), self.delta)

    def grid(self, bits: int, size: int, devices: int, release: int) -> NoisyGrid:
        """A round's noisy grid over ``size`` coordinates for ``devices`` selected, released only with at least
        ``release`` inputs (ValueError when the field cannot hold their sum at any scale)."""
        honest = release - self.colluders  # the inputs whose noise no colluder can subtract
        if honest < 1:
            raise BudgetSpent(f"privacy.tolerate_colluders = {self.colluders}: this round's sum is released with "
                              f"{release} inputs, so colluders could subtract every device's noise; stopping (fewer "
                              "colluders, or more devices a round)")
        scale = min(wrap_scale(bits, self.clip, padded_size(size), devices, self.multiplier, honest),
                    math.sqrt(MAX_NOISE * honest) / (self.multiplier * self.clip))  # wider fields buy nothing more
        if scale <= 0:
            raise ValueError(f"secagg.bits = {bits} cannot hold the noisy sum of {devices} devices")
        variance = (scale * self.multiplier * self.clip) ** 2
        grid = NoisyGrid(bits, size, self.clip, scale, variance / honest, secrets.randbits(62), release)
        if self.max_epsilon > 0:
            after = epsilon_of(total_rdp([*self.rounds, accounted(grid, self.colluders)]), self.delta)
            if after > self.max_epsilon:
                raise BudgetSpent(f"privacy: the next round would take epsilon past privacy.max_epsilon = "
                                  f"{self.max_epsilon:g} (now {self.epsilon:.4g}, {after:.4g} after it); stopping")
        return grid

    def account(self, number: int, grid: NoisyGrid) -> dict[str, Any]:
        """Round ``number``'s noisy sum is about to be learned: its line in the release log, fsynced, first.
        Returns metrics.jsonl's privacy fields."""
        line = accounted(grid, self.colluders)
        self.rounds.append(line)
        self.epsilon = epsilon_of(total_rdp(self.rounds), self.delta)
        noise_std = (line.variance ** 0.5) / grid.scale
        self.run_dir.append_jsonl(RELEASE_LOG, {
            "round": number, "accounted": len(self.rounds), "epsilon": self.epsilon, "delta": self.delta,
            "l2": line.l2, "l1": line.l1, "variance": line.variance, "scale": grid.scale,
            "dimension": grid.padded, "release": grid.release, "colluders": self.colluders, "clip": grid.clip,
            "noise_std": noise_std},
            durable=True)
        return {"epsilon": self.epsilon, "clip": grid.clip, "noise_std": noise_std, "dp_released": True}

    def status(self) -> dict[str, Any]:
        """status.json's ``privacy``."""
        return {"mode": "distributed", "epsilon": self.epsilon, "delta": self.delta, "accountant": "rdp (Skellam)",
                "sampling": "no", "rounds": len(self.rounds), "clip": self.clip,
                "max_epsilon": self.max_epsilon or None}

    def report(self) -> dict[str, Any]:
        """report.json's ``privacy``: with privacy.jsonl's lines, every figure epsilon is computed from."""
        return {"mode": "distributed", "mechanism": "Skellam (Agarwal et al. 2021), summed under secure aggregation",
                "epsilon": self.epsilon, "delta": self.delta, "accountant": "rdp", "orders": [ORDERS[0], ORDERS[-1]],
                "sampling": "none (q = 1)", "noise_multiplier": self.multiplier, "clip": self.clip,
                "tolerate_colluders": self.colluders,
                "rounds": len(self.rounds), "max_epsilon": self.max_epsilon}


def accounted(grid: NoisyGrid, colluders: int = 0) -> SkellamRound:
    """What a round released on ``grid`` is accounted as: its rounded sensitivities and the variance of the noise
    carried by its release minimum of inputs less the ``colluders`` (who may subtract their own shares)."""
    l2 = grid.sensitivity()
    return SkellamRound(l2, rounded_l1_bound(l2, grid.padded), grid.noise * (grid.release - colluders))
