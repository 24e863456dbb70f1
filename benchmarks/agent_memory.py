"""An agent's memory while it trains the paper CNN, and while it waits between rounds, measured from outside.

    python benchmarks/agent_memory.py [--agents 10] [--rounds 4] [--algorithm ef-fedprox] [--model cnn]
        [--env NAME=VALUE ...] [--keep DIR]

Starts the README's session (``coordinator start``, a local fleet of real agent processes on 127.0.0.1; the embedded
default algorithm unless ``--algorithm``) and samples every agent process's resident set (RSS, and the unique set
USS) every 50 ms through psutil. Prints, per agent and over the fleet: the peak RSS (also the agent's own
``ru_maxrss`` as metrics.jsonl reports it), and the idle RSS, sampled while every agent waits for its next task (the
moments right after the coordinator closed a round, from round 2 on). ``--env`` sets variables for the agents (for
example ``MALLOC_ARENA_MAX=2``), so that one invocation can be compared with another. Figures only: no thresholds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

MB = 2**20


def agents_of(coordinator: psutil.Process) -> list[psutil.Process]:
    found = []
    try:
        children = coordinator.children(recursive=True)
    except psutil.Error:
        return []
    for child in children:
        try:
            if "fedge.edge_agent" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:  # gone, or a zombie at the end of the session
            continue
    return found


def rounds_done(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--algorithm", default=None, help="default: the embedded session's (ef-fedprox)")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the agents (repeatable)")
    parser.add_argument("--keep", type=Path, help="run directory to keep (default: a temporary one)")
    args = parser.parse_args(argv)
    extra_env = dict(item.split("=", 1) for item in args.env)
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = args.keep or Path(scratch) / "run"
        command = [sys.executable, "-m", "fedge.runtime.cli", "start", "--rounds", str(args.rounds),
                   "--local-fleet", str(args.agents), "--model", args.model, "--run-dir", str(run_dir), "--quiet"]
        if args.algorithm:
            command += ["--algorithm", args.algorithm]
        process = subprocess.Popen(command, env={**os.environ, **extra_env}, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
        coordinator = psutil.Process(process.pid)
        peaks: dict[int, float] = {}
        idle: list[float] = []
        seen_rounds = 0
        started = time.monotonic()
        while process.poll() is None:
            agents = []
            for agent in agents_of(coordinator):
                try:
                    agents.append((agent.pid, agent.memory_full_info()))
                except psutil.Error:
                    continue
            for pid, info in agents:
                peaks[pid] = max(peaks.get(pid, 0.0), info.rss / MB)
            done = rounds_done(run_dir)
            if done > seen_rounds:
                seen_rounds = done
                if done >= 2 and done < args.rounds:  # every agent has finished its round and waits
                    idle += [info.rss / MB for _, info in agents]
            time.sleep(0.05)
        _, stderr = process.communicate()
        if process.returncode != 0:
            print(stderr[-2000:], file=sys.stderr)
            return process.returncode
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        reported = [r["rss_peak_mb"] for r in rows if isinstance(r.get("rss_peak_mb"), float)]
        wall = time.monotonic() - started
    print(f"{args.agents} agents, {args.rounds} rounds of {args.model} ({args.algorithm or 'ef-fedprox'}), "
          f"agent env {extra_env or '{}'}; {wall:.0f} s")
    values = sorted(peaks.values())
    print(f"peak RSS per agent, sampled: median {statistics.median(values):.0f} MB, max {max(values):.0f} MB "
          f"(min {min(values):.0f})")
    if reported:
        print(f"peak RSS per agent, the agents' own ru_maxrss (metrics.jsonl rss_peak_mb): max {max(reported):.0f} MB")
    if idle:
        print(f"idle RSS between rounds: median {statistics.median(idle):.0f} MB, max {max(idle):.0f} MB "
              f"({len(idle)} samples)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
