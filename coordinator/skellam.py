"""The privacy accounting of distributed noise (``privacy.mode = "distributed"``; docs/privacy.md, "Distributed"):
the per-round Renyi-DP bound of the Skellam mechanism, summed over the rounds, converted to (epsilon, delta) by
dp-accounting.

A round's sum carries Skellam noise of variance at least ``variance`` per coordinate (integer units: each device adds
its share, and a round with fewer inputs than the shares assume is not released), and one device moves the sum by at
most ``l2`` in L2 norm and ``l1`` in L1 norm (its clipped change, rotated, scaled and conditionally rounded:
``secagg.distributed``). Agarwal, Kairouz and Liu (NeurIPS 2021, the multi-dimensional Skellam mechanism) bound its
RDP at integer orders alpha > 1 by

    alpha l2^2 / (2 variance) + min(((2 alpha - 1) l2^2 + 6 l1) / (4 variance^2), 3 l1 / (2 variance)),

the Gaussian mechanism's RDP plus a term that vanishes as the scale grows. dp-accounting has no event for it: this
bound is the one function written here; RDP composes by addition (every round's bound at every order, summed), and
``dp_accounting.rdp.compute_epsilon`` converts the sum to epsilon at delta. Rounds are accounted at q = 1: no
amplification by sampling is claimed. Knows no transport and no algorithm.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

ORDERS: tuple[int, ...] = tuple(range(2, 129)) + (160, 192, 256, 384, 512, 1024)


def skellam_rdp(order: int, l2: float, l1: float, variance: float) -> float:
    """The Skellam mechanism's RDP at integer ``order`` > 1 for sensitivities ``l2``, ``l1`` and noise
    ``variance`` per coordinate, all in integer units."""
    if order <= 1 or variance <= 0 or l2 < 0 or l1 < 0:
        raise ValueError("the Skellam bound needs an order above 1, a variance above 0 and sensitivities >= 0")
    return order * l2 ** 2 / (2 * variance) + min(((2 * order - 1) * l2 ** 2 + 6 * l1) / (4 * variance ** 2),
                                                   3 * l1 / (2 * variance))


@dataclass(frozen=True)
class SkellamRound:
    """One accounted round: its sensitivities and the noise variance its sum carries at least (integer units)."""

    l2: float
    l1: float
    variance: float

    def rdp(self) -> list[float]:
        return [skellam_rdp(order, self.l2, self.l1, self.variance) for order in ORDERS]


def total_rdp(rounds: Iterable[SkellamRound]) -> list[float]:
    """RDP composes by addition: the rounds' bounds summed, order by order."""
    total = [0.0] * len(ORDERS)
    for accounted in rounds:
        total = [a + b for a, b in zip(total, accounted.rdp(), strict=True)]
    return total


def epsilon_of(rdp: Sequence[float], delta: float) -> float:
    """Epsilon at ``delta`` of an RDP curve over ``ORDERS`` (dp-accounting's conversion); 0 for no round."""
    if not any(rdp):
        return 0.0
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    epsilon, _ = compute_epsilon(ORDERS, list(rdp), delta)
    return float(epsilon) if math.isfinite(epsilon) else math.inf
