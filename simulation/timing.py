"""How long a task takes on the simulated clock: seeded, per-device speeds and per-task jitter, as pure functions.

A task of ``steps`` local steps on client i lasts steps * step_s / speed_i * jitter_t (+ its packets' bytes /
bandwidth_bps when a bandwidth is set), in simulated seconds:

- speed_i: ``speeds = "lognormal"``: LogNormal(0, speed_sigma), drawn from (seed, client) alone, so a device is as
  fast in every run of the seed and in every variant compared; ``"equal"``: 1 for every device; a trace's speed for
  a device it names one;
- jitter_t: LogNormal(0, jitter_sigma), drawn from (seed, task id) alone;
- steps: with ``max_seconds`` (a device's ``agent.max_seconds``, in simulated seconds), training ends as an agent's
  does, at the first step that would start once the budget has passed: at most ceil(max_seconds / (step_s /
  speed_i * jitter_t)) steps, and at least one.

``DeviceTrace`` is ``fleet.trace``: a CSV of per-device speeds and availability intervals (docs/scale.md, "A device
trace"), read and checked here, with a one-line error naming the line of a bad row.

Nothing here reads a clock or keeps state, so a run that is resumed, or replayed on another backend, draws the same
durations. ``SimulatedClock`` is the time a simulated fleet and its session share (``fleet.clock = "simulated"``): it
moves only when told to. No torch, no I/O.
"""

from __future__ import annotations

import bisect
import csv
import io
import math
from dataclasses import dataclass, field

import numpy as np

SPEED_SALT = 0x5BEED   # keeps the speeds' stream apart from every other use of the run's seed
JITTER_SALT = 0x717E2
SPEED_MODELS = ("lognormal", "equal")


TRACE_COLUMNS = ("client", "speed", "from_s", "until_s")
MIN_SPEED, MAX_SPEED = 1e-6, 1e6  # a trace's speeds: a task's time stays a finite number of seconds
MAX_SIGMA = 10.0


@dataclass(frozen=True)
class DeviceTrace:
    """Per-device speeds and availability: ``speeds`` (client -> speed), ``intervals`` (client -> its sorted,
    disjoint [from, until) intervals of simulated seconds). A client with no interval is always there."""

    speeds: dict[int, float] = field(default_factory=dict)
    intervals: dict[int, tuple[tuple[float, float], ...]] = field(default_factory=dict)

    def available(self, client: int, now: float) -> bool:
        spans = self.intervals.get(client)
        if spans is None:
            return True
        at = bisect.bisect_right([start for start, _ in spans], now) - 1
        return at >= 0 and now < spans[at][1]

    def changes(self) -> list[tuple[float, int, bool]]:
        """Every (time, client, there from then on) of the trace after time 0, in time order (then client)."""
        moves = [(edge, client, edge == start) for client, spans in self.intervals.items()
                 for start, end in spans for edge in (start, end) if math.isfinite(edge) and edge > 0]
        return sorted(moves)

    @classmethod
    def parse(cls, text: str, clients: int) -> DeviceTrace:
        """A trace from its CSV (header ``client,speed,from_s,until_s``; ``speed`` blank: drawn; ``from_s`` and
        ``until_s`` both blank: always there; ``until_s`` blank: there from ``from_s`` on); ValueError naming the
        line of a bad row."""
        rows = csv.reader(io.StringIO(text))
        header = next(rows, None)
        if header is None or tuple(h.strip() for h in header) != TRACE_COLUMNS:
            raise ValueError(f"the trace's first line must be {','.join(TRACE_COLUMNS)}")
        speeds: dict[int, float] = {}
        spans: dict[int, list[tuple[float, float]]] = {}
        for number, row in enumerate(rows, 2):
            if not any(cell.strip() for cell in row):
                continue
            try:
                client, speed, start, end = (cell.strip() for cell in row)
                index = int(client)
                if not 0 <= index < clients:
                    raise ValueError(f"client {index} is not one of the fleet's {clients} (0 to {clients - 1})")
                if speed:
                    value = float(speed)
                    if not MIN_SPEED <= value <= MAX_SPEED:
                        raise ValueError(f"speed must lie in [{MIN_SPEED:g}, {MAX_SPEED:g}], got {speed}")
                    if speeds.setdefault(index, value) != value:
                        raise ValueError(f"client {index} has two speeds ({speeds[index]} and {value})")
                if start or end:
                    begin, finish = float(start or 0.0), float(end) if end else math.inf
                    if not (math.isfinite(begin) and begin >= 0 and finish > begin):
                        raise ValueError(f"an interval needs 0 <= from_s < until_s, got {start!r} to {end!r}")
                    spans.setdefault(index, []).append((begin, finish))
            except ValueError as exc:
                raise ValueError(f"trace line {number}: {exc}") from None
        intervals: dict[int, tuple[tuple[float, float], ...]] = {}
        for index, found in spans.items():
            found.sort()
            for (_, ends), (begins, _) in zip(found, found[1:], strict=False):
                if begins < ends:
                    raise ValueError(f"trace: client {index}'s intervals overlap (one ends at {ends}, the next "
                                     f"starts at {begins})")
            merged = [found[0]]
            for begins, ends in found[1:]:  # intervals that touch are one: the device never goes between them
                if begins == merged[-1][1]:
                    merged[-1] = (merged[-1][0], ends)
                else:
                    merged.append((begins, ends))
            intervals[index] = tuple(merged)
        return cls(speeds, intervals)


