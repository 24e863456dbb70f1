"""Who shares with whom: the round's neighbour graph and the threshold of each neighbourhood.

Up to ``complete_up_to`` devices (``secagg.neighbours``), and whenever the ring below would join every device to
every other anyway, every device is every other's neighbour. Above it, the graph is a Harary graph over a seeded
random order of the devices (Bell et al. 2020; the order of SHA-256(seed, device), the same on every numpy): each
device is joined to the ``half`` devices on either side of it in that ring, with ``half`` = ceil(log2 n) + 1, so a
degree of 2 ceil(log2 n) + 2; the graph is symmetric and every device has the same degree. The order comes from the
round's public seed, so every party computes the same graph. A device's shares go to its neighbours, and any
``threshold_of(k)`` of them rebuild its secrets: t = ceil(threshold * k) of its k neighbours, with a threshold above
one half and t above k / 2 in every case (so two disjoint groups of neighbours can never both rebuild them). Pure:
nothing of Fedge.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence

MIN_DEVICES = 3  # a sum of two inputs would give each device the other's


def neighbourhoods(devices: Sequence[str], complete_up_to: int, seed: int) -> dict[str, tuple[str, ...]]:
    """Each device's neighbours (itself excluded), in roster order."""
    roster = sorted(devices)
    if len(set(roster)) != len(roster):
        raise ValueError("a device appears twice in the round's roster")
    n = len(roster)
    half = math.ceil(math.log2(max(n, 2))) + 1
    if n <= complete_up_to or 2 * half >= n - 1:  # the ring would join every device to every other anyway
        return {device: tuple(other for other in roster if other != device) for device in roster}
    ring = sorted(roster, key=lambda device: hashlib.sha256(struct.pack(">Q", seed) + device.encode()).digest())
    place = {device: at for at, device in enumerate(ring)}
    joined: dict[str, set[str]] = {device: set() for device in roster}
    for device in roster:
        for step in range(1, half + 1):
            other = ring[(place[device] + step) % n]
            joined[device].add(other)
            joined[other].add(device)
    return {device: tuple(sorted(joined[device])) for device in roster}


def threshold_of(neighbours: int, threshold: float) -> int:
    """t = ceil(threshold * k) for a neighbourhood of k devices."""
    if not 0.5 < threshold <= 1.0:
        raise ValueError(f"secagg.threshold = {threshold}: it must lie in (0.5, 1]")
    return max(neighbours // 2 + 1, math.ceil(threshold * neighbours - 1e-12))  # 2t > k, always
