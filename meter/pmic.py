"""Raspberry Pi 5 PMIC rails through ``vcgencmd pmic_read_adc``: the output parser and a power source.

The recorded format (docs/meter.md section 2.3) has one line per reading, for example::

    VDD_CORE_A current(7)=1.42880000A
    VDD_CORE_V volt(15)=0.90659250V
    EXT5V_V volt(24)=5.12020000V

Power is the sum of V x I over rails that have both a current and a voltage line. ``EXT5V`` (USB-C input) and
``BATT`` have a voltage only and are left out. A line in any other shape is kept as "unparsed" and never guessed
at. The sum excludes PMIC conversion losses, USB devices, the fan, HATs and PCIe, so its scope is ``pmic-rails``;
the optional pitop calibration (1.1451 x sum + 0.5879 W, one board's fit) makes the figure *estimated*, scope
``board``. Must not import torch, zmq or any Fedge package.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

from fedge.meter.energy import EnergySource
from fedge.meter.sysfs import NoReadAccess, SensorError, SensorMissing

_CURRENT = re.compile(r"^\s*(?P<rail>\S+)_A\s+current\((?P<ch>\d+)\)=(?P<value>[-+0-9.eE]+)A\s*$")
_VOLT = re.compile(r"^\s*(?P<rail>\S+)_V\s+volt\((?P<ch>\d+)\)=(?P<value>[-+0-9.eE]+)V\s*$")
PITOP_SLOPE = 1.1451
PITOP_OFFSET_W = 0.5879
VIDEO_HINT = "vcgencmd needs /dev/vcio: add the service user to the 'video' group; see docs/meter.md"


@dataclass(frozen=True)
class PmicReading:
    """One ``pmic_read_adc`` output: amps and volts per rail, and the lines that matched neither format."""

    amps: dict[str, float] = field(default_factory=dict)
    volts: dict[str, float] = field(default_factory=dict)
    unparsed: tuple[str, ...] = ()

    @property
    def rails(self) -> list[str]:
        """Rails with both a current and a voltage, in output order."""
        return [rail for rail in self.amps if rail in self.volts]

    @property
    def watts(self) -> float:
        return sum(self.amps[rail] * self.volts[rail] for rail in self.rails)


def parse_pmic_adc(text: str) -> PmicReading:
    """Parse ``vcgencmd pmic_read_adc`` output in the recorded format."""
    amps: dict[str, float] = {}
    volts: dict[str, float] = {}
    unparsed: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        current, volt = _CURRENT.match(line), _VOLT.match(line)
        if current:
            amps[current["rail"]] = float(current["value"])
        elif volt:
            volts[volt["rail"]] = float(volt["value"])
        else:
            unparsed.append(line.strip())
    return PmicReading(amps, volts, tuple(unparsed))


class PmicSource(EnergySource):
    """Pi 5 PMIC rail power sampled through a ``vcgencmd`` subprocess (a few Hz at most)."""

    source = "pi5-pmic"
    max_hz = 5.0

    def __init__(self, vcgencmd: str = "vcgencmd", calibrated: bool = False, timeout_s: float = 2.0) -> None:
        found = vcgencmd if os.sep in vcgencmd else shutil.which(vcgencmd)
        if found is None or not os.path.exists(found):
            raise SensorMissing(f"{vcgencmd!r} not found")
        self.command = [found, "pmic_read_adc"]
        self.calibrated = calibrated
        self.timeout_s = timeout_s
        self.kind = "estimated" if calibrated else "measured"
        self.scope = "board" if calibrated else "pmic-rails"
        self.method = ("pitop calibration 1.1451 x sum(V x I) + 0.5879 W of the PMIC rails" if calibrated
                       else "sum of V x I over PMIC rails from vcgencmd pmic_read_adc")
        self.last: PmicReading | None = None

    def read(self) -> float:
        try:
            done = subprocess.run(self.command, capture_output=True, text=True, timeout=self.timeout_s,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise SensorError(f"{' '.join(self.command)} failed: {error}") from error
        output = (done.stdout or "") + (done.stderr or "")
        lowered = output.lower()
        if "permission denied" in lowered or "vchi initialization failed" in lowered or "failed to open" in lowered:
            raise NoReadAccess("/dev/vcio", VIDEO_HINT)
        if done.returncode != 0 or "error=" in lowered:
            raise SensorMissing(f"vcgencmd pmic_read_adc unsupported here (exit {done.returncode}): "
                                f"{output.strip()[:120]}")
        reading = parse_pmic_adc(done.stdout)
        if not reading.rails:
            raise SensorError("vcgencmd pmic_read_adc gave no rail with both current and voltage; unparsed: "
                              + " | ".join(reading.unparsed[:3]))
        self.last = reading
        watts = reading.watts
        return PITOP_SLOPE * watts + PITOP_OFFSET_W if self.calibrated else watts

    def constants(self) -> dict[str, Any]:
        constants: dict[str, Any] = {"rails": self.last.rails if self.last else []}
        if self.last and self.last.unparsed:
            constants["unparsed"] = list(self.last.unparsed)
        if self.calibrated:
            constants.update(slope=PITOP_SLOPE, offset_w=PITOP_OFFSET_W, calibration="pitop, one board")
        return constants
