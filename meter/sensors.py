"""Sysfs energy and power sensors: RAPL powercap, Jetson INA3221 (JetPack 4 IIO and JetPack 5/6 hwmon), ina2xx hwmon.

Paths and units follow docs/meter.md sections 2.2 and 2.4 and are all rooted at a ``Root``, so tests use fake trees:

* RAPL: ``/sys/class/powercap/intel-rapl:N/{name,energy_uj,max_energy_range_uj}``, top-level ``package-*`` zones
  only (nested ``intel-rapl:N:M`` zones are parts of a package: summing them would double count), wrap handled.
* Jetson JetPack 5/6: ``/sys/bus/i2c/drivers/ina3221/<bus>-00<addr>/hwmon/hwmon*/in<k>_label``, ``in<k>_input``
  (mV), ``curr<k>_input`` (mA), k = 1..3; P = V x I; channel 7 and ``NC`` rails skipped; ``VDD_IN`` is the module
  total when present (Orin Nano/NX, Xavier NX), else the rails are summed (AGX Orin).
* Jetson JetPack 4: ``/sys/bus/i2c/drivers/ina3221x/<bus>-00<addr>/iio:device*/rail_name_<k>``,
  ``in_power<k>_input`` (mW); ``POM_5V_IN`` is the total when present, else the sum.
* ina2xx: ``/sys/class/hwmon/hwmon*/name`` = ina219, ina226, ... with ``power1_input`` in microwatts.

Must not import torch, zmq or any Fedge package.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fedge.meter.energy import EnergySource
from fedge.meter.sysfs import Root, SensorMissing

RAPL_HINT = "RAPL energy_uj is root-only since Linux 5.10 (CVE-2020-8694); see docs/meter.md for a udev rule"
JETSON_HINT = "some L4T trees need a udev rule or tmpfiles.d entry granting read access; see docs/meter.md"
_NOT_CONNECTED = re.compile(r"(^|[_\s])NC($|[_\s])")
_INA2XX_NAME = re.compile(r"^ina2(xx|\d\d)$")
_TOTAL_RAILS = ("VDD_IN", "POM_5V_IN")


class RaplSource(EnergySource):
    """Cumulative CPU-package energy from RAPL counters, summed over packages, with wraparound handled."""

    source = "rapl"
    scope = "cpu-package"
    mode = "energy"
    max_hz = 1000.0
    method = "powercap energy_uj deltas of the package zones, wrap at max_energy_range_uj"

    def __init__(self, root: Root) -> None:
        self.root = root
        self.zones: list[tuple[str, Path, int]] = []
        skipped: list[str] = []
        for zone in root.glob("/sys/class/powercap/intel-rapl:*"):
            if zone.name.count(":") != 1:
                continue
            name = root.read_text(zone / "name")
            if not name.startswith("package"):
                skipped.append(name)
                continue
            limit = root.read_int(zone / "max_energy_range_uj", RAPL_HINT)
            self.zones.append((name, zone / "energy_uj", limit))
        if not self.zones:
            raise SensorMissing("no RAPL package zone under /sys/class/powercap/intel-rapl:*")
        if skipped:
            self.method += f" (top-level zones left out to avoid double counting: {', '.join(skipped)})"
        self._last: list[int] | None = None
        self._total_uj = 0

    def read(self) -> float:
        raw = [self.root.read_int(path, RAPL_HINT) for _, path, _ in self.zones]
        if self._last is not None:
            for (_, _, limit), now, before in zip(self.zones, raw, self._last, strict=True):
                self._total_uj += now - before if now >= before else limit - before + now
        self._last = raw
        return self._total_uj / 1e6

    def constants(self) -> dict[str, Any]:
        return {"zones": [name for name, _, _ in self.zones]}


class _RailSource(EnergySource):
    """A power source made of named rails, one of which may be the total."""

    scope = "module"

    def __init__(self, root: Root, rails: dict[str, Any]) -> None:
        self.root = root
        self.rails = rails
        self.total_rail = next((name for name in _TOTAL_RAILS if name in rails), None)
        used = [self.total_rail] if self.total_rail else sorted(rails)
        self.method = (f"rail {self.total_rail} (module total)" if self.total_rail
                       else "sum of rails " + ", ".join(used))
        self.used = used

    def read(self) -> float:
        return sum(self._rail_watts(self.rails[name]) for name in self.used)

    def _rail_watts(self, paths: Any) -> float:
        raise NotImplementedError

    def constants(self) -> dict[str, Any]:
        return {"rails": self.used}


class JetsonHwmonSource(_RailSource):
    """JetPack 5/6: the upstream ``ina3221`` hwmon driver; power computed host-side as bus mV x mA."""

    source = "jetson-ina3221-hwmon"

    def __init__(self, root: Root) -> None:
        rails: dict[str, tuple[Path, Path]] = {}
        for device in root.glob("/sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*"):
            for channel in (1, 2, 3):
                label_file = device / f"in{channel}_label"
                volts, amps = device / f"in{channel}_input", device / f"curr{channel}_input"
                if not (label_file.exists() and volts.exists() and amps.exists()):
                    continue
                label = root.read_text(label_file, JETSON_HINT)
                if not _NOT_CONNECTED.search(label):
                    rails[_unique(rails, label)] = (volts, amps)
        if not rails:
            raise SensorMissing("no INA3221 hwmon rails under /sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*")
        super().__init__(root, rails)

    def _rail_watts(self, paths: Any) -> float:
        volts, amps = paths
        return self.root.read_int(volts, JETSON_HINT) * self.root.read_int(amps, JETSON_HINT) / 1e6


class JetsonIioSource(_RailSource):
    """JetPack 4: NVIDIA's ``ina3221x`` IIO driver, which reports each rail's power in milliwatts."""

    source = "jetson-ina3221-iio"

    def __init__(self, root: Root) -> None:
        rails: dict[str, Path] = {}
        for device in root.glob("/sys/bus/i2c/drivers/ina3221x/*/iio:device*"):
            for label_file in sorted(device.glob("rail_name_*")):
                channel = label_file.name.rsplit("_", 1)[1]
                power = device / f"in_power{channel}_input"
                if not power.exists():
                    continue
                label = root.read_text(label_file, JETSON_HINT)
                if not _NOT_CONNECTED.search(label):
                    rails[_unique(rails, label)] = power
        if not rails:
            raise SensorMissing("no INA3221 IIO rails under /sys/bus/i2c/drivers/ina3221x/*/iio:device*")
        super().__init__(root, rails)

    def _rail_watts(self, paths: Any) -> float:
        return self.root.read_int(paths, JETSON_HINT) / 1e3


class Ina2xxSource(EnergySource):
    """An INA219/INA226-family shunt monitor through hwmon (``power1_input`` in microwatts).

    Its scope is wherever the shunt is wired; ``scope`` defaults to ``board`` (a shunt on the 5 V feed). With more
    than one such sensor the first is used (or the one whose hwmon directory or name is ``device``): summing them
    could double count nested rails."""

    source = "ina2xx-hwmon"
    max_hz = 200.0

    def __init__(self, root: Root, scope: str = "board", device: str | None = None) -> None:
        self.root = root
        self.scope = scope
        found: list[tuple[str, Path]] = []
        for hwmon in root.glob("/sys/class/hwmon/hwmon*"):
            name_file, power = hwmon / "name", hwmon / "power1_input"
            if not (name_file.exists() and power.exists()):
                continue
            name = root.read_text(name_file)
            if _INA2XX_NAME.match(name) and device in (None, name, hwmon.name):
                found.append((f"{name}@{hwmon.name}", power))
        if not found:
            raise SensorMissing("no ina2xx hwmon sensor with power1_input under /sys/class/hwmon")
        self.sensor, self.path = found[0]
        self.method = f"power1_input of {self.sensor}"
        if len(found) > 1:
            self.method += f" (others not summed: {', '.join(name for name, _ in found[1:])})"

    def read(self) -> float:
        return self.root.read_int(self.path) / 1e6

    def constants(self) -> dict[str, Any]:
        return {"sensor": self.sensor}


def _unique(existing: dict[str, Any], label: str) -> str:
    if label not in existing:
        return label
    index = 2
    while f"{label}#{index}" in existing:
        index += 1
    return f"{label}#{index}"

