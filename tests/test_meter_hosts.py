"""Energy counted once per board: agents sharing a host measure the same machine, so a round's total takes each host
once; a host's figure is split among its agents by CPU seconds; records name their host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedge.meter import AgentMeter, attribute_energy, round_totals
from fedge.meter.record import host_identity


def row(host: str, joules: float | None, cpu: float | None, scope: str = "board", **extra: Any) -> dict[str, Any]:
    return {"host": host, "host_id": f"id-{host}", "energy_j": joules, "energy_kind": "estimated",
            "energy_source": "model:cpu-util", "energy_scope": scope, "cpu_s": cpu, **extra}


def test_agents_on_one_board_count_its_energy_once() -> None:
    rows = [row("laptop", 100.0, 1.0), row("laptop", 104.0, 3.0), row("laptop", 98.0, 0.0)]
    totals = round_totals(rows)
    assert totals["energy_j"] == 104.0 and totals["energy_hosts"] == 1
    assert "share a host" in totals["energy_note"] and totals["energy_j_train"] is None
    assert attribute_energy(rows) == [26.0, 78.0, 0.0]  # 104 J split 1 : 3 : 0 by CPU seconds


def test_separate_boards_add_up_and_keep_their_own_figures() -> None:
    rows = [row("pi-01", 10.0, 2.0, energy_j_train=6.0), row("pi-02", 12.0, 2.0, energy_j_train=7.0),
            row("pi-02", 11.0, 6.0, energy_j_train=5.0)]
    totals = round_totals(rows)
    assert totals["energy_j"] == 10.0 + 12.0 and totals["energy_hosts"] == 2
    assert attribute_energy(rows) == [10.0, 3.0, 9.0]


def test_one_agent_per_board_is_the_plain_sum_with_phases() -> None:
    rows = [row("pi-01", 10.0, 2.0, energy_j_train=6.0), row("pi-02", 12.0, 2.0, energy_j_train=7.0)]
    totals = round_totals(rows)
    assert totals["energy_j"] == 22.0 and totals["energy_j_train"] == 13.0 and totals["energy_note"] is None
    assert attribute_energy(rows) == [10.0, 12.0]


def test_a_process_share_is_summed_even_on_one_host() -> None:
    rows = [row("laptop", 5.0, 1.0, "process-share"), row("laptop", 7.0, 1.0, "process-share")]
    assert round_totals(rows)["energy_j"] == 12.0
    assert attribute_energy(rows) == [5.0, 7.0]


def test_unknown_energy_or_cpu_gives_no_share() -> None:
    rows = [row("laptop", 100.0, None), row("laptop", 104.0, 3.0), row("pi-01", None, 1.0)]
    assert attribute_energy(rows) == [None, None, None]
    assert round_totals(rows)["energy_j"] is None


def test_records_without_a_host_are_each_their_own_host() -> None:
    rows = [row("x", 10.0, 1.0), row("x", 12.0, 1.0)]
    for record in rows:
        del record["host"], record["host_id"]
    assert round_totals(rows)["energy_j"] == 22.0 and round_totals(rows)["energy_hosts"] == 2
    assert attribute_energy(rows) == [10.0, 12.0]


def test_cloned_images_with_one_machine_id_but_two_names_stay_apart() -> None:
    rows = [row("pi-01", 10.0, 1.0, host_id="same"), row("pi-02", 12.0, 1.0, host_id="same")]
    assert round_totals(rows)["energy_j"] == 22.0


def test_same_host_names_on_different_machines_stay_apart(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("0123456789abcdef0123456789abcdef\n")
    (tmp_path / "b").write_text("fedcba9876543210fedcba9876543210\n")
    name_a, id_a = host_identity(str(tmp_path / "a"))
    name_b, id_b = host_identity(str(tmp_path / "b"))
    assert name_a == name_b and id_a != id_b and len(id_a) == 16
    assert host_identity(str(tmp_path / "missing"))[1] == f"name:{name_a}"


@pytest.mark.parametrize("machine_id", [True, False])
def test_every_record_names_its_host(tmp_path: Path, machine_id: bool) -> None:
    if machine_id:
        (tmp_path / "etc").mkdir()
        (tmp_path / "etc" / "machine-id").write_text("00112233445566778899aabbccddeeff\n")
    meter = AgentMeter(energy="none", sysfs_root=tmp_path)
    meter.begin_round(1)
    record = meter.end_round()
    assert record["host"] and record["host_id"] == meter.host[1]
    assert record["host_id"].startswith("name:") != machine_id
