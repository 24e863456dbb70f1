"""Process figures: CPU clocks, peak RSS windows (exact and sampled), temperatures and CPU frequencies on fake trees."""

from __future__ import annotations

import mmap
from pathlib import Path

from fedge.meter import Root
from fedge.meter.process import ContextWatch, PeakRss, cpu_clock, read_cpu_freqs_mhz, read_temperatures

MB = 1024 * 1024


def write(root: Path, path: str, value: object) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"{value}\n")


def test_cpu_clock_counts_this_process_and_thread() -> None:
    before = cpu_clock()
    total = sum(i * i for i in range(300_000))
    after = cpu_clock()
    assert total > 0
    assert after.wall > before.wall and after.thread > before.thread
    assert (after.user + after.system) >= (before.user + before.system)


def test_peak_rss_windows_see_a_transient_allocation() -> None:
    rss = PeakRss()
    rss.take()
    # An anonymous mapping of its own, unmapped on close: a bytearray goes through malloc, which in a long-lived
    # worker may reuse memory already resident (CI saw that: the block never raised the RSS it was measured against).
    block = mmap.mmap(-1, 64 * MB)
    for offset in range(0, 64 * MB, mmap.PAGESIZE):  # touch every page
        block[offset] = 1
    block.close()
    peak_with_block = rss.take()
    peak_after = rss.take()
    if rss.exact:  # the kernel's high-water mark sees the freed block; a sampler could not
        assert peak_with_block - peak_after >= 48 * MB


def test_peak_rss_falls_back_to_sampling(tmp_path: Path) -> None:
    rss = PeakRss(proc_self=tmp_path)  # no clear_refs/status here
    assert not rss.exact and "sampled" in rss.method
    rss.sample()
    assert rss.take() > 0


def test_temperatures_and_frequencies_from_a_fake_tree(tmp_path: Path) -> None:
    write(tmp_path, "/sys/class/thermal/thermal_zone0/type", "cpu-thermal")
    write(tmp_path, "/sys/class/thermal/thermal_zone0/temp", 48250)
    write(tmp_path, "/sys/class/thermal/thermal_zone1/type", "cpu-thermal")
    write(tmp_path, "/sys/class/thermal/thermal_zone1/temp", 51000)
    write(tmp_path, "/sys/class/thermal/thermal_zone2/temp", "not a number")
    write(tmp_path, "/sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq", 1_500_000)
    write(tmp_path, "/sys/devices/system/cpu/cpu1/cpufreq/scaling_cur_freq", 600_000)
    write(tmp_path, "/sys/devices/system/cpu/cpufreq/policy0/scaling_cur_freq", 1)  # not a cpuN directory
    root = Root(tmp_path)
    assert read_temperatures(root) == {"cpu-thermal": 48.25, "cpu-thermal@thermal_zone1": 51.0}
    assert read_cpu_freqs_mhz(root) == {"cpu0": 1500.0, "cpu1": 600.0}
    watch = ContextWatch(root)
    watch.sample()
    write(tmp_path, "/sys/class/thermal/thermal_zone1/temp", 45000)
    write(tmp_path, "/sys/devices/system/cpu/cpu1/cpufreq/scaling_cur_freq", 1_200_000)
    assert watch.take() == (51.0, "cpu-thermal@thermal_zone1", 600.0)
    assert watch.take() == (48.25, "cpu-thermal", 1200.0)


def test_a_machine_without_sensors_gives_nothing(tmp_path: Path) -> None:
    root = Root(tmp_path)
    assert read_temperatures(root) == {} and read_cpu_freqs_mhz(root) == {}
    assert ContextWatch(root).take() == (None, None, None)
