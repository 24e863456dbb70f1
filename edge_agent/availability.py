"""When this device may train: the rules of its TOML's ``[availability]`` and the readings they are judged on.

``Rules``: at most a load (the 1-minute load average per core), mains power (or charging) where the board reports
its supply, local-time windows (``"22:00-06:00"`` runs over midnight), at most a temperature (the hottest thermal
zone). ``why_not(rules, readings)`` is the pure decision: '' when the device may train, else the reason, in one line.
``read_readings`` reads the board (sysfs, rooted for tests). An agent that may not train declines the round's task
with the code ``unavailable``; the coordinator counts it as not available, not as a failure. No sockets, no torch.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WINDOW = re.compile(r"([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)")
POWER_CHOICES = ("any", "mains")


@dataclass(frozen=True)
class Rules:
    max_load: float | None = None      # the 1-minute load average per core
    power: str = "any"                 # "mains": only on mains power or while charging (where the board says)
    windows: tuple[str, ...] = ()      # local times "HH:MM-HH:MM"; none: any time
    max_temp_c: float | None = None    # the hottest thermal zone

    def __post_init__(self) -> None:
        if self.max_load is not None and (isinstance(self.max_load, bool) or
                                          not isinstance(self.max_load, (int, float)) or self.max_load < 0):
            raise ValueError(f"availability.max_load must be a number >= 0, got {self.max_load!r}")
        if self.power not in POWER_CHOICES:
            raise ValueError(f"availability.power must be one of {POWER_CHOICES}, got {self.power!r}")
        if isinstance(self.windows, str) or not all(isinstance(w, str) and WINDOW.fullmatch(w) for w in self.windows):
            raise ValueError(f"availability.windows must be a list of \"HH:MM-HH:MM\", got {self.windows!r}")
        if self.max_temp_c is not None and (isinstance(self.max_temp_c, bool) or
                                            not isinstance(self.max_temp_c, (int, float))):
            raise ValueError(f"availability.max_temp_c must be a number, got {self.max_temp_c!r}")

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> Rules:
        unknown = set(table) - {"max_load", "power", "windows", "max_temp_c"}
        if unknown:
            raise ValueError(f"unknown key(s) {sorted(unknown)} in [availability]; known: max_load, power, windows, "
                             "max_temp_c")
        windows = table.get("windows", ())
        return cls(max_load=table.get("max_load"), power=table.get("power", "any"),
                   windows=tuple(windows) if isinstance(windows, list) else windows, max_temp_c=table.get("max_temp_c"))

    @property
    def any(self) -> bool:
        return self.max_load is not None or self.power != "any" or bool(self.windows) or self.max_temp_c is not None


@dataclass(frozen=True)
class Readings:
    load_per_core: float | None
    on_mains: bool | None      # None: the board reports no power supply
    temp_c: float | None
    minute_of_day: int         # local time


def in_window(window: str, minute: int) -> bool:
    found = WINDOW.fullmatch(window)
    if found is None:
        raise ValueError(f"not a window: {window!r}")
    h1, m1, h2, m2 = (int(g) for g in found.groups())
    start, end = h1 * 60 + m1, h2 * 60 + m2
    return start <= minute < end if start <= end else (minute >= start or minute < end)


def why_not(rules: Rules, readings: Readings) -> str:
    """'' when the rules let the device train now, else why not."""
    if rules.max_load is not None and readings.load_per_core is not None and readings.load_per_core > rules.max_load:
        return f"the board is busy: load {readings.load_per_core:.2f} per core > availability.max_load {rules.max_load}"
    if rules.power == "mains" and readings.on_mains is False:
        return "on battery (availability.power = mains)"
    if rules.windows and not any(in_window(w, readings.minute_of_day) for w in rules.windows):
        now = f"{readings.minute_of_day // 60:02d}:{readings.minute_of_day % 60:02d}"
        return f"outside the training windows {', '.join(rules.windows)} (now {now})"
    if rules.max_temp_c is not None and readings.temp_c is not None and readings.temp_c > rules.max_temp_c:
        return f"too hot: {readings.temp_c:.1f} °C > availability.max_temp_c {rules.max_temp_c}"
    return ""


def _read(path: Path) -> str:
    """A sysfs attribute's text, '' when it is absent or unreadable (some drivers answer EIO or ENODATA)."""
    try:
        return path.read_text().strip()
    except (OSError, ValueError):
        return ""


def read_readings(root: str | Path = "/", now: float | None = None) -> Readings:
    """The board's load, power supply and hottest thermal zone, and the local time."""
    base = Path(root)
    cores = max(os.cpu_count() or 1, 1)
    load: float | None = None
    try:
        text = (base / "proc" / "loadavg").read_text()
        load = float(text.split()[0]) / cores
    except (OSError, ValueError, IndexError):
        load = None
    on_mains: bool | None = None
    supplies = sorted((base / "sys/class/power_supply").glob("*")) if (base / "sys/class/power_supply").exists() else []
    for supply in supplies:
        kind = _read(supply / "type")
        if kind in ("Mains", "USB") and _read(supply / "online"):
            on_mains = bool(on_mains) or _read(supply / "online") == "1"
        elif kind == "Battery" and _read(supply / "status"):
            on_mains = bool(on_mains) or _read(supply / "status") in ("Charging", "Full")
    temps = []
    for zone in sorted((base / "sys/class/thermal").glob("thermal_zone*")) if (base / "sys/class/thermal").exists() \
            else []:
        try:
            temps.append(int((zone / "temp").read_text().strip()) / 1000.0)
        except (OSError, ValueError):
            continue
    local = time.localtime(now)
    return Readings(load, on_mains, max(temps) if temps else None, local.tm_hour * 60 + local.tm_min)
