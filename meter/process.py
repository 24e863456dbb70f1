"""Process figures: CPU time, peak resident memory, and the throttling context (temperatures, CPU frequencies).

* ``cpu_clock`` reads this process's user and system CPU seconds (all its threads) and the calling thread's own.
* ``PeakRss`` gives the peak RSS of successive windows. On Linux it is exact: the kernel's high-water mark
  (``VmHWM``) is read and then reset by writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0). Elsewhere it
  falls back to RSS sampled by the meter's thread, which can miss short peaks; ``method`` says which.
* ``read_temperatures`` (``/sys/class/thermal/thermal_zone*/temp``, millidegrees C) and ``read_cpu_freqs_mhz``
  (``/sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq``, kHz) read under a ``Root``; ``ContextWatch`` keeps
  the hottest zone and the lowest frequency seen in a window. Missing files give empty results, not errors.

The process's own ``/proc/self`` is always the real one; only device sensors follow the configurable root.
Must not import torch, zmq or any Fedge package.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from fedge.meter.sysfs import Root, SensorError

MB = 1024 * 1024


@dataclass(frozen=True)
class CpuClock:
    """A reading of the clocks a phase is measured with (seconds)."""

    wall: float
    user: float
    system: float
    thread: float


def cpu_clock(process: psutil.Process | None = None) -> CpuClock:
    times = (process or psutil.Process()).cpu_times()
    return CpuClock(time.monotonic(), float(times.user), float(times.system), time.thread_time())


class PeakRss:
    """Peak RSS per window: ``take()`` returns the peak since the previous ``take()`` and starts a new window."""

    def __init__(self, proc_self: str | Path = "/proc/self") -> None:
        self._status = Path(proc_self) / "status"
        self._clear = Path(proc_self) / "clear_refs"
        self._process = psutil.Process()
        self._lock = threading.Lock()
        self._sampled_max = 0
        self.exact = self._try_reset()
        self.method = ("kernel VmHWM, reset per window via /proc/self/clear_refs" if self.exact
                       else "RSS sampled by the meter thread and at phase boundaries")

    def _try_reset(self) -> bool:
        try:
            self._clear.write_text("5")
            return self._hwm_bytes() is not None
        except OSError:
            return False

    def _hwm_bytes(self) -> int | None:
        try:
            for line in self._status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            return None
        return None

    def _rss(self) -> int:
        return int(self._process.memory_info().rss)

    def sample(self) -> None:
        """Note the RSS now (needed only in sampled mode; cheap either way)."""
        if not self.exact:
            with self._lock:
                self._sampled_max = max(self._sampled_max, self._rss())

    def take(self) -> int:
        """Peak RSS in bytes since the previous ``take`` (or construction); starts the next window."""
        with self._lock:
            if self.exact:
                peak = self._hwm_bytes()
                try:
                    self._clear.write_text("5")
                except OSError:
                    self.exact = False
                if peak is not None:
                    return peak
            now = self._rss()
            peak, self._sampled_max = max(self._sampled_max, now), now
            return peak


def read_temperatures(root: Root) -> dict[str, float]:
    """Degrees Celsius per thermal zone (keyed ``<type>`` or ``<zone>`` when the type is missing or repeated)."""
    result: dict[str, float] = {}
    for zone in root.glob("/sys/class/thermal/thermal_zone*"):
        try:
            millidegrees = root.read_int(zone / "temp")
        except SensorError:
            continue
        try:
            name = root.read_text(zone / "type") or zone.name
        except SensorError:
            name = zone.name
        result[name if name not in result else f"{name}@{zone.name}"] = millidegrees / 1000.0
    return result


def read_cpu_freqs_mhz(root: Root) -> dict[str, float]:
    """Current frequency per CPU in MHz from cpufreq's ``scaling_cur_freq``."""
    result: dict[str, float] = {}
    for path in root.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq"):
        try:
            result[path.parent.parent.name] = root.read_int(path) / 1000.0
        except SensorError:
            continue
    return result


class ContextWatch:
    """Hottest temperature and lowest CPU frequency seen in a window; ``take()`` ends the window."""

    def __init__(self, root: Root) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._temp: tuple[float, str] | None = None
        self._freq: float | None = None

    def sample(self) -> None:
        temps = read_temperatures(self.root)
        freqs = read_cpu_freqs_mhz(self.root)
        with self._lock:
            if temps:
                name, value = max(temps.items(), key=lambda item: item[1])
                if self._temp is None or value > self._temp[0]:
                    self._temp = (value, name)
            if freqs:
                low = min(freqs.values())
                self._freq = low if self._freq is None else min(self._freq, low)

    def take(self) -> tuple[float | None, str | None, float | None]:
        """(max temperature C, its zone, min CPU MHz) over the window; None where nothing was readable."""
        self.sample()
        with self._lock:
            temp, self._temp = self._temp, None
            freq, self._freq = self._freq, None
        return (temp[0] if temp else None, temp[1] if temp else None, freq)
