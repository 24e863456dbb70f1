"""Rounds that do not wait for the slowest: ``round.target`` closes each round before the slow devices report, they
are sent Cancel, nothing of theirs is aggregated or committed, and the session's stateful algorithms carry on
consistently, through a resume without a target too; the latency policy draws slow devices less often than uniform
selection. These run in process on a simulated clock (a simulated fleet whose slow devices a ``fleet.trace`` names,
docs/scale.md); one session of real agents slowed by a documented agent option (``--step-delay-s``, not a mock)
shows the same over processes, with an agent's work budget (``--max-steps``) sending the update of the steps it
took."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from fedge.client.state import DeviceState
from fedge.protocol.selection import choose
from fedge.runtime.cli import main as coordinator
from tests.e2e import Processes, endpoint, finished, metrics, shards
from tests.simfleet import InProcessSessions, read_jsonl

# A simulated fleet on its own clock, every device as fast as the others but those the trace slows 100 times.
SIMULATED = ["model.name=mlp", "fleet.mode=simulated", "fleet.backend=inline", "fleet.clock=simulated",
             "fleet.speeds=equal", "data.partition=iid", "run.export_onnx=false"]


def slowed(tmp_path: Path, *clients: int) -> str:
    """A ``fleet.trace`` that makes ``clients`` a hundred times slower than the others."""
    trace = tmp_path / "slow.csv"
    trace.write_text("client,speed,from_s,until_s\n" + "".join(f"{i},0.01,,\n" for i in clients))
    return f"fleet.trace={trace}"


@pytest.mark.parametrize("algorithm", ["scaffold", "ef-fedprox"])
def test_the_round_closes_at_its_target_and_the_slow_devices_are_cancelled(
        algorithm: str, sessions: InProcessSessions, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fedge")
    report = sessions.run([*SIMULATED, f"algorithm.name={algorithm}", "data.clients=4", "data.train_limit=128",
                           "round.count=4", "round.target=2", "run.rounds=2", slowed(tmp_path, 2, 3)])
    run_dir = tmp_path / "run"
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["selected"] for r in rows] == [4, 4] and [r["reported"] for r in rows] == [2, 2], rows
    clients = read_jsonl(run_dir / "clients.jsonl")
    fast = {c["client_index"] for c in clients}
    assert {c["client_id"] for c in clients} == {"agent-00", "agent-01"}
    assert all(sorted(r["accepted"]) == sorted(fast) for r in rows)
    said = caplog.messages
    assert not [m for m in said if "invalid-update" in m]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    run_id = report["run_id"]
    for i in (2, 3):  # cancelled every round: told so, and nothing of theirs was ever committed
        for round_number in (1, 2):
            assert f"client agent-0{i}: round {round_number} cancelled" in caplog.text, caplog.text
        assert DeviceState(run_dir / "agents" / f"agent-0{i}").committed(run_id) == {}
    for i in (0, 1):
        assert DeviceState(run_dir / "agents" / f"agent-0{i}").committed(run_id)  # control variates, residuals
    # The same run resumed without a target: the devices cancelled twice are waited for, and their first accepted
    # update (trained from the catch-up the coordinator computed for them) is taken as any other.
    caplog.clear()
    assert sessions.resume(sets=["round.target=0"], rounds=3)["status"] == "done"
    last = read_jsonl(run_dir / "metrics.jsonl")[-1]
    assert last["round"] == 3 and last["reported"] == 4 and last["dropped"] == 0, last
    assert not [m for m in caplog.messages if "invalid-update" in m or "rejected" in m], caplog.text
    for i in (2, 3):
        assert DeviceState(run_dir / "agents" / f"agent-0{i}").committed(run_id)


def test_agents_slowed_by_step_delay_are_cancelled_at_the_target_and_waited_for_after_a_resume(
        procs: Processes, tmp_path: Path) -> None:
    data, run_dir = shards(tmp_path, 4), tmp_path / "run"
    coordinator_process = procs.coordinator(
        "--bind", "tcp://127.0.0.1:0", "--expect", "4", "--rounds", "2", "--run-dir", str(run_dir), "--model", "mlp",
        "--algorithm", "scaffold", "--set", "data.clients=4", "--set", "data.partition=iid",
        "--set", "data.train_limit=128", "--set", "fleet.liveness_s=30", "--set", "round.count=4",
        "--set", "round.target=2", "--set", "fleet.heartbeat_s=0.5", "--set", "run.export_onnx=false", "--quiet")
    address = endpoint(run_dir)
    for i in range(4):
        slow = ["--step-delay-s", "3.0"] if i >= 2 else (["--max-steps", "1"] if i == 1 else [])
        procs.agent("--coordinator", address, "--client-id", f"dev-{i}", "--data", str(data / f"client-{i:03d}.npz"),
                    "--state-dir", str(tmp_path / f"state-{i}"), *slow, name=f"agent-{i}")
    assert finished(coordinator_process, 180) == 0, procs.output("coordinator")
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
        assert DeviceState(tmp_path / f"state-{i}").committed(run_id)  # control variates
    resumed = procs.coordinator("--resume", str(run_dir), "--rounds", "3", "--set", "round.target=0",
                                "--set", f"fleet.bind={address}", "--quiet", name="resumed")
    assert finished(resumed, 180) == 0, procs.output("resumed")
    last = metrics(run_dir)[-1]
    assert last["round"] == 3 and last["reported"] == 4 and last["dropped"] == 0, last
    log = (run_dir / "coordinator.log").read_text()
    assert "invalid-update" not in log and "rejected" not in log
    for i in (2, 3):
        assert DeviceState(tmp_path / f"state-{i}").committed(run_id)


def test_the_latency_policy_selects_the_slow_devices_less_often_than_uniform_selection(
        sessions: InProcessSessions, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """20 rounds, 2 of 6 devices a round, closed at the first update: the two devices a hundred times slower are
    cancelled whenever a fast one is chosen beside them (each cancel doubles their estimated round time) and
    measured when chosen together, and the latency policy then draws them less often than the seeded uniform draw
    of the same rounds would have."""
    rounds, seed, clients = 20, 2, 6  # seed 2: uniform draws clients 4 and 5 (the slow ones) 15 times in all
    sessions.run([*SIMULATED, "algorithm.name=fedavg", f"data.clients={clients}", "data.train_limit=64",
                  f"run.seed={seed}", f"run.rounds={rounds}", "eval.every=0", "round.count=2", "round.target=1",
                  "round.policy=latency", slowed(tmp_path, 4, 5)])
    run_dir = tmp_path / "run"
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert len(rows) == rounds and all(r["reported"] >= 1 for r in rows), rows
    agents = json.loads((run_dir / "status.json").read_text())["agents"]
    slow = {a["index"] for a in agents if a["client_id"] in ("agent-04", "agent-05")}
    assert len(slow) == 2, agents
    latency = sum(len(slow & set(r["selected_indices"])) for r in rows)
    uniform = sum(len(slow & set(choose(list(range(clients)), 2, np.random.default_rng([seed, number]))))
                  for number in range(1, rounds + 1))
    print(f"slow devices selected: {latency} (latency policy) against {uniform} (uniform)")
    assert latency < uniform, (latency, uniform, [r["selected_indices"] for r in rows])
    # Every device has an estimate (each was drawn at least once), and `coordinator status` shows it.
    assert all(a["round_s"] is not None for a in agents), agents
    capsys.readouterr()
    assert coordinator(["status", str(run_dir)]) == 0
    shown = capsys.readouterr().out
    assert shown.count("rounds take about") == clients, shown
