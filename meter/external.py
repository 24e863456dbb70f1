"""Energy without an on-board sensor: the labelled CPU-utilisation model and an external meter's CSV log.

* ``CpuModelSource``: P = idle + (max - idle) x u, integrated exactly as E = idle x t + (max - idle) x busy-CPU-s
  / cores. ``share="machine"`` uses the whole machine's busy time (scope ``board``); ``share="process"`` this
  process's CPU time (scope ``process-share``). Always *estimated*; its constants and their origin are recorded.
  codecarbon's comparable model was off by -60 % to +190 % against RAPL, so never compare it with a measurement.
* ``MeterLog``: a USB-C inline meter's or smart plug's log with a timestamp column and either a power (W) or a
  cumulative energy (J or Wh) column, integrated over a time window (trapezoid on power, interpolated difference on
  energy). Timestamps are Unix seconds or ISO 8601 (naive = local time); ``clock_offset_s`` is added to them to
  bring the meter's clock onto the host's. A window the log does not cover raises, never extrapolates.

Must not import torch, zmq or any Fedge package.
"""

from __future__ import annotations

import bisect
import csv
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from fedge.meter.energy import EnergySource
from fedge.meter.figure import Figure
from fedge.meter.sysfs import SensorError

DEFAULT_IDLE_W = 2.0
DEFAULT_MAX_W = 6.0
_TIME_NAMES = ("timestamp", "time", "unix", "unix_s", "t", "datetime", "date")
_POWER_NAMES = {"watts": 1.0, "power_w": 1.0, "power": 1.0, "w": 1.0, "mw": 1e-3, "power_mw": 1e-3}
_ENERGY_NAMES = {"joules": 1.0, "energy_j": 1.0, "energy": 1.0, "j": 1.0, "wh": 3600.0, "energy_wh": 3600.0,
                 "kwh": 3.6e6, "energy_kwh": 3.6e6}


class CpuModelSource(EnergySource):
    """The labelled estimate used where no sensor exists."""

    kind = "estimated"
    source = "model:cpu-linear"
    mode = "energy"
    max_hz = 1000.0

    def __init__(self, idle_w: float = DEFAULT_IDLE_W, max_w: float = DEFAULT_MAX_W,
                 origin: str = "uncalibrated default", share: str = "machine") -> None:
        if not 0 <= idle_w <= max_w:
            raise ValueError(f"need 0 <= idle_w <= max_w, got {idle_w}, {max_w}")
        if share not in ("machine", "process"):
            raise ValueError(f"share must be 'machine' or 'process', got {share!r}")
        self.idle_w, self.max_w, self.origin, self.share = idle_w, max_w, origin, share
        self.scope = "board" if share == "machine" else "process-share"
        self.method = f"idle + (max - idle) x {share} CPU utilisation ({origin})"
        self._cores = psutil.cpu_count() or 1
        self._process = psutil.Process()
        self._start = (time.monotonic(), self._busy_s())

    def _busy_s(self) -> float:
        if self.share == "process":
            times = self._process.cpu_times()
            return float(times.user + times.system)
        times = psutil.cpu_times()
        not_busy = sum(getattr(times, name, 0.0) for name in ("idle", "iowait", "steal", "guest", "guest_nice"))
        return float(sum(times)) - not_busy  # guest time is already inside user time

    def read(self) -> float:
        started, busy_start = self._start
        elapsed = time.monotonic() - started
        busy = min(max(self._busy_s() - busy_start, 0.0), elapsed * self._cores)
        return self.idle_w * elapsed + (self.max_w - self.idle_w) * busy / self._cores

    def constants(self) -> dict[str, Any]:
        return {"idle_w": self.idle_w, "max_w": self.max_w, "origin": self.origin, "share": self.share,
                "cores": self._cores}


