"""Helpers for the simulated-fleet tests: small sessions run as `coordinator start` or in this process, and the
per-round records a simulated fleet must share bit for bit with a fleet of agent processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

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


def cli_args(sets: list[str]) -> list[str]:
    args: list[str] = []
    for item in sets:
        args += ["--set", item]
    return args


def start_cli(sets: list[str], run_dir: Path) -> subprocess.Popen[bytes]:
    """`coordinator start` as a user types it, in a process group of its own (``finish_cli`` waits for it)."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(run_dir.parent / f"{run_dir.name}.out", "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "fedge.runtime.cli", "start", *cli_args(sets),
                                 "--run-dir", str(run_dir), "--quiet"], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"},
                                start_new_session=True)


def finish_cli(process: subprocess.Popen[bytes], run_dir: Path, timeout_s: float = 180) -> None:
    """Wait for a started run (killing its process group if it overruns); it must have finished."""
    try:
        process.wait(timeout=timeout_s)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    output = (run_dir.parent / f"{run_dir.name}.out").read_text(errors="replace")
    assert process.returncode == 0, output[-3000:]


def run_cli(sets: list[str], run_dir: Path, timeout_s: float = 180) -> None:
    finish_cli(start_cli(sets, run_dir), run_dir, timeout_s)


def run_here(sets: list[str], run_dir: Path, backend: Any = None) -> dict[str, Any]:
    """The same session played in this process (``runtime.launch.play``), on ``backend`` when given (a pool
    the test keeps); returns its report."""
    from fedge.coordinator.config import load_config
    from fedge.coordinator.rundir import RunDir
    from fedge.runtime.launch import play
    from fedge.runtime.plan import plan_session

    report = play(plan_session(load_config(None, sets)), RunDir(run_dir), resuming=False, backend=backend)
    assert report["status"] == "done", report
    return report


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
