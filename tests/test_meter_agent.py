"""AgentMeter rounds on a fake sysfs tree, and round_totals over agents."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fedge.meter import AgentMeter, FlopCounter, ParamSnapshot, mask_elements, round_totals

REQUIRED = ("round", "flops_train", "flops_fwd_bwd", "flops_opt_executed", "flops_opt_updated",
            "flops_theoretical_sparse", "batch_size", "steps", "params_total", "params_updated", "energy_j",
            "energy_kind", "energy_source", "energy_scope", "cpu_s", "rss_peak_mb", "cpu_s_train", "cpu_s_encode",
            "cpu_s_send", "cpu_s_decode", "bytes_payload_down", "bytes_payload_up", "bytes_zmtp_down",
            "bytes_zmtp_up", "bytes_tcp_down", "bytes_tcp_up", "temp_c_max", "cpu_freq_mhz_min")


def write(root: Path, path: str, value: object) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"{value}\n")


@pytest.fixture
def board(tmp_path: Path) -> Path:
    """A Pi-4-like tree: an INA219 on the 5 V feed reading a steady 4 W, one thermal zone, two cpufreq CPUs."""
    write(tmp_path, "/sys/class/hwmon/hwmon0/name", "ina219")
    write(tmp_path, "/sys/class/hwmon/hwmon0/power1_input", 4_000_000)
    write(tmp_path, "/sys/class/thermal/thermal_zone0/type", "cpu-thermal")
    write(tmp_path, "/sys/class/thermal/thermal_zone0/temp", 61500)
    write(tmp_path, "/sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq", 1_800_000)
    write(tmp_path, "/sys/devices/system/cpu/cpu1/cpufreq/scaling_cur_freq", 1_200_000)
    return tmp_path


def train_masked(model: nn.Module, masks: dict[str, torch.Tensor], batches: list[int]) -> None:
    """Adam on masked gradients, re-masking after each step so only mask coordinates (and biases) move."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for size in batches:
        frozen = {name: p.detach().clone() for name, p in model.named_parameters() if name in masks}
        optimizer.zero_grad()
        model(torch.randn(size, 3, 8, 8)).square().mean().backward()
        optimizer.step()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name in masks:
                    p.copy_(torch.where(masks[name], p, frozen[name]))


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(256, 10))


def test_a_round_records_every_figure(board: Path) -> None:
    model = small_model()
    masks = {"0.weight": torch.rand(4, 3, 3, 3) < 0.5, "3.weight": torch.rand(10, 256) < 0.5}
    batches = [16, 16, 16, 5]
    meter = AgentMeter(energy="auto", sysfs_root=board, sample_hz=50.0)
    meter.add_connection("DEALER", "ROUTER", identity=b"agent-3")  # before the first round: counted in it
    meter.prepare_training(model, (3, 8, 8), batches)
    assert meter.flops.cached == 2
    with meter:
        meter.begin_round(7)
        meter.add_bytes("down", 5000, [5000])
        with meter.phase("decode"):
            time.sleep(0.02)
        with meter.phase("train"):
            snapshot = ParamSnapshot(model)
            train_masked(model, masks, batches)
            time.sleep(0.1)
        meter.add_training(model, (3, 8, 8), batches, "adam", updated_elements=snapshot.changed(model),
                           mask_claim=mask_elements(model, masks),
                           densities={name: float(m.float().mean()) for name, m in masks.items()})
        with meter.phase("encode"):
            pass
        with meter.phase("send"):
            meter.add_bytes("up", 2000, [4, 1996])
        record = meter.end_round()
    assert not meter.sampler.running
    assert set(REQUIRED) <= set(record)
    assert all(not isinstance(v, dict | list) for v in record.values())
    json.dumps(record)

    claim = mask_elements(model, masks)
    fwd_bwd = FlopCounter().training(model, (3, 8, 8), batches)
    assert record["round"] == 7 and record["steps"] == 4 and record["batch_size"] == 16 and record["samples"] == 53
    assert record["flops_fwd_bwd"] == fwd_bwd
    assert record["params_total"] == record["params_trainable"] == 4 * 27 + 4 + 2560 + 10
    assert record["params_updated"] <= claim == record["params_mask_claim"]
    assert record["flops_opt_executed"] == 13 * record["params_total"] * 4
    assert record["flops_opt_updated"] == 13 * record["params_updated"] * 4
    assert record["flops_train"] == fwd_bwd + record["flops_opt_executed"]
    assert record["flops_theoretical_sparse"] < fwd_bwd
    assert record["notes"] is None

    assert (record["energy_kind"], record["energy_source"], record["energy_scope"]) == (
        "measured", "ina2xx-hwmon", "board")
    assert record["energy_j"] == pytest.approx(4.0 * record["wall_s"], rel=0.1)
    assert record["energy_j_train"] == pytest.approx(4.0 * record["wall_s_train"], rel=0.1)
    assert record["energy_samples"] >= 5 and record["energy_hz"] == 50.0 and record["energy_errors"] == 0
    assert record["cpu_s_train"] > 0 and record["cpu_s"] >= record["cpu_s_train"]
    assert record["cpu_s_receive"] is None and record["wall_s_decode"] >= 0.02
    assert record["rss_peak_mb"] >= record["rss_peak_mb_train"] > 0
    assert record["temp_c_max"] == 61.5 and record["cpu_freq_mhz_min"] == 1200.0

    handshake_up, handshake_down = 64 + 50, 64 + 43
    assert (record["bytes_payload_down"], record["bytes_payload_up"]) == (5000, 2000)
    assert record["bytes_zmtp_down"] == handshake_down + 5009
    assert record["bytes_zmtp_up"] == handshake_up + 6 + 2005
    assert record["bytes_handshake_up"] == handshake_up and record["bytes_tcp_up"] is None
    assert record["bytes_wire_est_up"] > record["bytes_zmtp_up"]


