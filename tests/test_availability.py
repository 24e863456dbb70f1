"""Availability rules: the pure decision, the board readings from a fake sysfs, the TOML, the agent's decline and
the coordinator's rule that a declined round is not a failure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedge import codec
from fedge.edge_agent.availability import Readings, Rules, in_window, read_readings, why_not
from fedge.edge_agent.config import load_settings
from tests.agent_frames import joined, kinds, task
from tests.coordinator_frames import frame, protocol
from tests.coordinator_frames import joined as joined_coordinator

IDLE = Readings(load_per_core=0.1, on_mains=True, temp_c=45.0, minute_of_day=23 * 60)


def test_each_rule_says_why_the_device_may_not_train() -> None:
    assert why_not(Rules(), IDLE) == ""
    assert "load 0.90 per core > availability.max_load 0.5" in why_not(Rules(max_load=0.5), Readings(0.9, True, 40, 0))
    assert why_not(Rules(power="mains"), Readings(0.1, False, 40, 0)) == "on battery (availability.power = mains)"
    assert why_not(Rules(power="mains"), Readings(0.1, None, 40, 0)) == ""  # a board that reports no supply
    assert "outside the training windows 01:00-05:00 (now 23:00)" in why_not(Rules(windows=("01:00-05:00",)), IDLE)
    assert why_not(Rules(windows=("22:00-06:00",)), IDLE) == ""  # over midnight
    assert "too hot: 81.5 °C" in why_not(Rules(max_temp_c=80), Readings(0.1, True, 81.5, 0))
    assert in_window("22:00-06:00", 3 * 60) and not in_window("22:00-06:00", 12 * 60)
    assert in_window("08:00-17:30", 17 * 60 + 29) and not in_window("08:00-17:30", 17 * 60 + 30)


@pytest.mark.parametrize("table, match", [({"max_load": -1}, "max_load"), ({"power": "solar"}, "power"),
                                          ({"windows": ["25:00-26:00"]}, "windows"), ({"windows": "22:00-06:00"},
                                                                                      "windows"),
                                          ({"max_temp_c": "hot"}, "max_temp_c"), ({"when": 1}, "unknown key")])
def test_a_bad_rule_is_refused_when_the_toml_is_read(table: dict[str, Any], match: str, tmp_path: Path) -> None:
    import tomli_w

    path = tmp_path / "agent.toml"
    path.write_text(tomli_w.dumps({"agent": {"coordinator": "tcp://127.0.0.1:1", "client_id": "pi", "data": "x.npz"},
                                   "availability": table}))
    with pytest.raises(ValueError, match=match):
        load_settings(str(path), {})


def test_readings_come_from_the_board(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "loadavg").write_text("3.00 2.00 1.00 1/100 999\n")
    for name, kind, files in (("AC", "Mains", {"online": "0"}), ("BAT0", "Battery", {"status": "Charging"})):
        supply = tmp_path / "sys/class/power_supply" / name
        supply.mkdir(parents=True)
        (supply / "type").write_text(kind + "\n")
        for key, value in files.items():
            (supply / key).write_text(value + "\n")
    for index, milli in enumerate((41000, 67500)):
        zone = tmp_path / "sys/class/thermal" / f"thermal_zone{index}"
        zone.mkdir(parents=True)
        (zone / "temp").write_text(f"{milli}\n")
    readings = read_readings(tmp_path, now=0.0)
    assert readings.on_mains is True and readings.temp_c == 67.5  # charging counts as mains
    assert readings.load_per_core is not None and readings.load_per_core > 0
    (tmp_path / "sys/class/power_supply/BAT0/status").write_text("Discharging\n")
    assert read_readings(tmp_path).on_mains is False
    empty = read_readings(tmp_path / "nothing")
    assert (empty.load_per_core, empty.on_mains, empty.temp_c) == (None, None, None)


def test_an_agent_that_may_not_train_declines_and_the_coordinator_does_not_count_a_failure() -> None:
    agent = joined()
    assert kinds(agent.receive(task(3), 0.0)) == ["Train"]
    actions = agent.decline_task(3, "too hot: 85.0 °C > availability.max_temp_c 80")
    (declined,) = [a.message for a in actions if type(a).__name__ == "Send"]
    assert isinstance(declined, codec.ErrorMessage) and declined.code == "unavailable" and declined.round == 3
    assert agent.holding is None and "declined round 3: too hot" in agent.status(training=False)
    assert kinds(agent.receive(task(4), 1.0)) == ["Train"]  # the next task is trained as usual

    p = protocol(algorithm="ef-fedavg")
    forgotten: list[int] = []
    p.server.forget = forgotten.append  # type: ignore[method-assign]
    joined_coordinator(p, "a", "b")
    p.open_round(1, [0, 1], 0.0, 30.0)
    busy = frame(codec.ErrorMessage(run_id="run-1", round=1, sender="b", code="unavailable", reason="on battery"))
    p.receive(b"b", busy, 1.0)
    assert p.current.unavailable == {1: "on battery"} and p.current.awaited() == [0]  # type: ignore[union-attr]
    assert not p.complete(1.0)
    stale = frame(codec.ErrorMessage(run_id="run-1", round=7, sender="a", code="unavailable", reason="x"))
    p.receive(b"a", stale, 1.0)  # another round's decline changes nothing
    assert p.current.unavailable == {1: "on battery"}  # type: ignore[union-attr]
    assert forgotten == [] and 1 not in p.current.failed  # type: ignore[union-attr]