@dataclass(frozen=True)
class DeviceTiming:
    step_s: float = 0.05
    speeds: str = "lognormal"
    speed_sigma: float = 1.0
    jitter_sigma: float = 0.1
    bandwidth_bps: float = 0.0  # 0: transfers take no simulated time
    seed: int = 0
    max_seconds: float = 0.0  # a device's training budget a task, in simulated seconds (0: none)
    trace: DeviceTrace | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.step_s) and self.step_s > 0):
            raise ValueError("the simulated step time (step_s) must be > 0")
        if self.speeds not in SPEED_MODELS:
            raise ValueError(f"speeds must be one of {', '.join(SPEED_MODELS)}, got {self.speeds!r}")
        if not all(0 <= value < math.inf for value in (self.speed_sigma, self.jitter_sigma, self.bandwidth_bps,
                                                         self.max_seconds)):
            raise ValueError("speed_sigma, jitter_sigma, bandwidth_bps and max_seconds must be finite and >= 0")
        if self.speed_sigma > MAX_SIGMA or self.jitter_sigma > MAX_SIGMA:
            raise ValueError(f"speed_sigma and jitter_sigma must be <= {MAX_SIGMA:g} (speeds of e^{MAX_SIGMA:g} and "
                             "beyond overflow a task's time)")

    def speed(self, client: int) -> float:
        """Client ``client``'s speed (1: takes step_s a step)."""
        if self.trace is not None and client in self.trace.speeds:
            return self.trace.speeds[client]
        if self.speeds == "equal" or self.speed_sigma == 0:
            return 1.0
        return float(np.random.default_rng([self.seed, client, SPEED_SALT]).lognormal(0.0, self.speed_sigma))

    def jitter(self, task_id: int) -> float:
        if self.jitter_sigma == 0:
            return 1.0
        return float(np.random.default_rng([self.seed, task_id, JITTER_SALT]).lognormal(0.0, self.jitter_sigma))

    def step_time(self, client: int, task_id: int) -> float:
        return self.step_s / self.speed(client) * self.jitter(task_id)

    def steps_within(self, client: int, task_id: int, steps: int) -> int:
        """The steps a task of ``steps`` planned takes within ``max_seconds`` (all of them without a budget)."""
        allowed = self.max_seconds / self.step_time(client, task_id) if self.max_seconds > 0 else math.inf
        return steps if not allowed < steps else max(1, math.ceil(allowed))

    def transfer(self, nbytes: int) -> float:
        """Simulated seconds ``nbytes`` take on a device's link."""
        return nbytes * 8 / self.bandwidth_bps if self.bandwidth_bps > 0 else 0.0

    def duration(self, client: int, task_id: int, steps: int, nbytes: int = 0) -> float:
        """Simulated seconds from a task's dispatch to its update's arrival: ``steps`` trained (``steps_within``
        a budget: the caller's) and ``nbytes`` carried."""
        return steps * self.step_s / self.speed(client) * self.jitter(task_id) + self.transfer(nbytes)


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
