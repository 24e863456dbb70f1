"""The meter's round window: the readings a round started from and what it gathered, phase by phase; and what a
record needs to know of the meter that kept it (``MeterFacts``). Shared by ``meter.agent`` (which fills windows) and
``meter.record`` (which turns them into records), so that neither imports the other. Must not import torch or zmq.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from fedge.meter.energy import EnergySource, Sampler, Tally
from fedge.meter.net import TcpCounters
from fedge.meter.process import CpuClock, PeakRss


@dataclass
class PhaseTally:
    """One phase's share of a round window: CPU and thread seconds, wall time, peak RSS, energy."""

    cpu_s: float = 0.0
    thread_s: float = 0.0
    wall_s: float = 0.0
    rss_peak: int = 0
    energy_j: float | None = 0.0


@dataclass
class RoundWindow:
    """One meter window (a round, from the end of the previous one): the readings it started from and what it
    gathered; ``record.build_record`` turns it into the round's record."""

    number: int
    t_start: float
    clock: CpuClock
    energy: Tally | None
    tcp: dict[tuple[str, int], TcpCounters] | None
    iface: tuple[int, int] | None
    rss_peak: int = 0
    phases: dict[str, PhaseTally] = field(default_factory=dict)
    open_phases: dict[str, int] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class MeterFacts(Protocol):
    """What a record reads of the meter that kept the window: the host, the energy source and its notes and
    constants, the sampler, the RSS watch, the network interface and the ZMTP mechanism."""

    @property
    def host(self) -> tuple[str, str]: ...
    @property
    def source(self) -> EnergySource | None: ...
    @property
    def energy_notes(self) -> list[str]: ...
    @property
    def sampler(self) -> Sampler: ...
    @property
    def rss(self) -> PeakRss: ...
    @property
    def iface(self) -> str | None: ...
    @property
    def mechanism(self) -> str: ...
    def energy_constants(self) -> str | None: ...
