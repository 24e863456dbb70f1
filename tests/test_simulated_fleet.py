"""A simulated fleet (inline, local workers, Ray actors) gives the same models and records as a fleet of agent
processes, bit for bit, at full and partial participation; and across SIGTERM and --resume. One local Ray cluster
for the whole module (bound to 127.0.0.1, usage statistics off).

One real fleet of agent processes per algorithm family, at one participation (``REAL_FLEETS``), its coordinator in
this process (the agents' process boundary is the claim); every other cell (algorithm, participation) compares the
simulated backends with its inline session, played once in this process (``InlineRuns``, module-scoped, also what the
Ray actors replay). Four devices, at a seed where half participation has a device sit a round out and come back
(``sits_out_and_returns``): the device state kept across that round is what the partial cells are about."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e import Processes, local_agent_pids, wait_for
from tests.simfleet import differences, overrides, read_jsonl, records, resume_here, run_here

pytestmark = pytest.mark.xdist_group("simulated_fleet")  # one Ray cluster, one set of pools, one cache of runs

# One real fleet per algorithm family, at the participation it plays: a stateless device and a dense update (FedAvg
# and its kin), with every device at once; control variates kept as device state across the rounds a device sits out
# (scaffold); the server's pruning mask, sparse Tasks and complement-only uplinks (dssa); error feedback, a residual
# and a replica as device state, sparse catch-up Tasks (ef). FedBN is FedAvg's family here: on the MLP these
# sessions train (no BatchNorm) it keeps no tensor on the device, and no personal model is evaluated.
ALGORITHMS = ("fedavg", "scaffold", "dssa-fedprox", "ef-fedprox", "fedbn")
REAL_FLEETS = {"fedavg": 1.0, "scaffold": 0.5, "dssa-fedprox": 0.5, "ef-fedprox": 0.5}
SIMULATED_CELLS = [(name, fraction) for name in ALGORITHMS for fraction in (0.5, 1.0)
                   if REAL_FLEETS.get(name) != fraction]  # the simulated backends against the inline session
BACKENDS = ("inline", "local", "ray")
# The sessions' size: 4 devices (half participation: 2 a round), seed 5: device 3 trains in rounds 1 and 3, devices 0
# and 2 in two rounds in a row (``sits_out_and_returns`` checks it of every partial cell).
DEVICES = 4
SIZE = (f"fleet.local_agents={DEVICES}", "run.seed=5")


def cell(algorithm: str, fraction: float, mode: str, backend: str = "local", extra: tuple[str, ...] = ()
         ) -> list[str]:
    """``simfleet.overrides`` at this module's size."""
    return overrides(algorithm, fraction, mode, backend, (*SIZE, *extra))