class MeterLog:
    """An external meter's log: sorted (time, value) pairs of power (W) or cumulative energy (J)."""

    def __init__(self, times: list[float], values: list[float], quantity: str, name: str,
                 scope: str = "wall") -> None:
        if quantity not in ("power", "energy"):
            raise ValueError(f"quantity must be 'power' or 'energy', got {quantity!r}")
        if len(times) < 2:
            raise SensorError(f"meter log {name!r} has fewer than two readings")
        pairs = sorted(zip(times, values, strict=True))
        self.times = [t for t, _ in pairs]
        self.values = [v for _, v in pairs]
        self.quantity, self.name, self.scope = quantity, name, scope

    @classmethod
    def read_csv(cls, path: str | Path, *, time_column: str | None = None, value_column: str | None = None,
                 clock_offset_s: float = 0.0, scope: str = "wall") -> MeterLog:
        """Load a CSV with a header row. Columns are found by name (``timestamp``/``time``; ``watts``/``power_w``/
        ``mw`` or ``joules``/``energy_j``/``wh``) unless given; the unit comes from the column name."""
        path = Path(path)
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        if not rows:
            raise SensorError(f"meter log {path} is empty")
        header = {name.strip().lower(): name for name in rows[0]}
        time_key = time_column or next((header[n] for n in _TIME_NAMES if n in header), None)
        value_key = value_column or next((header[n] for n in (*_POWER_NAMES, *_ENERGY_NAMES) if n in header), None)
        if time_key is None or value_key is None:
            raise SensorError(f"meter log {path}: need a time and a power or energy column, got {list(rows[0])}")
        unit = value_key.strip().lower()
        if unit in _ENERGY_NAMES:
            quantity, scale = "energy", _ENERGY_NAMES[unit]
        elif unit in _POWER_NAMES:
            quantity, scale = "power", _POWER_NAMES[unit]
        else:
            raise SensorError(f"meter log {path}: cannot tell the unit of column {value_key!r}")
        times = [_timestamp(row[time_key]) + clock_offset_s for row in rows]
        values = [float(row[value_key]) * scale for row in rows]
        return cls(times, values, quantity, path.name, scope)

    def _at(self, t: float) -> float:
        i = bisect.bisect_left(self.times, t)
        if i < len(self.times) and self.times[i] == t:
            return self.values[i]
        t0, t1 = self.times[i - 1], self.times[i]
        v0, v1 = self.values[i - 1], self.values[i]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0)

    def joules_between(self, start: float, end: float) -> float:
        """Energy in joules over [start, end] (Unix seconds on the host's clock)."""
        if end < start:
            raise ValueError(f"window ends ({end}) before it starts ({start})")
        if start < self.times[0] or end > self.times[-1]:
            raise SensorError(f"meter log {self.name} covers {self.times[0]:.3f}..{self.times[-1]:.3f}, "
                              f"not the window {start:.3f}..{end:.3f}")
        if self.quantity == "energy":
            return self._at(end) - self._at(start)
        inner = [(t, v) for t, v in zip(self.times, self.values, strict=True) if start < t < end]
        points = [(start, self._at(start)), *inner, (end, self._at(end))]
        return sum(0.5 * (v0 + v1) * (t1 - t0) for (t0, v0), (t1, v1) in zip(points, points[1:], strict=False))

    def energy(self, start: float, end: float) -> Figure:
        return Figure(self.joules_between(start, end), "J", "measured", f"external:{self.name}", self.scope,
                      "trapezoid over logged power" if self.quantity == "power"
                      else "difference of logged cumulative energy")


def attach_log_energy(records: list[dict[str, Any]], log: MeterLog) -> list[dict[str, Any]]:
    """Copies of AgentMeter records with their energy fields taken from ``log`` over each record's
    [t_start, t_end]; a record whose window the log does not cover gets null energy and a note."""
    result = []
    for record in records:
        updated = dict(record)
        try:
            updated.update(log.energy(record["t_start"], record["t_end"]).as_fields("energy_j"))
        except SensorError as error:
            updated.update(energy_j=None, energy_kind=None, energy_source=f"external:{log.name}",
                           energy_scope=log.scope, energy_note=str(error))
        result.append(updated)
    return result


def _timestamp(text: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
