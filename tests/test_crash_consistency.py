"""A coordinator that crashes at any point of a round's finish resumes to the uninterrupted run: the run directory's
records agree with the checkpoint, no round is counted twice, and the final model is the same bit for bit.

The crash is the subject, so each crash ends a real coordinator process (``FEDGE_CRASH_AT``: ``os._exit(70)``,
no cleanup: what a power cut leaves on disk); the agents are not, so the fleet is simulated inline in that
process. The resume and the uninterrupted reference (shared by every crash point) are played in this
process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.e2e import Processes, metrics
from tests.simfleet import resume_here, run_here

SETS = ["run.rounds=3", "fleet.local_agents=2", "run.seed=7", "model.name=mlp", "data.train_limit=300",
        "fleet.heartbeat_s=0.5", "fleet.liveness_s=6.0", "run.export_onnx=false", "fleet.mode=simulated",
        "fleet.backend=inline"]

pytestmark = pytest.mark.xdist_group("crash_consistency")  # one worker plays the shared reference


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    run_here(SETS, run_dir)
    return run_dir


@pytest.mark.parametrize("point", ["aggregated", "clients", "metrics", "checkpoint", "committed"])
def test_a_crash_anywhere_in_finish_round_resumes_to_the_same_run(procs: Processes, tmp_path: Path, reference: Path,
                                                                  point: str) -> None:
    run_dir = tmp_path / "run"
    crashed = procs.cli(SETS, run_dir, name="crashed", crash_at=f"{point}:2")
    assert crashed.wait(timeout=240) == 70, procs.output("crashed")
    assert resume_here(run_dir)["status"] == "done"
    assert [r["round"] for r in metrics(run_dir)] == [1, 2, 3]
    clients = [json.loads(line)["round"] for line in (run_dir / "clients.jsonl").read_text().splitlines()]
    assert clients == [1, 1, 2, 2, 3, 3]
    expected = [r["test_accuracy"] for r in metrics(reference)]
    assert [r["test_accuracy"] for r in metrics(run_dir)] == expected
    with np.load(reference / "model.npz") as a, np.load(run_dir / "model.npz") as b:
        names = [n for n in a.files if n.startswith("a/")]
        assert names and all(np.array_equal(a[n], b[n]) for n in names)
