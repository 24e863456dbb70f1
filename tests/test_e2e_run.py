"""End to end: a local fleet of real agent processes over loopback TCP plays a few rounds; the run directory
matches docs/run-dir.md; `coordinator status` reads it; `coordinator start` refuses a user's mistake in one
line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedge.runtime.cli import main as coordinator
from tests.e2e import EXPORT_ONNX, FAST, Processes, finished, metrics

DOC = Path(__file__).resolve().parents[1] / "docs" / "run-dir.md"


def documented_fields(table_heading: str) -> list[str]:
    text = DOC.read_text().split(f"## {table_heading}", 1)[1].split("\n## ", 1)[0]
    names: list[str] = []
    for line in text.splitlines():
        match = re.match(r"\| (`[^|]+`) \|", line)
        if match:
            names += re.findall(r"`(\w+)`", match.group(1))
    return names


def prometheus(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of a Prometheus text file: (name, labels without ``run``) -> value; every sample is described."""
    import re

    samples, described = {}, set()
    for line in path.read_text().splitlines():
        if line.startswith("# TYPE "):
            described.add(line.split()[2])
            continue
        if line.startswith("#"):
            continue
        found = re.fullmatch(r'([a-z_]+)(?:\{(.*)\})? (\S+)', line)
        assert found, line
        name, labels, value = found.groups()
        assert name in described, name
        pairs = tuple(sorted((k, v) for k, v in re.findall(r'(\w+)="([^"]*)"', labels or "") if k != "run"))
        samples[(name, pairs)] = float(value)
    return samples


def mildly_clipped(message: str) -> bool:
    """A bounds warning that only clipped honest updates a little (no claim capped, every scale at least 0.9): the
    default norm bound does that to a few per cent of honest updates (docs/results/robustness.md), and says so."""
    if not re.match(r"round \d+: bounded \d+ update\(s\): ", message) or "claimed" in message:
        return False
    scales = [float(x) for x in re.findall(r" x([0-9.]+(?:e-?\d+)?)", message)]
    return bool(scales) and min(scales) >= 0.9


def test_a_local_fleet_runs_rounds_and_writes_the_documented_run_dir(procs: Processes, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    coordinator = procs.coordinator("--rounds", "3", "--local-fleet", "3", "--run-dir", str(run_dir),
                                    "--seed", "1", "--set", "eval.personal_every=2", *FAST, *EXPORT_ONNX)
    assert finished(coordinator, 240) == 0, procs.output("coordinator")
    rows = metrics(run_dir)
    assert [r["round"] for r in rows] == [1, 2, 3]
    fields = documented_fields("metrics.jsonl")
    for row in rows:
        assert set(fields) <= set(row), set(fields) - set(row)
        assert row["selected"] == 3 and row["reported"] == 3 and row["dropped"] == 0
        assert 0.0 <= row["test_accuracy"] <= 1.0 and row["wall_s"] > 0
        assert row["bytes_down"] > 0 and row["bytes_up"] > 0
        # where the coordinator's time went: every part measured, none longer than the round it belongs to, and
        # the tail (last update to the Commits) holding the close and the checkpoint
        spent = [row[f] for f in ("receive_s", "fold_s", "downlink_s", "close_s", "tail_s", "checkpoint_s")]
        assert all(0 < v < row["wall_s"] + row["checkpoint_s"] for v in spent), spent
        assert row["tail_s"] > row["close_s"] + row["checkpoint_s"]
    assert rows[-1]["test_accuracy"] > 0.4, "3 rounds on Fashion-MNIST should beat chance clearly"
    assert rows[0]["personal_accuracy"] is None and rows[1]["personal_accuracy_mean"] is not None
    assert set(rows[1]["personal_accuracy"]) == {"agent-00", "agent-01", "agent-02"}
    clients = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text().splitlines()]
    assert len(clients) == 9 and set(documented_fields("clients.jsonl")) <= set(clients[0])
    provenance = json.loads((run_dir / "provenance.json").read_text())
    assert provenance["run_dir_version"] == 1 and provenance["seed"] == 1
    assert (run_dir / "endpoint").read_text().startswith("tcp://127.0.0.1:")
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "done" and report["rounds_completed"] == 3
    assert report["total_bytes_up"] == sum(r["bytes_up"] for r in rows)
    gauges = prometheus(run_dir / "fedge.prom")
    assert gauges[("fedge_round", ())] == 3 and gauges[("fedge_rounds", ())] == 3
    assert gauges[("fedge_bytes", (("direction", "up"),))] == sum(r["bytes_up"] for r in rows)
    assert gauges[("fedge_bytes", (("direction", "down"),))] == sum(r["bytes_down"] for r in rows)
    assert {labels for name, labels in gauges if name == "fedge_agent_seconds_since_seen"} == \
        {(("client", f"agent-0{i}"),) for i in range(3)}
    for name in ("model.npz", "model.onnx", "checkpoint.npz", "config.toml", "coordinator.log"):
        assert (run_dir / name).stat().st_size > 0, name
    for line in (run_dir / "coordinator.log").read_text().splitlines():
        assert {"ts", "level", "logger", "msg"} <= set(json.loads(line))
    logs = [run_dir / "coordinator.log", *sorted((run_dir / "agents").glob("*/agent.log"))]
    noisy = [(path.parent.name, record["msg"]) for path in logs for record in map(json.loads, path.read_text().splitlines())
             if record["level"] not in ("debug", "info") and not mildly_clipped(record["msg"])]
    assert noisy == [], f"a clean session leaves no warnings behind: {noisy}"
    status = subprocess.run([sys.executable, "-m", "fedge.runtime.cli", "status", str(run_dir)],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "round 3/3" in status.stdout and "agent-02" in status.stdout


def test_start_refuses_an_existing_run_and_a_bad_key(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A user's mistake is one line on stderr and exit code 2: from the real command (no traceback), then
    from its ``main`` called here for an algorithm's bad option (nothing written) and a resume without a
    checkpoint."""
    bad = subprocess.run([sys.executable, "-m", "fedge.runtime.cli", "start", "--set", "train.nope=1"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert bad.returncode == 2 and "unknown key" in bad.stderr and "Traceback" not in bad.stderr
    assert bad.stderr.count("\n") == 1 and list(tmp_path.iterdir()) == [], bad.stderr
    capsys.readouterr()
    code = coordinator(["start", "--algorithm", "pfedla", "--set", "algorithm.max_alpha_change=5",
                        "--run-dir", str(tmp_path / "never")])
    stderr = capsys.readouterr().err
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert "max_alpha_change" in stderr and not (tmp_path / "never").exists()
    code = coordinator(["start", "--resume", str(tmp_path)])
    stderr = capsys.readouterr().err
    assert code == 2 and "no checkpoint" in stderr and stderr.count("\n") == 1, stderr
