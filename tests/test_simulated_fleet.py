"""A simulated fleet (inline, local workers, Ray actors) gives the same models and records as a fleet of agent
processes, bit for bit, at full and partial participation; and across SIGTERM and --resume. One local Ray cluster
for the whole module (bound to 127.0.0.1, usage statistics off)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.simfleet import (
    cli_args,
    differences,
    finish_cli,
    overrides,
    read_jsonl,
    records,
    run_here,
    start_cli,
)

ALGORITHMS = ("fedavg", "scaffold", "dssa-fedprox", "ef-fedprox", "fedbn")
CASES = [(name, fraction) for name in ALGORITHMS for fraction in (0.5, 1.0)]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    from fedge.simulation.ray_backend import start_local_ray, stop_local_ray

    assert start_local_ray(num_cpus=2), "a Ray cluster was already up in this process"
    import ray

    try:
        yield ray
    finally:
        stop_local_ray()


@pytest.fixture(scope="module")
def pools(ray_cluster: Any) -> Iterator[dict[str, Any]]:
    """One pool of 2 worker processes and one of 2 Ray actors, kept across the module's sessions."""
    from fedge.simulation.backends import LocalBackend
    from fedge.simulation.ray_backend import RayBackend

    kept = {"local": LocalBackend(2), "ray": RayBackend(2)}
    try:
        yield kept
    finally:
        for backend in kept.values():
            backend.close()


@pytest.mark.parametrize(("algorithm", "fraction"), CASES)
def test_every_backend_matches_a_fleet_of_agent_processes(algorithm: str, fraction: float, tmp_path: Path,
                                                         pools: dict[str, Any]) -> None:
    process = start_cli(overrides(algorithm, fraction, "process"), tmp_path / "process")  # meanwhile, the others
    try:
        for backend in ("inline", "local", "ray"):
            run_here(overrides(algorithm, fraction, "simulated", backend), tmp_path / backend, pools.get(backend))
    finally:
        finish_cli(process, tmp_path / "process")
    expected = records(tmp_path / "process")
    assert [row["reported"] for row in expected["metrics"]] == [3 if fraction == 0.5 else 6] * 3
    for backend in ("inline", "local", "ray"):
        assert differences(expected, records(tmp_path / backend)) == [], backend


def test_a_simulated_run_stopped_by_sigterm_resumes_to_the_uninterrupted_run(tmp_path: Path) -> None:
    slow = ("run.rounds=6", "train.epochs=4")
    sets = overrides("ef-fedprox", 0.5, "simulated", "local", slow)
    run_here(overrides("ef-fedprox", 0.5, "simulated", "inline", slow), tmp_path / "whole")
    run_dir = tmp_path / "stopped"
    process = subprocess.Popen([sys.executable, "-m", "fedge.runtime.cli", "start", *cli_args(sets), "--run-dir",
                                str(run_dir), "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    try:
        until = time.monotonic() + 120
        while time.monotonic() < until and not (run_dir / "metrics.jsonl").exists():
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    done = len(read_jsonl(run_dir / "metrics.jsonl"))
    assert process.returncode == 0 and 1 <= done < 6, output.decode(errors="replace")[-2000:]
    resumed = subprocess.run([sys.executable, "-m", "fedge.runtime.cli", "start", "--resume", str(run_dir),
                              "--quiet"], capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert differences(records(tmp_path / "whole"), records(run_dir)) == []


def test_the_local_ray_cluster_listens_on_loopback_only(ray_cluster: Any) -> None:
    ours = psutil.Process().children(recursive=True)
    assert ours, "the Ray cluster started no process"
    listening = []
    for child in ours:
        try:
            listening += [(child.name(), c.laddr) for c in child.net_connections(kind="inet")
                          if c.status == psutil.CONN_LISTEN]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    assert listening, "no Ray process listens on any TCP port"
    assert [(name, addr) for name, addr in listening if addr.ip not in ("127.0.0.1", "::1", "::ffff:127.0.0.1")] == []


def test_importing_the_coordinator_does_not_import_ray(tmp_path: Path) -> None:
    code = ("import sys, fedge.runtime.launch, fedge.coordinator.session, fedge.simulation.fleet; "
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stdout + out.stderr


class Recording:
    """A backend that keeps, for every job, a copy of the client's state directory as the job found it."""

    def __init__(self, inner: Any, snapshots: Path) -> None:
        self.inner, self.workers, self.snapshots = inner, inner.workers, snapshots
        self.jobs: list[Any] = []
        self.frames: dict[tuple[str, int], bytes | None] = {}

    def submit(self, job: Any) -> None:
        import dataclasses
        import shutil

        copy = self.snapshots / f"{job.client.client_id}-{len(self.jobs)}"
        shutil.copytree(job.client.state_dir, copy) if Path(job.client.state_dir).exists() else copy.mkdir()
        self.jobs.append(dataclasses.replace(job, client=dataclasses.replace(job.client, state_dir=str(copy))))
        self.inner.submit(job)

    def results(self, timeout_s: float) -> list[Any]:
        outcomes = self.inner.results(timeout_s)
        self.frames.update({(o.client_id, o.round): o.frame for o in outcomes})
        return outcomes

    def close(self) -> None:
        self.inner.close()


def test_a_client_rebuilt_from_its_files_on_a_ray_actor_trains_as_it_did_here(tmp_path: Path,
                                                                             pools: dict[str, Any]) -> None:
    """Every task of an inline SCAFFOLD run (device state and all) replayed on a Ray actor from a copy of the
    client's files as the task found them: the same update, byte for byte in its tensor section."""
    from fedge import codec
    from fedge.simulation.backends import InlineBackend

    recording = Recording(InlineBackend(), tmp_path / "snapshots")
    recording.snapshots.mkdir()
    run_here(overrides("scaffold", 0.5, "simulated", "inline"), tmp_path / "run", recording)
    assert len(recording.jobs) == 9 and all(recording.frames.values())
    ray_pool = pools["ray"]
    for job in recording.jobs:
        ray_pool.submit(job)
    replayed: dict[tuple[str, int], bytes | None] = {}
    until = time.monotonic() + 120
    while len(replayed) < len(recording.jobs) and time.monotonic() < until:
        replayed.update({(o.client_id, o.round): o.frame for o in ray_pool.results(1.0)})

    def body(frame: bytes | None) -> bytes:
        assert frame is not None
        return frame[codec.read_header(frame).body_at:]

    assert replayed.keys() == recording.frames.keys()
    assert all(body(replayed[key]) == body(recording.frames[key]) for key in recording.frames)


def test_status_lists_the_100_agents_heard_from_last_and_agents_json_lists_all(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_here(["model.name=mlp", "fleet.mode=simulated", "fleet.backend=inline", "data.clients=120",
              "data.partition=iid", "data.train_limit=20", "round.count=4", "run.rounds=1", "run.export_onnx=false"],
             run_dir)
    import json

    status = json.loads((run_dir / "status.json").read_text())
    assert len(status["agents"]) == 100 and status["agents_total"] == 120
    everyone = json.loads((run_dir / "agents.json").read_text())["agents"]
    assert sorted(a["index"] for a in everyone) == list(range(120))
    shown = subprocess.run([sys.executable, "-m", "fedge.runtime.cli", "status", str(run_dir), "--agents"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and sum("agent-" in line for line in shown.stdout.splitlines()) == 120
    short = subprocess.run([sys.executable, "-m", "fedge.runtime.cli", "status", str(run_dir)],
                           capture_output=True, text=True, timeout=60)
    assert "the 100 heard from last (all: --agents)" in short.stdout
