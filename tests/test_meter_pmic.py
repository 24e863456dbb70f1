"""Raspberry Pi 5 PMIC: the recorded ``vcgencmd pmic_read_adc`` format parsed, and a fake vcgencmd script as source."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedge.meter import (
    NoReadAccess,
    PmicSource,
    Root,
    SensorError,
    SensorMissing,
    open_energy_source,
    parse_pmic_adc,
)
from fedge.meter.pmic import PITOP_OFFSET_W, PITOP_SLOPE

RECORDED = """\
 3V7_WL_SW_A current(0)=0.00000000A
   3V3_SYS_A current(1)=0.05070000A
   1V8_SYS_A current(2)=0.16590000A
  DDR_VDD2_A current(3)=0.02340000A
  DDR_VDDQ_A current(4)=0.00000000A
   1V1_SYS_A current(5)=0.18540000A
    0V8_SW_A current(6)=0.31220000A
  VDD_CORE_A current(7)=1.42880000A
   3V3_DAC_A current(17)=0.00010000A
   3V3_ADC_A current(18)=0.00040000A
   0V8_AON_A current(16)=0.00460000A
      HDMI_A current(22)=0.02140000A
 3V7_WL_SW_V volt(8)=3.74000000V
   3V3_SYS_V volt(9)=3.31000000V
   1V8_SYS_V volt(10)=1.80000000V
  DDR_VDD2_V volt(11)=1.11000000V
  DDR_VDDQ_V volt(12)=0.60000000V
   1V1_SYS_V volt(13)=1.10000000V
    0V8_SW_V volt(14)=0.80000000V
  VDD_CORE_V volt(15)=0.90659250V
   3V3_DAC_V volt(20)=3.31000000V
   3V3_ADC_V volt(21)=3.31000000V
   0V8_AON_V volt(19)=0.80000000V
      HDMI_V volt(23)=5.14000000V
     EXT5V_V volt(24)=5.12020000V
      BATT_V volt(25)=0.00000000V
"""
CURRENTS = [0.0, 0.0507, 0.1659, 0.0234, 0.0, 0.1854, 0.3122, 1.4288, 0.0001, 0.0004, 0.0046, 0.0214]
VOLTS = [3.74, 3.31, 1.80, 1.11, 0.60, 1.10, 0.80, 0.9065925, 3.31, 3.31, 0.80, 5.14]
EXPECTED_W = sum(a * v for a, v in zip(CURRENTS, VOLTS, strict=True))


def test_recorded_output_sums_current_times_voltage_over_rails() -> None:
    reading = parse_pmic_adc(RECORDED)
    assert len(reading.rails) == 12 and "EXT5V" not in reading.rails and "BATT" not in reading.rails
    assert reading.volts["EXT5V"] == pytest.approx(5.1202)  # input voltage kept, no current: not in the sum
    assert reading.watts == pytest.approx(EXPECTED_W) and reading.unparsed == ()


def test_unrecognised_lines_are_kept_as_unparsed_not_guessed() -> None:
    reading = parse_pmic_adc(RECORDED + "VDD_CORE power(7)=1.29W\nPMIC_TEMP=48.2'C\n")
    assert reading.watts == pytest.approx(EXPECTED_W)
    assert reading.unparsed == ("VDD_CORE power(7)=1.29W", "PMIC_TEMP=48.2'C")


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "vcgencmd"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_fake_vcgencmd_as_a_measured_source(tmp_path: Path) -> None:
    command = script(tmp_path, f'[ "$1" = pmic_read_adc ] || exit 2\ncat <<\'EOF\'\n{RECORDED}EOF\n')
    source = PmicSource(command)
    assert source.read() == pytest.approx(EXPECTED_W)
    assert (source.kind, source.scope, source.source, source.max_hz) == ("measured", "pmic-rails", "pi5-pmic", 5.0)
    assert len(source.constants()["rails"]) == 12
    calibrated = PmicSource(command, calibrated=True)
    assert calibrated.read() == pytest.approx(PITOP_SLOPE * EXPECTED_W + PITOP_OFFSET_W)
    assert (calibrated.kind, calibrated.scope) == ("estimated", "board")
    assert calibrated.constants()["calibration"] == "pitop, one board"


def test_vcgencmd_without_video_group_is_no_read_access(tmp_path: Path) -> None:
    command = script(tmp_path, 'echo "VCHI initialization failed" >&2\nexit 1\n')
    with pytest.raises(NoReadAccess, match="video"):
        PmicSource(command).read()


def test_pi4_firmware_without_pmic_read_adc_is_missing(tmp_path: Path) -> None:
    command = script(tmp_path, "echo 'error=1 error_msg=\"Command not registered\"'\nexit 255\n")
    with pytest.raises(SensorMissing, match="unsupported"):
        PmicSource(command).read()
    source, notes = open_energy_source("auto", Root(tmp_path), vcgencmd=command)
    assert any(note.startswith("pmic: vcgencmd pmic_read_adc unsupported") for note in notes)
    assert source is not None and source.kind == "estimated"


def test_output_with_no_usable_rail_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SensorError, match="no rail"):
        PmicSource(script(tmp_path, "echo 'EXT5V_V volt(24)=5.1V'\n")).read()


def test_missing_command() -> None:
    with pytest.raises(SensorMissing):
        PmicSource("/nonexistent/vcgencmd")
    with pytest.raises(SensorMissing):
        PmicSource("no-such-vcgencmd-on-path")
