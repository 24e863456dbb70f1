"""The full local fleet: ten agent processes, the paper CNN, a couple of rounds (slow: about a minute). The
one full-fleet real-process test; the ONNX export at the end is left out (test_e2e_run.py checks a session's,
test_models.py every model's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e import Processes, metrics


@pytest.mark.slow
@pytest.mark.timeout(600)  # ten agents importing torch on two busy cores
def test_ten_agents_play_rounds_with_the_paper_cnn(procs: Processes, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    procs.run_cli(["run.rounds=2", "data.train_limit=256", "run.export_onnx=false"], run_dir, timeout_s=540)
    rows = metrics(run_dir)
    assert [(r["selected"], r["reported"], r["dropped"]) for r in rows] == [(10, 10, 0)] * 2
    config = (run_dir / "config.toml").read_text()
    assert 'name = "cnn"' in config and 'dataset = "fmnist-demo"' in config
    # the defaults: ten agent processes, over loopback TCP, each with its own log and committed state
    assert "local_agents = 10" in config and 'mode = "process"' in config
    assert (run_dir / "endpoint").read_text().startswith("tcp://127.0.0.1:")
    assert len(list((run_dir / "agents").glob("agent-*/agent.log"))) == 10
    assert len(list((run_dir / "agents").glob("agent-*/committed.npz"))) == 10
    clients = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text().splitlines()]
    assert sorted({c["client_id"] for c in clients}) == [f"agent-{i:02d}" for i in range(10)]
    # Ten classes: chance is 0.10. Two short rounds reached 0.222 and 0.227 here; a broken aggregate stays near 0.10.
    assert min(r["test_accuracy"] for r in rows) > 0.15
    assert len(list((run_dir / "data").glob("client-*.npz"))) == 10
    assert not (run_dir / "model.onnx").exists() and (run_dir / "model.npz").stat().st_size > 0
