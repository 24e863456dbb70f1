"""Energy sources on fake sysfs trees: RAPL wraparound and permissions, both Jetson layouts, ina2xx, missing sensors,
auto-detection order, integration of a scripted power series, the sampler thread and the CPU model."""

from __future__ import annotations

import os
import stat
import time
import types
from pathlib import Path

import pytest

import fedge.meter.external
import fedge.meter.sysfs
from fedge.meter import (
    CpuModelSource,
    EnergyIntegrator,
    Ina2xxSource,
    JetsonHwmonSource,
    JetsonIioSource,
    NoReadAccess,
    RaplSource,
    Root,
    Sampler,
    SensorError,
    SensorMissing,
    open_energy_source,
)


def write(root: Path, path: str, value: object) -> Path:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"{value}\n")
    return target


def rapl_zone(root: Path, zone: str, name: str, energy_uj: int, max_uj: int = 262_143_328_850) -> None:
    base = f"/sys/class/powercap/{zone}"
    write(root, f"{base}/name", name)
    write(root, f"{base}/energy_uj", energy_uj)
    write(root, f"{base}/max_energy_range_uj", max_uj)


def jetson_hwmon(root: Path, device: str, rails: dict[int, tuple[str, int, int]]) -> None:
    """JetPack 5/6 layout: channel -> (label, bus mV, mA)."""
    base = f"/sys/bus/i2c/drivers/ina3221/{device}/hwmon/hwmon3"
    write(root, f"{base}/name", "ina3221")
    for channel, (label, millivolts, milliamps) in rails.items():
        write(root, f"{base}/in{channel}_label", label)
        write(root, f"{base}/in{channel}_input", millivolts)
        write(root, f"{base}/curr{channel}_input", milliamps)
    write(root, f"{base}/in7_label", "sum of shunt voltages")
    write(root, f"{base}/in7_input", 120)