def net_dev(root: Path, rx: int, tx: int) -> None:
    write(root, "/proc/net/dev", "Inter-|   Receive\n face |bytes    packets\n"
          f"  eth0: {rx} 10 0 0 0 0 0 0 {tx} 20 0 0 0 0 0 0\n")


def test_misuse_is_refused_and_unknowns_stay_null(tmp_path: Path) -> None:
    net_dev(tmp_path, 1000, 500)
    meter = AgentMeter(energy="none", sysfs_root=tmp_path, iface="eth0")
    with pytest.raises(RuntimeError, match="begin_round"):
        with meter.phase("train"):
            pass
    meter.add_bytes("up", 10)  # before a round: counted in the next one
    meter.begin_round(1)
    with pytest.raises(RuntimeError, match="still open"):
        meter.begin_round(2)
    with pytest.raises(ValueError):
        meter.add_bytes("sideways", 1)
    with pytest.raises(ValueError):
        with meter.phase("Train Phase"):
            pass
    model = nn.Linear(4, 2)
    with pytest.raises(ValueError, match="updated_elements"):
        meter.add_training(model, (4,), [8], updated_elements=11)
    with pytest.warns(UserWarning):
        meter.add_training(model, (4,), [8, 8], "lion", updated_elements=6, mask_claim=4)
    net_dev(tmp_path, 4000, 1500)
    record = meter.end_round()
    assert (record["iface"], record["iface_rx_bytes"], record["iface_tx_bytes"]) == ("eth0", 3000, 1000)
    assert record["bytes_payload_up"] == 10 and record["bytes_zmtp_up"] == 12
    assert record["flops_fwd_bwd"] == 2 * FlopCounter().training(model, (4,), [8])
    assert record["flops_opt_executed"] is None and record["flops_train"] is None
    assert "lion" in record["notes"] and "exceed the mask's claim" in record["notes"]
    assert "6" not in record["notes"]  # no count in the note: secure aggregation drops params_updated, not notes
    assert record["energy_j"] is None and record["energy_note"] == "energy metering off"
    assert record["temp_c_max"] is None and record["cpu_freq_mhz_min"] is None
    assert meter.stop()


def agent_record(**overrides: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "round": 3, "flops_train": 100, "flops_fwd_bwd": 80, "flops_opt_executed": 20, "flops_opt_updated": 10,
        "flops_theoretical_sparse": None, "steps": 4, "cpu_s": 1.5, "rss_peak_mb": 200.0, "bytes_payload_up": 1000,
        "bytes_zmtp_up": 1100, "bytes_tcp_up": 1101, "temp_c_max": 60.0, "cpu_freq_mhz_min": 1500.0,
        "energy_j": 10.0, "energy_kind": "measured", "energy_source": "rapl", "energy_scope": "cpu-package",
        "energy_j_train": 8.0}
    record.update(overrides)
    return record


def test_round_totals_sum_max_min() -> None:
    totals = round_totals([agent_record(), agent_record(rss_peak_mb=300.0, cpu_freq_mhz_min=600.0, energy_j=5.0)])
    assert totals["agents"] == 2 and totals["round"] == 3
    assert (totals["flops_train"], totals["flops_opt_updated"], totals["steps"]) == (200, 20, 8)
    assert (totals["bytes_zmtp_up"], totals["bytes_tcp_up"], totals["cpu_s"]) == (2200, 2202, 3.0)
    assert (totals["rss_peak_mb"], totals["temp_c_max"], totals["cpu_freq_mhz_min"]) == (300.0, 60.0, 600.0)
    assert totals["energy_j"] == 15.0 and totals["energy_j_train"] == 16.0
    assert (totals["energy_kind"], totals["energy_source"], totals["energy_scope"]) == (
        "measured", "rapl", "cpu-package")
    assert totals["flops_theoretical_sparse"] is None and totals["totals_note"] is None


def test_round_totals_refuse_partial_sums_and_mixed_energy() -> None:
    totals = round_totals([agent_record(), agent_record(bytes_tcp_up=None, energy_kind="estimated",
                                                        energy_source="model:cpu-linear", energy_scope="board")])
    assert totals["bytes_tcp_up"] is None and "bytes_tcp_up unknown for 1 of 2 agents" in totals["totals_note"]
    assert totals["energy_j"] is None and totals["energy_kind"] is None
    assert "differ in kind/source/scope" in totals["energy_note"]
    assert "unknown for 1 of 2" in round_totals([agent_record(), agent_record(energy_j=None)])["energy_note"]
    assert round_totals([])["agents"] == 0
