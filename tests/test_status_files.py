"""The coordinator's status files: replaced atomically for their readers, never forced to disk (a round must not wait
on them), while the run's records still are."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fedge.coordinator.rundir import RunDir
from fedge.coordinator.status import AgentTallies, StatusBoard
from fedge.protocol.registry import AgentRegistry


def test_status_files_are_written_whole_without_an_fsync_and_records_still_are_fsynced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    run_dir = RunDir(tmp_path / "run")
    registry = AgentRegistry(capacity=3, liveness_s=30.0)
    registry.reserve(["a", "b"])
    board = StatusBoard(run_dir, rounds=5, algorithm="fedavg")
    board.write("round 1 done", True, run_id="r1", round_number=1, registry=registry, rejections={},
                bytes_total={"up": 10, "down": 20}, round_walls=[1.0], tallies=AgentTallies())
    status = json.loads((run_dir / "status.json").read_text())
    assert status["round"] == 1 and status["agents_total"] == 2
    assert "fedge_round" in (run_dir / "fedge.prom").read_text()
    assert json.loads((run_dir / "agents.json").read_text())["run_id"] == "r1"
    assert synced == []
    assert not [p for p in run_dir.path.iterdir() if p.name.endswith(".tmp")]
    run_dir.write_json("report.json", {"done": True})  # a record of the run: still forced to disk
    assert len(synced) == 2  # the file and its directory


def test_coordinator_status_says_in_one_line_that_a_cut_short_status_file_cannot_be_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedge.runtime.cli import main

    (tmp_path / "status.json").write_text('{"run_id": "r1", "pha')  # as a power cut can leave it
    assert main(["status", str(tmp_path)]) != 0
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "cannot be read" in error and "Traceback" not in error