def reported(fraction: float) -> list[int]:
    """The updates each of the 3 rounds must count."""
    return [DEVICES // 2 if fraction == 0.5 else DEVICES] * 3


def sits_out_and_returns(played: dict[str, Any]) -> bool:
    """Some device trained in a round, sat the next one out and trained again later (``records``' clients)."""
    rounds: dict[int, set[int]] = {}
    for row in played["clients"]:
        rounds.setdefault(row["client_index"], set()).add(row["round"])
    return any(r + 1 not in mine and max(mine) > r + 1 for mine in rounds.values() for r in mine)


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

    kept: dict[str, Any] = {"local": LocalBackend(2), "ray": RayBackend(2)}
    try:
        yield kept
    finally:
        for backend in kept.values():
            backend.close()


class Recording:
    """A backend that keeps, for every job, a copy of the client's state directory as the job found it."""

    def __init__(self, inner: Any, snapshots: Path) -> None:
        self.inner, self.workers, self.snapshots = inner, inner.workers, snapshots
        self.jobs: list[Any] = []
        self.frames: dict[tuple[str, int], bytes | None] = {}

    def submit(self, job: Any) -> None:
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


class InlineRuns:
    """Each cell's session on the inline backend, played once in this process and recorded (``Recording``): the
    reference its other backends are compared with, and the tasks a Ray actor replays."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.recorded: dict[tuple[str, float], Recording] = {}

    def run(self, algorithm: str, fraction: float) -> Path:
        run_dir = self.root / f"{algorithm}-{fraction}"
        if (algorithm, fraction) not in self.recorded:
            from fedge.simulation.backends import InlineBackend

            recording = Recording(InlineBackend(), self.root / f"{algorithm}-{fraction}-snapshots")
            recording.snapshots.mkdir()
            run_here(cell(algorithm, fraction, "simulated", "inline"), run_dir, recording)
            self.recorded[(algorithm, fraction)] = recording
        return run_dir

    def recording(self, algorithm: str, fraction: float) -> Recording:
        self.run(algorithm, fraction)
        return self.recorded[(algorithm, fraction)]


@pytest.fixture(scope="module")
def inline_runs(tmp_path_factory: pytest.TempPathFactory) -> InlineRuns:
    return InlineRuns(tmp_path_factory.mktemp("inline"))


def simulated(algorithm: str, fraction: float, root: Path, pools: dict[str, Any], inline_runs: InlineRuns
              ) -> dict[str, Path]:
    """The cell's session on every simulated backend: the inline one shared, the local and Ray ones on the
    module's pools."""
    runs = {"inline": inline_runs.run(algorithm, fraction)}
    for backend in ("local", "ray"):
        runs[backend] = root / backend
        run_here(cell(algorithm, fraction, "simulated", backend), runs[backend], pools[backend])
    return runs


def kill_agents_left(run_dir: Path) -> None:
    """Kill, by PID, the agent processes a session in this process left behind (its fleet stops them itself; this is
    for a session that failed half-way)."""
    for pid in local_agent_pids(run_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("algorithm", list(REAL_FLEETS))
def test_every_backend_matches_a_fleet_of_agent_processes(algorithm: str, tmp_path: Path, pools: dict[str, Any],
                                                         inline_runs: InlineRuns) -> None:
    """The session `coordinator start` with `fleet.mode = "process"` plays (four agent processes over loopback TCP,
    the family's participation; its coordinator in this process), then the simulated backends' sessions."""
    fraction = REAL_FLEETS[algorithm]
    try:
        run_here(cell(algorithm, fraction, "process"), tmp_path / "process")
    finally:
        kill_agents_left(tmp_path / "process")
    expected = records(tmp_path / "process")
    assert len(list((tmp_path / "process" / "agents").glob("agent-*/agent.log"))) == DEVICES  # one process each
    assert [row["reported"] for row in expected["metrics"]] == reported(fraction)
    assert fraction == 1.0 or sits_out_and_returns(expected)
    runs = simulated(algorithm, fraction, tmp_path, pools, inline_runs)
    for backend in BACKENDS:
        assert differences(expected, records(runs[backend])) == [], backend


@pytest.mark.parametrize(("algorithm", "fraction"), SIMULATED_CELLS)
def test_every_backend_plays_the_inline_session_bit_for_bit(algorithm: str, fraction: float, tmp_path: Path,
                                                            pools: dict[str, Any], inline_runs: InlineRuns) -> None:
    """Every other cell: worker processes and Ray actors give the inline session's records (the inline backend's
    equality with agent processes, family by family: the test above)."""
    runs = simulated(algorithm, fraction, tmp_path, pools, inline_runs)
    expected = records(runs["inline"])
    assert [row["reported"] for row in expected["metrics"]] == reported(fraction)
    assert fraction == 1.0 or sits_out_and_returns(expected)
    for backend in ("local", "ray"):
        assert differences(expected, records(runs[backend])) == [], backend


def test_a_simulated_run_stopped_by_sigterm_resumes_to_the_uninterrupted_run(tmp_path: Path, procs: Processes,
                                                                            pools: dict[str, Any]) -> None:
    """`coordinator start` of a simulated fleet on worker processes, sent SIGTERM as soon as its first row is
    written (a round's row is written when the next round closes: rounds 3 to 6 are still to play), and resumed by
    `--resume`'s rules (in this process, on the module's worker pool): the records of the uninterrupted inline run,
    bit for bit."""
    longer = ("run.rounds=6",)
    run_dir = tmp_path / "stopped"
    process = procs.cli(cell("ef-fedprox", 0.5, "simulated", "local", longer), run_dir)
    first = run_dir / "metrics.jsonl"
    wait_for(lambda: (first.exists() and first.stat().st_size) or process.poll() is not None, 120, "the first row",
             interval=0.02)
    process.send_signal(signal.SIGTERM)
    procs.finish(process, "stopped", 60)
    done = len(read_jsonl(first))
    assert 1 <= done < 6, procs.output("stopped")[-2000:]
    assert json.loads((run_dir / "report.json").read_text())["status"] == "stopped"
    assert resume_here(run_dir, backend=pools["local"])["status"] == "done"
    run_here(cell("ef-fedprox", 0.5, "simulated", "inline", longer), tmp_path / "whole")
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


def test_a_client_rebuilt_from_its_files_on_a_ray_actor_trains_as_it_did_here(pools: dict[str, Any],
                                                                             inline_runs: InlineRuns) -> None:
    """Every task of an inline SCAFFOLD run (device state and all) replayed on a Ray actor from a copy of the
    client's files as the task found them: the same update, byte for byte in its tensor section."""
    from fedge import codec

    recording = inline_runs.recording("scaffold", 0.5)
    assert len(recording.jobs) == sum(reported(0.5)) and all(recording.frames.values())
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


def test_status_lists_the_100_agents_heard_from_last_and_agents_json_lists_all(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedge.runtime.cli import main

    run_dir = tmp_path / "run"
    run_here(["model.name=mlp", "fleet.mode=simulated", "fleet.backend=inline", "data.clients=120",
              "data.partition=iid", "data.train_limit=20", "round.count=4", "run.rounds=1", "run.export_onnx=false"],
             run_dir)
    status = json.loads((run_dir / "status.json").read_text())
    assert len(status["agents"]) == 100 and status["agents_total"] == 120
    everyone = json.loads((run_dir / "agents.json").read_text())["agents"]
    assert sorted(a["index"] for a in everyone) == list(range(120))
    capsys.readouterr()
    assert main(["status", str(run_dir), "--agents"]) == 0  # `coordinator status RUN --agents`
    assert sum("agent-" in line for line in capsys.readouterr().out.splitlines()) == 120
    assert main(["status", str(run_dir)]) == 0
    assert "the 100 heard from last (all: --agents)" in capsys.readouterr().out
