"""An external meter's CSV log: integration over a window, clock offset, units, coverage; labelled figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedge.meter import Figure, IncomparableFigures, MeterLog, SensorError, attach_log_energy
from fedge.meter.figure import figure_from_fields


def test_power_log_is_integrated_with_interpolated_window_edges(tmp_path: Path) -> None:
    log_path = tmp_path / "usb-meter.csv"
    log_path.write_text("timestamp,watts\n100,4\n102,6\n104,6\n106,2\n")
    log = MeterLog.read_csv(log_path)
    assert log.joules_between(100, 106) == pytest.approx(10 + 12 + 8)
    # window 101..105: power 5 at 101, 6 at 102..104, 4 at 105
    assert log.joules_between(101, 105) == pytest.approx(0.5 * (5 + 6) + 12 + 0.5 * (6 + 4))
    figure = log.energy(101, 105)
    assert (figure.kind, figure.source, figure.scope, figure.unit) == ("measured", "external:usb-meter.csv",
                                                                       "wall", "J")


def test_cumulative_energy_log_with_clock_offset_and_iso_times(tmp_path: Path) -> None:
    log_path = tmp_path / "plug.csv"
    log_path.write_text("time,energy_wh\n2025-01-01T00:00:00+00:00,1.0\n2025-01-01T00:01:00+00:00,1.5\n")
    start = 1735689600.0  # 2025-01-01T00:00:00Z
    log = MeterLog.read_csv(log_path, clock_offset_s=-10.0)  # the plug's clock runs 10 s ahead of the host
    assert log.joules_between(start - 10, start + 50) == pytest.approx(0.5 * 3600)
    assert log.joules_between(start + 20, start + 35) == pytest.approx(0.5 * 3600 * 15 / 60)


def test_milliwatt_column_and_explicit_columns(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("t,mW,other\n0,1000,9\n10,1000,9\n")
    assert MeterLog.read_csv(path).joules_between(0, 10) == pytest.approx(10.0)
    with pytest.raises(SensorError, match="cannot tell the unit"):
        MeterLog.read_csv(path, value_column="other")


def test_a_window_the_log_does_not_cover_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("timestamp,watts\n10,1\n20,1\n")
    log = MeterLog.read_csv(path)
    with pytest.raises(SensorError, match="not the window"):
        log.joules_between(5, 15)
    records = attach_log_energy([{"round": 1, "t_start": 11, "t_end": 19, "energy_j": 3.0},
                                 {"round": 2, "t_start": 19, "t_end": 25, "energy_j": 3.0}], log)
    assert records[0]["energy_j"] == pytest.approx(8.0) and records[0]["energy_source"] == "external:m.csv"
    assert records[1]["energy_j"] is None and "not the window" in records[1]["energy_note"]
    bad = tmp_path / "bad.csv"
    bad.write_text("when,value\n1,2\n")
    with pytest.raises(SensorError, match="need a time"):
        MeterLog.read_csv(bad)


def test_figures_refuse_to_mix_kinds_sources_and_scopes() -> None:
    rapl = Figure(100.0, "J", "measured", "rapl", "cpu-package")
    assert (rapl - Figure(40.0, "J", "measured", "rapl", "cpu-package")).value == 60.0
    assert rapl.reduction_vs(Figure(200.0, "J", "measured", "rapl", "cpu-package")) == 0.5
    for other in (Figure(1.0, "J", "estimated", "rapl", "cpu-package"),
                  Figure(1.0, "J", "measured", "jetson-ina3221-hwmon", "cpu-package"),
                  Figure(1.0, "J", "measured", "rapl", "board"), Figure(1.0, "Wh", "measured", "rapl", "cpu-package")):
        with pytest.raises(IncomparableFigures, match="refusing to compare"):
            rapl - other
        with pytest.raises(IncomparableFigures):
            rapl.reduction_vs(other)
    with pytest.raises(ValueError):
        Figure(1.0, "J", "guessed", "x", "y")  # type: ignore[arg-type]
    fields = rapl.as_fields("energy_j")
    assert fields["energy_kind"] == "measured" and figure_from_fields(fields, "energy_j", "J") == Figure(
        100.0, "J", "measured", "rapl", "cpu-package")
