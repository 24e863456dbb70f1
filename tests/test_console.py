"""What ``coordinator start`` prints before round 1: a one-line summary instead of the configuration, and for a
bound coordinator the address with its real port, CurveZMQ, the key files, and a waiting line that follows agents
joining and names a refused key (a real coordinator and agent on 127.0.0.1, cleaned up by pid)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedge.plumbing.keys import AGENT_KEY, generate_keys
from fedge.runtime.console import WaitingLine
from tests.e2e import Processes, endpoint, finished, shards, wait_for
from tests.inprocess_cli import coordinator_main


def test_the_waiting_line_follows_the_count_at_most_once_a_second_and_names_each_refused_key_once_even_when_it_retries() -> None:
    lines: list[str] = []
    waiting = WaitingLine(lines.append, every_s=1.0)
    waiting(0.0, 0, 3)
    waiting(0.2, 1, 3)   # within the second: not yet
    waiting(1.1, 1, 3)
    waiting(1.2, 1, 3, 2, ["KEY-A", "KEY-B"])
    waiting(1.3, 1, 3, 2, ["KEY-A", "KEY-B"])  # nothing new
    waiting(1.4, 3, 3, 4, ["KEY-A", "KEY-B", "KEY-C", "KEY-A"])  # all joined: at once; KEY-A retried
    assert lines == ["waiting for 3 agent(s) (0 connected)", "waiting for 3 agent(s) (1 connected)",
                     *[f"refused a device: its public key KEY-{k} is not in the allow-list (add it as "
                       "allowed/CLIENT_ID.key)" for k in "AB"],
                     "3 agent(s) connected; starting",
                     "refused a device: its public key KEY-C is not in the allow-list (add it as "
                     "allowed/CLIENT_ID.key)"]


def test_a_bound_coordinator_says_where_it_listens_which_keys_devices_need_and_who_it_waits_for(
        procs: Processes, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    data = next(shards(tmp_path, 1).glob("client-*.npz"))
    coordinator = procs.coordinator(
        "--bind", "tcp://127.0.0.1:0", "--expect", "1", "--rounds", "1", "--run-dir", str(run_dir),
        "--model", "mlp", "--set", "security.curve=\"on\"", "--set", "data.train_limit=200",
        "--set", "fleet.heartbeat_s=0.5", "--set", "fleet.liveness_s=6.0", "--set", "run.export_onnx=false")
    address = endpoint(run_dir)
    keys = tmp_path / "device-keys"
    generate_keys(keys, AGENT_KEY)  # what `edge-agent keygen --keys-dir KEYS` writes
    procs.agent("--coordinator", address, "--client-id", "pi-01", "--data", str(data),
                "--state-dir", str(tmp_path / "device"), "--curve", "on", "--keys-dir", str(keys),
                "--coordinator-key", str(run_dir / "keys" / "coordinator.key"), name="device")
    public = (keys / "agent.key").read_text().strip().splitlines()[-1].split('"')[1]
    wait_for(lambda: public in procs.output("coordinator"), 60, "the console to name the refused key")
    (run_dir / "keys" / "allowed" / "pi-01.key").write_bytes((keys / "agent.key").read_bytes())
    assert finished(coordinator, 180) == 0, procs.output("coordinator")
    out = procs.output("coordinator")
    assert "[fleet]" not in out and "# effective configuration" not in out  # config.toml holds it
    assert re.search(r"^fedavg|^ef-fedprox", out, re.M) and "1 round" in out.splitlines()[0]
    assert f"listening on {address} (CurveZMQ on)" in out and address.rsplit(":", 1)[1] != "0"
    assert f"copy the coordinator's public key to every device: {run_dir / 'keys' / 'coordinator.key'}" in out
    assert f"allow-list {run_dir / 'keys' / 'allowed'}/ holds 0 agent key(s)" in out
    assert "waiting for 1 agent(s) (0 connected)" in out
    assert f"refused a device: its public key {public} is not in the allow-list" in out
    assert "1 agent(s) connected; starting" in out and "done: 1 rounds" in out


def test_print_config_shows_the_effective_configuration_that_config_toml_holds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``coordinator start --print-config`` (its ``main``, in this process: what it prints is the subject)."""
    run_dir = tmp_path / "run"
    code = coordinator_main(["start", "--rounds", "1", "--run-dir", str(run_dir), "--model", "mlp", "--print-config",
                             "--set", "fleet.mode=\"simulated\"", "--set", "fleet.backend=\"inline\"",
                             "--set", "data.train_limit=100", "--set", "run.export_onnx=false"])
    shown = capsys.readouterr()
    assert code == 0, shown.err
    assert (run_dir / "config.toml").read_text().strip() in shown.out
