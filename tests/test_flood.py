"""A session under a scaled-down flood: a peer sending junk is counted and answered a few times per window, a peer
sending frames above the session's frame limit is cut off by the transport, and every round still finishes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import zmq

from tests.e2e import Processes, finished, metrics, wait_for

ROOT = Path(__file__).resolve().parents[1]
JUNK = 20_000


def test_rounds_finish_under_a_flood_and_its_log_lines_are_capped(procs: Processes, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    run_dir = tmp_path / "run"
    coordinator = procs.coordinator(
        "--bind", "tcp://127.0.0.1:0", "--expect", "2", "--rounds", "3", "--run-dir", str(run_dir),
        "--model", "tests.plugin_models:tabular_mlp", "--algorithm", "fedavg",
        "--set", "data.dataset=\"tests.plugin_models:sensor_windows\"", "--set", "data.clients=2",
        "--set", "security.curve=\"off\"", "--set", "fleet.heartbeat_s=0.5", "--set", "run.export_onnx=false",
        "--quiet")
    address = wait_for(lambda: (run_dir / "endpoint").exists() and (run_dir / "endpoint").read_text().strip(),
                       60, "the endpoint file")
    context = zmq.Context()
    try:
        flooder = context.socket(zmq.DEALER)
        flooder.setsockopt(zmq.IDENTITY, b"flooder")
        flooder.setsockopt(zmq.SNDTIMEO, 10_000)
        flooder.setsockopt(zmq.LINGER, 0)
        flooder.connect(address)
        for i in range(JUNK):
            flooder.send(i.to_bytes(4, "little") * 4)
        whale = context.socket(zmq.DEALER)
        whale.setsockopt(zmq.IDENTITY, b"whale")
        whale.setsockopt(zmq.LINGER, 0)
        whale.connect(address)
        for _ in range(3):  # far above the frame limit of this small model: libzmq drops them and the connection
            whale.send(os.urandom(8 << 20), zmq.NOBLOCK)

        def counted() -> bool:
            status = run_dir / "status.json"
            return status.exists() and json.loads(status.read_text()).get("rejections", {}).get("flooder") == JUNK

        wait_for(counted, 60, "every junk message counted")
        for i in range(2):
            procs.agent("--coordinator", address, "--client-id", f"pi-{i}", "--data",
                        "tests.plugin_models:device_windows", "--state-dir", str(tmp_path / f"state-{i}"),
                        "--allow-plugin", "tests.plugin_models:tabular_mlp", name=f"agent-{i}")
        assert finished(coordinator, 180) == 0, procs.output("coordinator")
    finally:
        context.destroy(linger=0)
    assert len(metrics(run_dir)) == 3 and all(r["reported"] == 2 for r in metrics(run_dir))
    report = json.loads((run_dir / "report.json").read_text())
    assert report["rejections"]["flooder"] == JUNK and "whale" not in report["rejections"]
    lines = [json.loads(line) for line in (run_dir / "coordinator.log").read_text().splitlines()]
    about_flooder = [line for line in lines if "flooder" in line["msg"]]
    assert 10 <= len(about_flooder) <= 40, len(about_flooder)  # 10 answered per 10-second window, then a count
