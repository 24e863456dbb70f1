"""Who trains a round: the runtime's seeded selection, uniform or weighted by each agent's measured round time.

``choose`` is a pure function of the live clients, how many to take, a seeded generator, the policy and the agents'
measured round times. ``uniform`` (the default) draws ``count`` clients without replacement, each equally likely:
the same sets for the same seed and round, whatever the timing, so resumed and simulated runs select as the
original did. ``latency`` (opt-in, ``round.policy``) prefers clients that will finish: a client whose measured round
time is at most the median of those measured weighs 1, a slower one median / time (so one ten times slower is
drawn a tenth as often), one never measured weighs 1 (it gets its chance), and one slower than the deadline weighs
nothing unless too few others are left. A client cancelled when its round closed (``round.target``) has no
measured time, only a bound: ``censored`` doubles its estimate from at least the time it was given, up to the
deadline, so a board that is cancelled again and again is drawn less and less often, and one update it then
delivers brings its estimate back towards its real time. It depends on timing, so the bit-for-bit claims hold
with it off. No I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

POLICIES = ("uniform", "latency")


def latency_weights(available: Sequence[int], round_times: Mapping[int, float | None],
                    deadline_s: float) -> np.ndarray:
    """The ``latency`` policy's weight of each available client (see the module's docstring)."""
    known = [t for i in available if (t := round_times.get(i)) is not None]
    median = float(np.median(known)) if known else 0.0
    weights = np.ones(len(available), dtype=np.float64)
    for position, index in enumerate(available):
        took = round_times.get(index)
        if took is None or took <= median:
            continue
        weights[position] = 0.0 if took > deadline_s else median / took
    return weights


def selection_count(available: int, fraction: float, count: int, min_clients: int) -> int:
    """How many of ``available`` clients a round selects: ``round.count``, else ``ceil(round.fraction x
    available)``; at least ``round.min_clients``, at most every one."""
    wanted = count if count > 0 else math.ceil(fraction * available)
    return min(available, max(wanted, min_clients))


def measured(estimate: float | None, took: float) -> float:
    """A client's round-time estimate after an update that took ``took`` seconds (task sent to update received)."""
    return took if estimate is None else 0.5 * (estimate + took)


def censored(estimate: float | None, waited: float, deadline_s: float) -> float:
    """A client's round-time estimate after it was cancelled ``waited`` seconds into a round it had not finished:
    twice the larger of its estimate and ``waited``, at most the deadline (weighed, not excluded)."""
    return min(2.0 * max(estimate or 0.0, waited), deadline_s)


def choose(available: Sequence[int], count: int, rng: np.random.Generator, policy: str = "uniform",
           round_times: Mapping[int, float | None] | None = None, deadline_s: float = float("inf")) -> list[int]:
    """``count`` of the ``available`` clients, sorted."""
    if policy == "uniform":
        return sorted(int(i) for i in rng.choice(available, size=count, replace=False))
    if policy != "latency":
        raise ValueError(f"unknown selection policy {policy!r}: {', '.join(POLICIES)}")
    weights = latency_weights(available, round_times or {}, deadline_s)
    positive = int(np.count_nonzero(weights))
    if positive < count:  # too few will finish in time: the rest are drawn from those that may not
        weights = np.where(weights > 0, weights, 1e-9)
    chosen = rng.choice(np.asarray(available), size=count, replace=False, p=weights / weights.sum())
    return sorted(int(i) for i in chosen)
