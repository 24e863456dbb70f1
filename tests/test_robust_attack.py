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
    assert attacked["robust"]["by_agent"] == {"agent-00": {"capped": ROUNDS, "clipped": ROUNDS}}
    assert attacked["weight_cap"] == clean["weight_cap"] > 0
    rows = [json.loads(line) for line in (tmp_path / "attacked" / "clients.jsonl").read_text().splitlines()]
    evil = [r for r in rows if r["client_id"] == "agent-00"]
    assert all(r["claimed_samples"] == 10**9 and r["num_samples"] == attacked["weight_cap"] and r["clipped"]
               and r["clip_scales"]["model"] < 0.2 for r in evil)
    assert not any(r["capped"] or r["clipped"] for r in rows if r["client_id"] != "agent-00")
    warned = [r.getMessage() for r in caplog.records if "bounded" in r.getMessage()]
    assert len(warned) == ROUNDS and all("bounded 1 update(s): agent-00: claimed 1000000000 samples, counted "
                                             f"{attacked['weight_cap']}; clipped (model x" in m for m in warned)
