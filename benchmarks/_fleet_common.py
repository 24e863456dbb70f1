"""Shared pieces of the benchmarks that start a bound coordinator and real agent processes (``round_overhead.py``,
``vs_flower.py``); not a command itself.

Holds: processes started in their own process groups and stopped by group; the paper CNN's spec at an input shape;
a synthetic shard file of one batch (the documented shard format, numpy only); and ``coordinator start --bind``
with no data of its own, waiting for its endpoint. Must not know any one benchmark; the commands import it as a
sibling module (``python benchmarks/X.py`` puts ``benchmarks/`` on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

SAMPLES = 64  # one batch at the default batch size


def cnn_spec(shape: tuple[int, ...]) -> dict[str, Any]:
    """The paper CNN (``cnn``) at ``shape``, 10 classes, as ``ModelSpec.as_dict`` writes it."""
    return {"name": "cnn", "input_shape": list(shape), "num_classes": 10, "pan": "off", "pan_a": 0.1, "pan_t": 1.0,
            "options": {}}


class Processes:
    """Processes started in their own process groups, stopped by group (SIGTERM, then SIGKILL) at the end."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            child = subprocess.Popen(args, env=env or dict(os.environ), stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.started.append(child)
        return child

    def stop(self) -> None:
        for child in reversed(self.started):
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
                try:
                    os.killpg(child.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    child.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self.started = []


def write_shard(path: Path, index: int, shape: tuple[int, ...], rng: np.random.Generator) -> None:
    """One batch of random uint8 samples and labels as a shard file (docs/data.md, "The shard format")."""
    meta = {"format_version": 1, "index": index, "dataset": "synthetic", "partition": "iid", "seed": 0,
            "num_classes": 10, "mean": [0.5] * shape[0], "std": [0.25] * shape[0], "meta": {}}
    np.savez(path, train_x=rng.integers(0, 256, (SAMPLES, *shape), dtype=np.uint8),
             train_y=rng.integers(0, 10, SAMPLES).astype("<i8"), test_x=np.zeros((1, *shape), np.uint8),
             test_y=np.zeros(1, "<i8"), meta=np.array(json.dumps(meta)))


def start_coordinator(processes: Processes, run_dir: Path, agents: int, rounds: int, shape: tuple[int, ...],
                      algorithm: list[str], log: Path) -> str:
    """``coordinator start --bind`` on an ephemeral loopback port for ``agents`` agents, the paper CNN at ``shape``,
    no data and no evaluation; ``algorithm``: ``--algorithm NAME`` and its ``--set`` options. Returns the endpoint."""
    processes.start([sys.executable, "-m", "fedge.runtime.cli", "start", "--bind", "tcp://127.0.0.1:0",
                     "--expect", str(agents), "--rounds", str(rounds), "--run-dir", str(run_dir), *algorithm,
                     "--model", "cnn", "--set", f"model.input_shape={list(shape)}", "--set", "model.outputs=10",
                     "--set", 'data.dataset=""', "--set", "eval.every=0", "--set", "run.export_onnx=false",
                     "--quiet"], log)
    endpoint = run_dir / "endpoint"
    until = time.monotonic() + 120
    while not (endpoint.exists() and endpoint.read_text().strip()):
        if time.monotonic() > until:
            raise RuntimeError(f"the coordinator published no endpoint in 120 s (see {log})")
        time.sleep(0.1)
    return endpoint.read_text().strip()


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
