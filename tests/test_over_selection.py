"""Rounds that do not wait for the slowest, end to end: two agents slowed by a documented agent option
(``--step-delay-s``, not a mock), ``round.target`` closes each round before they report, they are sent Cancel,
nothing of theirs is aggregated or committed, and the session's stateful algorithms carry on consistently; an agent
with a work budget (``--max-steps``) sends the update of the steps it took; the latency policy draws slowed agents
less often than uniform selection."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedge.client.state import DeviceState
from fedge.protocol.selection import choose
from tests.e2e import Processes, endpoint, finished, metrics, shards, wait_for


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


def test_the_latency_policy_selects_the_slow_agents_less_often_than_uniform_selection(procs: Processes,
                                                                                    tmp_path: Path) -> None:
    """20 rounds, 2 of 6 agents a round, closed at the first update: the two agents slowed by ``--step-delay-s``
    are cancelled whenever a fast one is chosen beside them (each cancel doubles their estimated round time) and
    measured when chosen together, and the latency policy then draws them less often than the seeded uniform draw
    of the same rounds would have."""
    rounds, seed, agents_n = 20, 2, 6  # seed 2: uniform draws clients 4 and 5 (the slow ones) 15 times in all
    data, run_dir = shards(tmp_path, agents_n), tmp_path / "run"
    coordinator = procs.coordinator(
        "--bind", "tcp://127.0.0.1:0", "--expect", str(agents_n), "--rounds", str(rounds), "--run-dir", str(run_dir),
        "--model", "mlp", "--algorithm", "fedavg", "--set", f"data.clients={agents_n}", "--set",
        "data.partition=iid", "--set", "data.train_limit=64", "--set", f"run.seed={seed}", "--set", "eval.every=0",
        "--set", "round.count=2", "--set", "round.target=1", "--set", "round.policy=latency",
        "--set", "fleet.heartbeat_s=0.5", "--set", "fleet.liveness_s=30", "--set", "run.export_onnx=false", "--quiet")
    address = endpoint(run_dir)

    def start(i: int, *options: str) -> None:
        procs.agent("--coordinator", address, "--client-id", f"dev-{i}", "--data", str(data / f"client-{i:03d}.npz"),
                    "--state-dir", str(tmp_path / f"state-{i}"), *options, name=f"agent-{i}")

    for i in range(4):
        start(i)
    wait_for(lambda: (run_dir / "status.json").exists() and
             json.loads((run_dir / "status.json").read_text())["agents_total"] >= 4, 120, "the fast agents")
    for i in (4, 5):  # joined last, they take clients 4 and 5 (the check below reads who took what)
        start(i, "--step-delay-s", "1.0")
    assert finished(coordinator, 240) == 0, procs.output("coordinator")
    rows = metrics(run_dir)
    assert len(rows) == rounds and all(r["reported"] >= 1 for r in rows), rows  # two may land in one poll
    agents = json.loads((run_dir / "status.json").read_text())["agents"]
    slow = {a["index"] for a in agents if a["client_id"] in ("dev-4", "dev-5")}
    assert len(slow) == 2, agents
    latency = sum(len(slow & set(r["selected_indices"])) for r in rows)
    uniform = sum(len(slow & set(choose(list(range(agents_n)), 2, np.random.default_rng([seed, number]))))
                  for number in range(1, rounds + 1))
    print(f"slow agents selected: {latency} (latency policy) against {uniform} (uniform)")
    assert latency < uniform, (latency, uniform, [r["selected_indices"] for r in rows])
    # Every agent has an estimate (each was drawn at least once), and `coordinator status` shows it.
    assert all(a["round_s"] is not None for a in agents), agents
    shown = subprocess.run([sys.executable, "-m", "fedge.runtime.cli", "status", str(run_dir)], check=True,
                           capture_output=True, text=True, timeout=60).stdout
    assert shown.count("rounds take about") == agents_n, shown
