"""Energy sources, the integrator that turns their readings into joules, the sampling thread, and auto-detection.

An ``EnergySource`` reads either instantaneous power in watts (``mode = "power"``: INA3221, ina2xx, the Pi 5 PMIC)
or a cumulative energy in joules since it was opened (``mode = "energy"``: RAPL with its wraparound handled, the CPU
model). ``EnergyIntegrator`` integrates power with the trapezoid rule and takes deltas of energy, counting samples,
the largest gap and read errors. ``Sampler`` is the background thread that calls it (and any context readers) at a
stated rate and stops cleanly. ``meter.sources.open_energy_source`` picks a source: explicitly, or ``"auto"`` in the order
RAPL, Jetson INA3221 (JetPack 5/6 hwmon, then JetPack 4 IIO), ina2xx hwmon, Pi 5 PMIC, and only then the labelled CPU
model, recording why each measured source was passed over. Must not import torch, zmq or any Fedge package.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from fedge.meter.figure import Kind

Mode = Literal["power", "energy"]
ENERGY_CHOICES: tuple[str, ...] = ("auto", "rapl", "jetson", "ina2xx", "pmic", "estimate", "none")


class EnergySource(ABC):
    """One place energy comes from. Subclasses set the labels and implement ``read``."""

    source: str = ""
    scope: str = ""
    kind: Kind = "measured"
    mode: Mode = "power"
    max_hz: float = 100.0
    method: str = ""

    @abstractmethod
    def read(self) -> float:
        """Watts now (power mode) or joules since the source was opened (energy mode); raises ``SensorError``."""

    def constants(self) -> dict[str, Any]:
        """Model constants and calibration factors that a reader needs to recompute the figure."""
        return {}


@dataclass(frozen=True)
class Tally:
    """Integrated energy so far and how well it was sampled."""

    joules: float
    samples: int
    max_gap_s: float
    errors: int
    last_error: str | None


class EnergyIntegrator:
    """Integrates one source; thread-safe. Call ``sample`` often enough (RAPL wraps, power varies)."""

    def __init__(self, source: EnergySource, clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self._clock = clock
        self._lock = threading.Lock()
        self._last: tuple[float, float] | None = None
        self._joules = 0.0
        self._samples = 0
        self._max_gap = 0.0
        self._errors = 0
        self._last_error: str | None = None

    def sample(self, force: bool = True) -> None:
        """Take one reading; without ``force``, skip it when the source's ``max_hz`` says it is too soon."""
        with self._lock:
            now = self._clock()
            if not force and self._last is not None and now - self._last[0] < 0.95 / self.source.max_hz:
                return
            try:
                value = self.source.read()
            except Exception as error:  # noqa: BLE001 - a failed reading is counted; it must not stop the agent
                self._errors += 1
                self._last_error = str(error)
                return
            now = self._clock()
            if self._last is not None:
                then, previous = self._last
                gap = now - then
                self._max_gap = max(self._max_gap, gap)
                if self.source.mode == "power":
                    self._joules += 0.5 * (previous + value) * gap
                else:
                    self._joules += value - previous
            self._last = (now, value)
            self._samples += 1

    def tally(self, fresh: bool = True) -> Tally:
        """The running totals, after one more reading when ``fresh`` (so a window ends now)."""
        if fresh:
            self.sample()
        with self._lock:
            return Tally(self._joules, self._samples, self._max_gap, self._errors, self._last_error)


class Sampler:
    """A daemon thread calling each callback every 1/hz seconds until ``stop``; a failing callback is recorded,
    never fatal."""

    def __init__(self, hz: float, callbacks: list[Callable[[], None]] | None = None) -> None:
        if hz <= 0:
            raise ValueError(f"sample rate must be > 0 Hz, got {hz}")
        self.hz = hz
        self.callbacks = list(callbacks or [])
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="fedge-meter-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> bool:
        """Stop and join; True when the thread has ended within ``timeout`` seconds."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _loop(self) -> None:
        period = 1.0 / self.hz
        while not self._stop.wait(period):
            for callback in self.callbacks:
                try:
                    callback()
                except Exception as error:  # noqa: BLE001 - a sensor hiccup must not kill the sampler
                    if len(self.failures) < 20:
                        self.failures.append(f"{getattr(callback, '__qualname__', callback)}: {error}")