def jetson_iio(root: Path, rails: dict[int, tuple[str, int]]) -> None:
    """JetPack 4 layout (Nano): channel -> (rail name, mW); current and voltage files as well."""
    base = "/sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0"
    for channel, (label, milliwatts) in rails.items():
        write(root, f"{base}/rail_name_{channel}", label)
        write(root, f"{base}/in_power{channel}_input", milliwatts)
        write(root, f"{base}/in_current{channel}_input", milliwatts // 5)
        write(root, f"{base}/in_voltage{channel}_input", 5000)


def ina2xx(root: Path, index: int, name: str, microwatts: int | None) -> None:
    write(root, f"/sys/class/hwmon/hwmon{index}/name", name)
    if microwatts is not None:
        write(root, f"/sys/class/hwmon/hwmon{index}/power1_input", microwatts)


def test_rapl_sums_packages_handles_wraparound_and_skips_nested_and_psys(tmp_path: Path) -> None:
    rapl_zone(tmp_path, "intel-rapl:0", "package-0", 900_000, max_uj=1_000_000)
    rapl_zone(tmp_path, "intel-rapl:0:0", "core", 5)
    rapl_zone(tmp_path, "intel-rapl:0:1", "dram", 5)
    rapl_zone(tmp_path, "intel-rapl:1", "package-1", 10)
    rapl_zone(tmp_path, "intel-rapl:2", "psys", 10)
    source = RaplSource(Root(tmp_path))
    assert source.constants() == {"zones": ["package-0", "package-1"]} and "psys" in source.method
    assert (source.kind, source.scope, source.mode) == ("measured", "cpu-package", "energy")
    assert source.read() == 0.0
    write(tmp_path, "/sys/class/powercap/intel-rapl:0/energy_uj", 100_000)  # wrapped past 1 J
    write(tmp_path, "/sys/class/powercap/intel-rapl:1/energy_uj", 300_010)
    write(tmp_path, "/sys/class/powercap/intel-rapl:0:0/energy_uj", 999_999_999)  # never read
    assert source.read() == pytest.approx(0.2 + 0.3)


@pytest.fixture
def enforce_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Root ignores file modes; emulate an unprivileged reader by refusing files without read bits."""
    original = fedge.meter.sysfs.read_file

    def guarded(path: Path) -> str:
        if not os.stat(path).st_mode & 0o444:
            raise PermissionError(13, "Permission denied", str(path))
        return original(path)

    monkeypatch.setattr(fedge.meter.sysfs, "read_file", guarded)


def test_unreadable_rapl_is_reported_and_auto_falls_back_to_the_labelled_estimate(
        tmp_path: Path, enforce_modes: None) -> None:
    rapl_zone(tmp_path, "intel-rapl:0", "package-0", 1000)
    os.chmod(tmp_path / "sys/class/powercap/intel-rapl:0/energy_uj", 0)
    with pytest.raises(NoReadAccess, match=r"no read access to /sys/class/powercap/intel-rapl:0/energy_uj .*root"):
        RaplSource(Root(tmp_path)).read()
    source, notes = open_energy_source("auto", Root(tmp_path), vcgencmd=str(tmp_path / "absent"))
    assert isinstance(source, CpuModelSource) and source.kind == "estimated"
    assert any(note.startswith("rapl: no read access") for note in notes)
    assert notes[-1].startswith("no readable power sensor")
    with pytest.raises(SensorError, match="energy source 'rapl' unavailable: rapl: no read access"):
        open_energy_source("rapl", Root(tmp_path))
    os.chmod(tmp_path / "sys/class/powercap/intel-rapl:0/energy_uj", stat.S_IRUSR | stat.S_IWUSR)


def test_jetson_jp5_orin_nano_uses_vdd_in_only(tmp_path: Path) -> None:
    jetson_hwmon(tmp_path, "1-0040", {1: ("VDD_IN", 5000, 1200), 2: ("VDD_CPU_GPU_CV", 5000, 400),
                                      3: ("VDD_SOC", 5000, 300)})
    source = JetsonHwmonSource(Root(tmp_path))
    assert source.read() == pytest.approx(6.0)
    assert source.scope == "module" and source.method == "rail VDD_IN (module total)"


def test_jetson_jp5_agx_orin_sums_rails_across_devices_and_skips_nc(tmp_path: Path) -> None:
    jetson_hwmon(tmp_path, "1-0040", {1: ("VDD_GPU_SOC", 5000, 1000), 2: ("VDD_CPU_CV", 5000, 600),
                                      3: ("VIN_SYS_5V0", 5000, 400)})
    jetson_hwmon(tmp_path, "1-0041", {1: ("NC", 5000, 9999), 2: ("VDDQ_VDD2_1V8AO", 5000, 200)})
    source = JetsonHwmonSource(Root(tmp_path))
    assert source.read() == pytest.approx(5.0 + 3.0 + 2.0 + 1.0)
    assert source.constants()["rails"] == ["VDDQ_VDD2_1V8AO", "VDD_CPU_CV", "VDD_GPU_SOC", "VIN_SYS_5V0"]


def test_jetson_jp4_iio_reads_milliwatts_and_prefers_pom_5v_in(tmp_path: Path) -> None:
    jetson_iio(tmp_path, {0: ("POM_5V_IN", 3000), 1: ("POM_5V_GPU", 500), 2: ("POM_5V_CPU", 900)})
    source = JetsonIioSource(Root(tmp_path))
    assert source.read() == pytest.approx(3.0) and source.source == "jetson-ina3221-iio"


def test_jetson_jp4_without_a_total_rail_sums(tmp_path: Path) -> None:
    jetson_iio(tmp_path, {1: ("POM_5V_GPU", 500), 2: ("POM_5V_CPU", 900)})
    assert JetsonIioSource(Root(tmp_path)).read() == pytest.approx(1.4)


def test_ina2xx_picks_the_shunt_monitor_in_microwatts(tmp_path: Path) -> None:
    ina2xx(tmp_path, 0, "acpitz", None)
    ina2xx(tmp_path, 1, "ina3221", 7_000_000)
    ina2xx(tmp_path, 2, "ina219", 2_500_000)
    ina2xx(tmp_path, 3, "ina226", 1_000_000)
    source = Ina2xxSource(Root(tmp_path))
    assert source.read() == pytest.approx(2.5)
    assert "ina219@hwmon2" in source.method and "not summed: ina226@hwmon3" in source.method
    assert Ina2xxSource(Root(tmp_path), device="ina226", scope="5V-rail").scope == "5V-rail"


@pytest.mark.parametrize("source_class", [RaplSource, JetsonHwmonSource, JetsonIioSource, Ina2xxSource])
def test_missing_sensors_raise_sensor_missing(tmp_path: Path, source_class: type) -> None:
    with pytest.raises(SensorMissing):
        source_class(Root(tmp_path))


def fake_vcgencmd(tmp_path: Path, output: str = "VDD_CORE_A current(7)=2.0A\nVDD_CORE_V volt(15)=0.9V") -> str:
    script = tmp_path / "bin" / "vcgencmd"
    script.parent.mkdir(exist_ok=True)
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\n")
    script.chmod(0o755)
    return str(script)


def test_auto_detection_order(tmp_path: Path) -> None:
    root = Root(tmp_path)
    vcgencmd = fake_vcgencmd(tmp_path)
    assert open_energy_source("auto", root, vcgencmd)[0].source == "pi5-pmic"  # type: ignore[union-attr]
    ina2xx(tmp_path, 0, "ina219", 2_000_000)
    assert open_energy_source("auto", root, vcgencmd)[0].source == "ina2xx-hwmon"  # type: ignore[union-attr]
    jetson_iio(tmp_path, {0: ("POM_5V_IN", 3000)})
    assert open_energy_source("auto", root, vcgencmd)[0].source == "jetson-ina3221-iio"  # type: ignore[union-attr]
    jetson_hwmon(tmp_path, "1-0040", {1: ("VDD_IN", 5000, 1000)})
    assert open_energy_source("auto", root, vcgencmd)[0].source == "jetson-ina3221-hwmon"  # type: ignore[union-attr]
    rapl_zone(tmp_path, "intel-rapl:0", "package-0", 1)
    source, notes = open_energy_source("auto", root, vcgencmd)
    assert source is not None and source.source == "rapl" and notes == []
    assert open_energy_source("ina2xx", root, vcgencmd)[0].source == "ina2xx-hwmon"  # type: ignore[union-attr]
    assert open_energy_source("none", root) == (None, ["energy metering off"])
    with pytest.raises(ValueError):
        open_energy_source("wattmeter", root)


def test_nothing_present_notes_every_source_and_uses_the_model(tmp_path: Path) -> None:
    source, notes = open_energy_source("auto", Root(tmp_path), vcgencmd=str(tmp_path / "absent"),
                                       estimate={"idle_w": 3.0, "max_w": 7.5, "origin": "bench calibration"})
    assert isinstance(source, CpuModelSource)
    assert [note.split(":")[0] for note in notes[:-1]] == ["rapl", "jetson", "jetson", "ina2xx", "pmic"]
    assert source.constants()["idle_w"] == 3.0 and "bench calibration" in source.method


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_integrator_trapezoid_on_a_scripted_power_series(tmp_path: Path) -> None:
    jetson_hwmon(tmp_path, "1-0040", {1: ("VDD_IN", 5000, 1000)})
    current = tmp_path / "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3/curr1_input"
    clock = FakeClock()
    integrator = EnergyIntegrator(JetsonHwmonSource(Root(tmp_path)), clock=clock)
    for t, milliamps in [(0.0, 1000), (1.0, 1400), (3.0, 1400), (3.5, 600)]:  # 5 W, 7 W, 7 W, 3 W
        clock.now = t
        current.write_text(f"{milliamps}\n")
        integrator.sample()
    tally = integrator.tally(fresh=False)
    assert tally.joules == pytest.approx(6.0 + 14.0 + 2.5)
    assert (tally.samples, tally.max_gap_s, tally.errors) == (4, 2.0, 0)
    current.unlink()
    clock.now = 4.0
    integrator.sample()
    assert integrator.tally(fresh=False).errors == 1 and "does not exist" in str(integrator.tally().last_error)


def test_integrator_respects_max_hz_when_not_forced(tmp_path: Path) -> None:
    clock = FakeClock()
    source = CpuModelSource()
    source.max_hz = 5.0
    integrator = EnergyIntegrator(source, clock=clock)
    for t in (0.0, 0.1, 0.15, 0.2, 0.4):
        clock.now = t
        integrator.sample(force=False)
    assert integrator.tally(fresh=False).samples == 3


def test_sampler_runs_callbacks_and_stops_cleanly() -> None:
    calls: list[float] = []

    def failing() -> None:
        raise RuntimeError("sensor hiccup")

    sampler = Sampler(100.0, [lambda: calls.append(time.monotonic()), failing])
    sampler.start()
    time.sleep(0.2)
    assert sampler.running
    assert sampler.stop(timeout=2.0) and not sampler.running
    count = len(calls)
    time.sleep(0.05)
    assert 5 <= count == len(calls)
    assert sampler.failures and "sensor hiccup" in sampler.failures[0]
    with pytest.raises(ValueError):
        Sampler(0)


def test_cpu_model_is_labelled_estimated_and_integrates_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    now, busy = [100.0], [50.0]
    monkeypatch.setattr(fedge.meter.external, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(CpuModelSource, "_busy_s", lambda self: busy[0])
    source = CpuModelSource(idle_w=2.0, max_w=10.0, share="process")
    assert (source.kind, source.scope, source.source) == ("estimated", "process-share", "model:cpu-linear")
    cores = source.constants()["cores"]
    now[0], busy[0] = 110.0, 50.0 + 5.0
    assert source.read() == pytest.approx(2.0 * 10 + 8.0 * 5.0 / cores)
    busy[0] = 50.0 + 1000.0  # more busy time than the cores could have run is clamped
    assert source.read() == pytest.approx(10.0 * 10)
    with pytest.raises(ValueError):
        CpuModelSource(idle_w=5.0, max_w=1.0)


def test_cpu_model_on_the_real_machine_grows_with_time() -> None:
    source = CpuModelSource(idle_w=2.0, max_w=6.0)
    first = source.read()
    time.sleep(0.05)
    assert source.read() >= first + 2.0 * 0.05 - 1e-9
