"""A coordinator that crashes at any point of a round's finish resumes to the uninterrupted run: the run directory's
records agree with the checkpoint, no round is counted twice, and the final model is the same bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.e2e import FAST, Processes, finished, metrics

COMMON = ["--rounds", "3", "--local-fleet", "2", "--seed", "7", *FAST]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.e2e import Processes as Started

    work = tmp_path_factory.mktemp("reference")
    started = Started(work)
    try:
        assert finished(started.coordinator(*COMMON, "--run-dir", str(work / "run"), name="ref"), 240) == 0
    finally:
        started.cleanup()
    return work / "run"


@pytest.mark.parametrize("point", ["aggregated", "clients", "metrics", "checkpoint", "committed"])
def test_a_crash_anywhere_in_finish_round_resumes_to_the_same_run(procs: Processes, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch, reference: Path,
                                                                  point: str) -> None:
    run_dir = tmp_path / "run"
    monkeypatch.setenv("FEDGE_CRASH_AT", f"{point}:2")
    crashed = procs.coordinator(*COMMON, "--run-dir", str(run_dir), name="crashed")
    assert finished(crashed, 240) == 70, procs.output("crashed")
    monkeypatch.delenv("FEDGE_CRASH_AT")
    resumed = procs.coordinator("--resume", str(run_dir), "--quiet", name="resumed")
    assert finished(resumed, 240) == 0, procs.output("resumed")
    assert [r["round"] for r in metrics(run_dir)] == [1, 2, 3]
    clients = [json.loads(line)["round"] for line in (run_dir / "clients.jsonl").read_text().splitlines()]
    assert clients == [1, 1, 2, 2, 3, 3]
    expected = [r["test_accuracy"] for r in metrics(reference)]
    assert [r["test_accuracy"] for r in metrics(run_dir)] == expected
    with np.load(reference / "model.npz") as a, np.load(run_dir / "model.npz") as b:
        names = [n for n in a.files if n.startswith("a/")]
        assert names and all(np.array_equal(a[n], b[n]) for n in names)
