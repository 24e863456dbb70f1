"""Sessions in this process, the tests' default: ``run_here`` plays a session as ``coordinator start`` would
(``runtime.launch.play``, the simulated fleet), the ``sessions`` fixture does so and kills, by PID, any process a
session left behind (a local backend's workers); and the per-round records a simulated fleet must share bit for bit
with a fleet of agent processes. Real processes: ``tests/e2e.py``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

# Small sessions (issue 21: `mlp`, at most 200 samples per client, 3 rounds, 6 clients).
SMALL = ["model.name=mlp", "fleet.local_agents=6", "data.train_limit=200", "run.rounds=3", "run.seed=3",
         "fleet.workers=2", "fleet.heartbeat_s=0.5", "fleet.liveness_s=20.0", "run.export_onnx=false"]

# What must match (not time, memory or energy).
METRIC_KEYS = ("round", "selected", "reported", "dropped", "unavailable", "train_loss", "bytes_down",
               "bytes_up_tensors", "test_accuracy", "test_loss", "test_f1_macro", "personal_accuracy_mean")
CLIENT_KEYS = ("round", "client_index", "client_id", "num_samples", "train_loss", "bytes_down", "bytes_up_tensors")


def overrides(algorithm: str, fraction: float, mode: str, backend: str = "local", extra: tuple[str, ...] = ()
              ) -> list[str]:
    return [*SMALL, f"algorithm.name={algorithm}", f"round.fraction={fraction}", f"fleet.mode={mode}",
            f"fleet.backend={backend}", *extra]


def run_here(sets: list[str] | tuple[str, ...], run_dir: Path, backend: Any = None, status: str = "done"
             ) -> dict[str, Any]:
    """The session ``coordinator start --set ...`` would play, played in this process (``runtime.launch.play``),
    on ``backend`` when given (a pool the test keeps); returns its report, whose status must be ``status``."""
    from fedge.coordinator.config import load_config
    from fedge.coordinator.rundir import RunDir
    from fedge.runtime.launch import play
    from fedge.runtime.plan import plan_session

    report = play(plan_session(load_config(None, list(sets))), RunDir(run_dir), resuming=False, backend=backend)
    assert report["status"] == status, report
    return report


def resume_here(run_dir: Path, sets: list[str] | tuple[str, ...] = (), rounds: int = 0, backend: Any = None
                ) -> dict[str, Any]:
    """``coordinator start --resume RUN [--rounds N] [--set ...]`` played in this process, through the same
    resume rules (``runtime.launch.plan_resume``); returns its report."""
    from fedge.coordinator.config import load_config
    from fedge.coordinator.rundir import RunDir
    from fedge.runtime.launch import plan_resume, play

    extend = {"run.rounds": rounds} if rounds else {}
    plan = plan_resume(run_dir, load_config(run_dir / "config.toml", list(sets), extend))
    return play(plan, RunDir(run_dir), resuming=True, backend=backend)


def forkserver(child: psutil.Process) -> bool:
    """Whether a child of this process is multiprocessing's fork server (its forks share its command line)."""
    try:
        return child.ppid() == os.getpid() and "multiprocessing.forkserver" in " ".join(child.cmdline())
    except psutil.NoSuchProcess:
        return False


class InProcessSessions:
    """Sessions played in this process; ``cleanup`` kills, by PID, every process they left behind."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # multiprocessing's resource tracker lives as long as this process: started before the count, never killed
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        self.before = {child.pid for child in psutil.Process().children(recursive=True)}

    def run(self, sets: list[str] | tuple[str, ...], name: str = "run", backend: Any = None,
            status: str = "done") -> dict[str, Any]:
        """A fresh session in ``root/name``; returns its report."""
        return run_here(sets, self.root / name, backend, status)

    def resume(self, name: str = "run", sets: list[str] | tuple[str, ...] = (), rounds: int = 0,
               backend: Any = None) -> dict[str, Any]:
        return resume_here(self.root / name, sets, rounds, backend)

    def cleanup(self) -> None:
        """The forked children's server (``plumbing.forking``) is this process's for good, as the resource tracker
        is: kept (multiprocessing would find it reaped by another); what it forked is killed like the rest."""
        left = [child for child in psutil.Process().children(recursive=True)
                if child.pid not in self.before and not forkserver(child)]
        for child in left:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=10)


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[InProcessSessions]:
    """Registered in conftest.py."""
    played = InProcessSessions(tmp_path)
    try:
        yield played
    finally:
        played.cleanup()


def records(run_dir: Path) -> dict[str, Any]:
    """The final model's arrays and the per-round records that must be bit-identical across fleets."""
    with np.load(run_dir / "model.npz") as stored:
        model = {name: stored[name] for name in stored.files}
    rows = [{k: row.get(k) for k in METRIC_KEYS} for row in read_jsonl(run_dir / "metrics.jsonl")]
    clients = sorted(({k: row.get(k) for k in CLIENT_KEYS} for row in read_jsonl(run_dir / "clients.jsonl")),
                     key=lambda row: (row["round"], row["client_index"]))
    return {"model": model, "metrics": rows, "clients": clients}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def differences(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """What differs, in words ([] when the runs are the same)."""
    found = []
    a, b = expected["model"], got["model"]
    if a.keys() != b.keys():
        found.append(f"model tensors {sorted(a)} != {sorted(b)}")
    else:
        found += [f"model tensor {name} differs" for name in a
                  if a[name].dtype != b[name].dtype or a[name].tobytes() != b[name].tobytes()]
    for x, y in zip(expected["metrics"], got["metrics"], strict=False):
        diff = {k: (x[k], y[k]) for k in x if x[k] != y[k]}
        if diff:
            found.append(f"metrics round {x['round']}: {diff}")
    if len(expected["metrics"]) != len(got["metrics"]):
        found.append(f"{len(expected['metrics'])} metrics rows != {len(got['metrics'])}")
    if expected["clients"] != got["clients"]:
        found.append("clients.jsonl differs: " + str([(x, y) for x, y in zip(expected["clients"], got["clients"],
                                                                              strict=False) if x != y][:3]))
    return found
