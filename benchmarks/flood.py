"""A coordinator under a flood: rounds still finish, and its log and memory stay bounded.

Starts a real coordinator bound on 127.0.0.1 (the paper CNN on fmnist-demo, dense FedAvg, 3 rounds, 2 expected
agents) and, once it listens, two hostile peers: one sends ``--junk`` tiny junk messages (16 bytes each), the other
``--big`` frames of ``--big-mb`` MB each (far above the session's frame limit). Then two real agents join and the
session runs to its end. Printed, all measured in this one run: the rounds completed, the growth of
coordinator.log, the coordinator's resident memory before the flood and its peak during the run (sampled every
50 ms), the junk messages counted as refused, and the wall time. docs/protocol.md holds the output.

    python benchmarks/flood.py [--junk 300000] [--big 20] [--big-mb 40]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import zmq

ROOT = Path(__file__).resolve().parents[1]


def wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit(f"flood.py: timed out waiting for {what}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--junk", type=int, default=300_000)
    parser.add_argument("--big", type=int, default=20)
    parser.add_argument("--big-mb", type=float, default=40.0)
    args = parser.parse_args(argv)
    if args.junk < 0 or args.big < 0 or args.big_mb <= 0:
        parser.error("--junk and --big must be >= 0 and --big-mb > 0")
    work = Path(tempfile.mkdtemp(prefix="fedge-flood-"))
    run_dir = work / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    shards = work / "shards"
    subprocess.run([sys.executable, "-m", "fedge.runtime.cli", "partition", "--dataset", "fmnist-demo",
                    "--partition", "iid", "--clients", "2", "--out", str(shards)], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    started = time.monotonic()
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "fedge.runtime.cli", "start", "--bind", "tcp://127.0.0.1:0", "--expect", "2",
         "--rounds", "3", "--run-dir", str(run_dir), "--algorithm", "fedavg", "--set", "data.train_limit=300",
         "--set", "data.clients=2", "--set", "security.curve=\"off\"", "--quiet"], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    agents: list[subprocess.Popen[bytes]] = []
    peak = [0]
    done = threading.Event()
    process = psutil.Process(coordinator.pid)

    def sample() -> None:
        while not done.is_set():
            try:
                peak[0] = max(peak[0], process.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.05)

    try:
        address = wait_for(lambda: (run_dir / "endpoint").exists() and (run_dir / "endpoint").read_text().strip(),
                           120, "the coordinator")
        time.sleep(1.0)
        before_rss = process.memory_info().rss
        log_before = (run_dir / "coordinator.log").stat().st_size
        threading.Thread(target=sample, daemon=True).start()
        context = zmq.Context()
        junk = context.socket(zmq.DEALER)
        junk.setsockopt(zmq.IDENTITY, b"junk")
        junk.setsockopt(zmq.LINGER, 0)
        junk.connect(address)
        big = context.socket(zmq.DEALER)
        big.setsockopt(zmq.IDENTITY, b"big")
        big.setsockopt(zmq.LINGER, 0)
        big.setsockopt(zmq.SNDTIMEO, 2000)
        big.connect(address)
        payload = os.urandom(int(args.big_mb * 1e6))

        def send_big() -> None:
            for _ in range(args.big):
                try:
                    big.send(payload)
                except zmq.Again:
                    pass

        thread = threading.Thread(target=send_big, daemon=True)
        thread.start()
        for i in range(args.junk):
            junk.send((i % 2**32).to_bytes(4, "little") * 4)
        for i in range(2):
            agents.append(subprocess.Popen(
                [sys.executable, "-m", "fedge.edge_agent", "run", "--coordinator", address, "--client-id", f"a{i}",
                 "--data", str(shards / f"client-00{i}.npz"), "--state-dir", str(work / f"state-{i}"),
                 "--after-session", "exit"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        code = coordinator.wait(timeout=600)
        thread.join(timeout=5)
        context.destroy(linger=0)
    finally:
        done.set()
        for p in [coordinator, *agents]:
            if p.poll() is None:
                p.kill()
                p.wait()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    report = json.loads((run_dir / "report.json").read_text())
    log_growth = (run_dir / "coordinator.log").stat().st_size - log_before
    print(f"flood: {args.junk:,} junk messages of 16 bytes from one peer, {args.big} frames of {args.big_mb:g} MB "
          f"from another; paper CNN, dense FedAvg, 2 agents, 3 rounds")
    print(f"coordinator exit code          {code}")
    print(f"rounds completed               {len(rows)} of 3")
    print(f"junk messages counted refused  {report['rejections'].get('junk', 0):,}")
    print(f"coordinator.log growth         {log_growth / 1e6:.3f} MB (target <= 5 MB)")
    print(f"coordinator RSS before flood   {before_rss / 1e6:.0f} MB")
    print(f"coordinator RSS peak           {peak[0] / 1e6:.0f} MB (growth {(peak[0] - before_rss) / 1e6:.0f} MB, "
          f"target <= 600 MB)")
    print(f"wall time                      {time.monotonic() - started:.1f} s")
    return 0 if code == 0 and len(rows) == 3 else 1


if __name__ == "__main__":
    sys.exit(main())
