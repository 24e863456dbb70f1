"""One compromised device of ten, through a whole session on the simulated fleet (the Session, its records and its
log, as for real devices): it claims 10^9 samples and sends -20 times its model every round. The default bounds
keep the model near the clean run's and name the device; with the bounds off the same device takes the model."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from fedge.api import run_session, session_config
from tests.attackers import compromised, inflate_and_flip

ROUNDS = 6


def session(tmp_path: Path, name: str, robust: dict[str, Any], attacked: bool) -> dict[str, Any]:
    config = session_config(run={"rounds": ROUNDS, "seed": 0, "export_onnx": False},
                            data={"dataset": "fmnist-demo", "partition": "dirichlet", "alpha": 0.3, "clients": 10},
                            fleet={"mode": "simulated", "backend": "inline"}, model={"name": "mlp"},
                            algorithm={"name": "fedavg"}, robust=robust)
    if not attacked:
        return run_session(config, tmp_path / name)
    with compromised({"agent-00"}, inflate_and_flip(claim=10**9, factor=-20.0)):
        return run_session(config, tmp_path / name)


def test_one_compromised_device_of_ten_cannot_take_over_the_model(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="fedge.coordinator")
    clean = session(tmp_path, "clean", {}, attacked=False)
    attacked = session(tmp_path, "attacked", {}, attacked=True)
    unbounded = session(tmp_path, "unbounded", {"norm_factor": 0.0, "max_samples": 10**12}, attacked=True)
    assert clean["robust"]["clipped"] == 0 and clean["robust"]["capped"] == 0  # honest devices untouched
    assert clean["final_test_accuracy"] - unbounded["final_test_accuracy"] > 0.3, unbounded  # the door they close
    assert clean["final_test_accuracy"] - attacked["final_test_accuracy"] <= 0.05, (clean, attacked)
    assert attacked["robust"]["by_agent"] == {"agent-00": {"capped": ROUNDS, "clipped": ROUNDS, "rejected": 0}}
    assert attacked["weight_cap"] == clean["weight_cap"] > 0
    rows = [json.loads(line) for line in (tmp_path / "attacked" / "clients.jsonl").read_text().splitlines()]
    evil = [r for r in rows if r["client_id"] == "agent-00"]
    assert all(r["claimed_samples"] == 10**9 and r["num_samples"] == attacked["weight_cap"] and r["clipped"]
               and r["clip_scales"]["model"] < 0.2 for r in evil)
    assert not any(r["capped"] or r["clipped"] for r in rows if r["client_id"] != "agent-00")
    warned = [r.getMessage() for r in caplog.records if "bounded" in r.getMessage()]
    assert len(warned) == ROUNDS and all("bounded 1 update(s): agent-00: claimed 1000000000 samples, counted "
                                             f"{attacked['weight_cap']}; clipped (model x" in m for m in warned)


def test_a_device_clipped_rounds_in_a_row_is_quarantined_across_a_resume_until_an_operator_lets_it_back(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedge.coordinator.quarantine import read_quarantine
    from fedge.runtime.cli import main as coordinator

    config = session_config(run={"rounds": 3, "seed": 1, "export_onnx": False},
                            data={"dataset": "fmnist-demo", "partition": "dirichlet", "alpha": 0.3, "clients": 4,
                                  "train_limit": 200},
                            fleet={"mode": "simulated", "backend": "inline"}, model={"name": "mlp"},
                            algorithm={"name": "fedavg"}, robust={"quarantine_after": 2})
    run = tmp_path / "run"

    def resume_to(rounds: int) -> None:
        toml = run / "config.toml"
        toml.write_text(toml.read_text().replace(f"rounds = {rounds - 1}", f"rounds = {rounds}"))
        with compromised({"agent-00"}, inflate_and_flip()):
            run_session(config, run, resume=True)

    def rounds_of(client_id: str) -> list[int]:
        rows = [json.loads(line) for line in (run / "clients.jsonl").read_text().splitlines()]
        return [r["round"] for r in rows if r["client_id"] == client_id]

    with compromised({"agent-00"}, inflate_and_flip()):
        run_session(config, run)
    assert rounds_of("agent-00") == [1, 2] and rounds_of("agent-01") == [1, 2, 3]
    state = read_quarantine(run)
    assert state["quarantined"]["agent-00"]["round"] == 2 and "2 rounds in a row" in state["quarantined"]["agent-00"][
        "reason"]
    agents = {a["client_id"]: a for a in json.loads((run / "agents.json").read_text())["agents"]}
    assert agents["agent-00"]["quarantined"] and agents["agent-00"]["clipped"] == 2 and not agents["agent-01"]["quarantined"]
    assert 'fedge_agent_quarantined{run="' in (run / "fedge.prom").read_text()
    resume_to(4)  # the quarantine survives the resume
    assert rounds_of("agent-00") == [1, 2]
    def quarantine(*args: str) -> tuple[int, str, str]:
        """``coordinator quarantine RUN ARGS``: its exit status, stdout and stderr."""
        capsys.readouterr()
        code = coordinator(["quarantine", str(run), *args])
        said = capsys.readouterr()
        return code, said.out, said.err

    code, out, err = quarantine("--list")
    assert code == 0 and "agent-00" in out and "since round 2" in out, (out, err)
    code, out, err = quarantine("--clear", "agent-00")
    assert code == 0, err
    code, out, err = quarantine("--clear", "../x")
    assert code != 0 and "is not a client id" in err and len(err.strip().splitlines()) == 1
    resume_to(5)  # let back at the next round start
    assert rounds_of("agent-00") == [1, 2, 5] and "agent-00" not in read_quarantine(run)["quarantined"]
    # agents.json's running totals survive the resumes: each equals what clients.jsonl recorded of that agent
    rows = [json.loads(line) for line in (run / "clients.jsonl").read_text().splitlines()]
    for agent in json.loads((run / "agents.json").read_text())["agents"]:
        mine = [r for r in rows if r["client_id"] == agent["client_id"]]
        assert agent["bytes_down"] == sum(r["bytes_down"] for r in mine) > 0
        assert agent["bytes_up"] == sum(r["bytes_up"] for r in mine if r.get("available", True))
        assert agent["last_round"] == max(r["round"] for r in mine if r.get("available", True))
        assert agent["declined"] == sum(not r.get("available", True) for r in mine) and agent["rejections"] == 0


def test_honest_ef_devices_clip_themselves_to_the_announced_bound_and_the_coordinator_still_clips_one_that_does_not(
        tmp_path: Path) -> None:
    from tests.attackers import scaled

    config = session_config(run={"rounds": 3, "seed": 2, "export_onnx": False},
                            data={"dataset": "fmnist-demo", "partition": "dirichlet", "alpha": 0.3, "clients": 5,
                                  "train_limit": 200},
                            fleet={"mode": "simulated", "backend": "inline"}, model={"name": "mlp"},
                            robust={"norm_factor": 0.9})  # the embedded default, ef-fedprox; a tight bound
    with compromised({"agent-00"}, scaled(100.0)()):
        run_session(config, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "clients.jsonl").read_text().splitlines()]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    honest_later = [r for r in rows if r["client_id"] != "agent-00" and r["round"] > 1]
    assert not any(r["clipped"] for r in honest_later)  # from round 2 the tasks name the bound
    assert any(r["device_clip_scale"] < 1 for r in honest_later) and sum(m["device_clipped"] for m in metrics) >= 1
    assert all(r["device_clip_scale"] == 1 for r in rows if r["round"] == 1)  # round 1 holds: no bound announced
    assert all(r["clipped"] for r in rows if r["client_id"] == "agent-00" and r["round"] > 1)  # the safety net
