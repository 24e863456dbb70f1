"""Energy sources, the integrator that turns their readings into joules, the sampling thread, and auto-detection.

An ``EnergySource`` reads either instantaneous power in watts (``mode = "power"``: INA3221, ina2xx, the Pi 5 PMIC)
or a cumulative energy in joules since it was opened (``mode = "energy"``: RAPL with its wraparound handled, the CPU
model). ``EnergyIntegrator`` integrates power with the trapezoid rule and takes deltas of energy, counting samples,
the largest gap and read errors. ``Sampler`` is the background thread that calls it (and any context readers) at a
stated rate and stops cleanly. ``open_energy_source`` picks a source: explicitly, or ``"auto"`` in the order
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
from fedge.meter.sysfs import Root, SensorError

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


def open_energy_source(choice: str | EnergySource = "auto", root: Root | None = None,
                       vcgencmd: str = "vcgencmd", estimate: dict[str, Any] | None = None,
                       ) -> tuple[EnergySource | None, list[str]]:
    """The energy source to use and notes on how it was chosen.

    An explicit sensor name that cannot be read raises ``SensorError`` (never silently replaced by an estimate).
    ``"auto"`` tries the measured sources in order, probing each with one read, and falls back to the CPU model
    (``estimate`` holds its constants), noting each reason. ``"none"`` gives no source."""
    from fedge.meter.external import CpuModelSource
    from fedge.meter.pmic import PmicSource
    from fedge.meter.sensors import Ina2xxSource, JetsonHwmonSource, JetsonIioSource, RaplSource

    if isinstance(choice, EnergySource):
        return choice, []
    if choice not in ENERGY_CHOICES:
        raise ValueError(f"energy must be one of {ENERGY_CHOICES} or an EnergySource, got {choice!r}")
    root = root or Root("/")
    if choice == "none":
        return None, ["energy metering off"]
    if choice == "estimate":
        return CpuModelSource(**(estimate or {})), []
    factories: dict[str, list[Callable[[], EnergySource]]] = {
        "rapl": [lambda: RaplSource(root)],
        "jetson": [lambda: JetsonHwmonSource(root), lambda: JetsonIioSource(root)],
        "ina2xx": [lambda: Ina2xxSource(root)],
        "pmic": [lambda: PmicSource(vcgencmd)],
    }
    order = list(factories) if choice == "auto" else [choice]
    notes: list[str] = []
    for name in order:
        for factory in factories[name]:
            try:
                source = factory()
                source.read()
                return source, notes
            except SensorError as error:
                notes.append(f"{name}: {error}")
    if choice != "auto":
        raise SensorError(f"energy source {choice!r} unavailable: " + "; ".join(notes))
    notes.append("no readable power sensor; using the labelled CPU-utilisation model")
    return CpuModelSource(**(estimate or {})), notes
