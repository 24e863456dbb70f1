"""Real processes for the tests whose subject is the process boundary (a SIGKILLed coordinator resumed, SIGTERM,
CurveZMQ and identity, a rolling upgrade, slowed agents, a service agent across sessions, the browser): the ``procs``
fixture starts coordinators, agents and other CLI commands on 127.0.0.1 and kills every one of them, by PID, at
teardown. Sessions that are not about the process boundary run in this process (``tests/simfleet.py``,
the ``sessions`` fixture)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Small, fast sessions: the MLP, a few hundred samples per agent, short heartbeats, no ONNX export at the end (about
# 4 s a session; the tests that read model.onnx turn it back on with EXPORT_ONNX after FAST).
FAST = ["--model", "mlp", "--set", "data.train_limit=300", "--set", "fleet.heartbeat_s=0.5",
        "--set", "fleet.liveness_s=6.0", "--set", "run.export_onnx=false", "--quiet"]
EXPORT_ONNX = ["--set", "run.export_onnx=true"]


class Processes:
    """Every process a test starts; all of them (and their process groups) are killed at teardown."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], name: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """``python -m ARGS`` in its own session, output in ``NAME.out``; ``env`` is added to the child's
        environment only (this process's is never changed)."""
        log = open(self.workdir / f"{name}.out", "ab")  # noqa: SIM115 - closed by the child's exit
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
        process = subprocess.Popen([sys.executable, "-m", *args], cwd=self.workdir, stdout=log, stderr=log,
                                   stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        log.close()
        self.started.append(process)
        return process

    def coordinator(self, *args: str, name: str = "coordinator",
                    env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        return self.start(["fedge.runtime.cli", "start", *args], name, env)

    def agent(self, *args: str, name: str) -> subprocess.Popen[bytes]:
        return self.start(["fedge.edge_agent", "run", *args], name)

    def cli(self, sets: list[str] | tuple[str, ...], run_dir: Path, *extra: str,
            name: str | None = None, crash_at: str = "") -> subprocess.Popen[bytes]:
        """``coordinator start --set ... --run-dir RUN --quiet`` as a user types it (output in ``NAME.out``, by
        default the run directory's name); ``finish`` waits for it. ``crash_at`` (``POINT:ROUND``) is the child's
        FEDGE_CRASH_AT: it exits 70 there."""
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        return self.coordinator(*cli_args(sets), *extra, "--run-dir", str(run_dir), "--quiet",
                                name=name or run_dir.name, env={"FEDGE_CRASH_AT": crash_at} if crash_at else None)

    def finish(self, process: subprocess.Popen[bytes], name: str, timeout_s: float = 180) -> None:
        """Wait for a started process (killing its process group if it overruns); it must have exited 0."""
        try:
            process.wait(timeout=timeout_s)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        assert process.returncode == 0, self.output(name)[-3000:]

    def run_cli(self, sets: list[str] | tuple[str, ...], run_dir: Path, *extra: str, timeout_s: float = 180) -> None:
        """A whole ``coordinator start`` run, to its end (exit code 0)."""
        self.finish(self.cli(sets, run_dir, *extra), run_dir.name, timeout_s)

    def output(self, name: str) -> str:
        path = self.workdir / f"{name}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def cleanup(self) -> None:
        """Kill every started process's group, whether or not its leader has exited: a coordinator that ended at a
        crash point leaves its local fleet's workers in its group."""
        for process in self.started:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=10)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    """Registered in conftest.py."""
    processes = Processes(tmp_path)
    try:
        yield processes
    finally:
        processes.cleanup()


def cli_args(sets: list[str] | tuple[str, ...]) -> list[str]:
    """``--set`` options for each ``key=value``."""
    args: list[str] = []
    for item in sets:
        args += ["--set", item]
    return args


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def local_agent_pids(run_dir: Path) -> list[int]:
    """The local agents' pids, as the coordinator's log says them (a forked agent's command line is its server's)."""
    log = run_dir / "coordinator.log"
    text = log.read_text() if log.exists() else ""
    return [int(pid) for pid in re.findall(r"local agent agent-\d+ started \(pid (\d+)\)", text)]


def finished(process: subprocess.Popen[bytes], timeout: float) -> int:
    return process.wait(timeout=timeout)


def shards(tmp_path: Path, clients: int) -> Path:
    """IID shards of fmnist-demo for ``clients`` devices, written by `coordinator partition` (its ``main``, in this
    process: the shards are the subject of no test here)."""
    from fedge.runtime.cli import main

    out = tmp_path / "shards"
    assert main(["partition", "--dataset", "fmnist-demo", "--partition", "iid", "--clients", str(clients), "--seed",
                 "0", "--out", str(out)]) == 0
    return out


def endpoint(run_dir: Path) -> str:
    """The endpoint a coordinator bound (its run directory's endpoint file), once written."""
    return wait_for(lambda: (run_dir / "endpoint").exists() and (run_dir / "endpoint").read_text().strip(),
                    60, "the endpoint file")
