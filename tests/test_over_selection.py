"""Rounds that do not wait for the slowest, end to end: two agents slowed by a documented agent option
(``--step-delay-s``, not a mock), ``round.target`` closes each round before they report, they are sent Cancel,
nothing of theirs is aggregated or committed, and the session's stateful algorithms carry on consistently; an agent
with a work budget (``--max-steps``) sends the update of the steps it took."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedge.client.state import DeviceState
from tests.e2e import Processes, endpoint, finished, metrics, shards


@pytest.mark.parametrize("algorithm", ["scaffold", "ef-fedprox"])
def test_the_round_closes_at_its_target_and_the_slow_agents_are_cancelled(algorithm: str, procs: Processes,
                                                                         tmp_path: Path) -> None:
    data, run_dir = shards(tmp_path, 4), tmp_path / "run"
    coordinator = procs.coordinator(
        "--bind", "tcp://127.0.0.1:0", "--expect", "4", "--rounds", "2", "--run-dir", str(run_dir), "--model", "mlp",
        "--algorithm", algorithm, "--set", "data.clients=4", "--set", "data.partition=iid",
        "--set", "data.train_limit=128", "--set", "fleet.liveness_s=30", "--set", "round.count=4", "--set", "round.target=2",
        "--set", "fleet.heartbeat_s=0.5", "--set", "run.export_onnx=false", "--quiet")
    address = endpoint(run_dir)
    for i in range(4):
        slow = ["--step-delay-s", "3.0"] if i >= 2 else (["--max-steps", "1"] if i == 1 else [])
        procs.agent("--coordinator", address, "--client-id", f"dev-{i}", "--data", str(data / f"client-{i:03d}.npz"),
                    "--state-dir", str(tmp_path / f"state-{i}"), *slow, name=f"agent-{i}")
    assert finished(coordinator, 180) == 0, procs.output("coordinator")
    rows = metrics(run_dir)
    assert [r["selected"] for r in rows] == [4, 4] and [r["reported"] for r in rows] == [2, 2], rows
    clients = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text().splitlines()]
    fast = {c["client_index"] for c in clients}
    assert {c["client_id"] for c in clients} == {"dev-0", "dev-1"}
    assert all(sorted(r["accepted"]) == sorted(fast) for r in rows)
    # dev-1's work budget (--max-steps 1): a partial update of one step; dev-0 trains both of its batches.
    assert {c["client_id"]: c["steps"] for c in clients if c["round"] == 1} == {"dev-0": 2, "dev-1": 1}
    log = (run_dir / "coordinator.log").read_text()
    assert "invalid-update" not in log and "Traceback" not in log
    run_id = json.loads((run_dir / "report.json").read_text())["run_id"]
    for i in (2, 3):  # cancelled every round: told so, and nothing of theirs was ever committed
        assert "cancelled" in procs.output(f"agent-{i}"), procs.output(f"agent-{i}")[-2000:]
        assert DeviceState(tmp_path / f"state-{i}").committed(run_id) == {}
    for i in (0, 1):
        assert DeviceState(tmp_path / f"state-{i}").committed(run_id)  # control variates, residuals
    # The same run resumed without a target: the agents cancelled twice are waited for, and their first accepted
    # update (trained from the catch-up the coordinator computed for them) is taken as any other.
    resumed = procs.coordinator("--resume", str(run_dir), "--rounds", "3", "--set", "round.target=0",
                                "--set", f"fleet.bind={address}", "--quiet", name="resumed")
    assert finished(resumed, 180) == 0, procs.output("resumed")
    last = metrics(run_dir)[-1]
    assert last["round"] == 3 and last["reported"] == 4 and last["dropped"] == 0, last
    log = (run_dir / "coordinator.log").read_text()
    assert "invalid-update" not in log and "rejected" not in log
    for i in (2, 3):
        assert DeviceState(tmp_path / f"state-{i}").committed(run_id)
