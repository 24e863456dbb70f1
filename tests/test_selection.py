"""The runtime's selection: uniform is the seeded draw it always was; the latency policy draws slow agents less
often, never one slower than the deadline unless it must, and gives an unmeasured agent its chance."""

from __future__ import annotations

import numpy as np

from fedge.protocol.selection import choose, latency_weights

AVAILABLE = list(range(6))
TIMES: dict[int, float | None] = {0: 0.5, 1: 0.4, 2: 0.6, 3: 0.5, 4: 6.0, 5: 5.0}  # 4 and 5 are slow boards


def picks(policy: str, rounds: int = 20) -> dict[int, int]:
    counts = dict.fromkeys(AVAILABLE, 0)
    for number in range(1, rounds + 1):
        for index in choose(AVAILABLE, 3, np.random.default_rng([7, number]), policy, TIMES, deadline_s=30.0):
            counts[index] += 1
    return counts


def test_uniform_is_the_seeded_draw_without_replacement() -> None:
    for number in range(1, 6):
        expected = sorted(int(i) for i in np.random.default_rng([7, number]).choice(AVAILABLE, size=3, replace=False))
        assert choose(AVAILABLE, 3, np.random.default_rng([7, number])) == expected


def test_over_20_seeded_rounds_the_latency_policy_picks_slow_agents_less_often() -> None:
    uniform, latency = picks("uniform"), picks("latency")
    slow_uniform, slow_latency = uniform[4] + uniform[5], latency[4] + latency[5]
    assert slow_latency < slow_uniform, (uniform, latency)
    assert sum(latency.values()) == sum(uniform.values()) == 60


def test_weights_fall_with_round_time_and_vanish_past_the_deadline() -> None:
    weights = latency_weights(AVAILABLE, {**TIMES, 2: None, 5: 50.0}, deadline_s=30.0)
    assert weights[2] == 1.0  # never measured: its chance
    assert weights[0] == weights[1] == weights[3] == 1.0  # at or under the median (0.5)
    assert 0 < weights[4] < 0.1 and weights[5] == 0.0
    # Too few would finish: the slowest are still drawn, the count is met.
    assert len(choose(AVAILABLE, 6, np.random.default_rng(0), "latency", {**TIMES, 5: 50.0}, 30.0)) == 6
