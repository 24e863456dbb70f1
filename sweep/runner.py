"""Where a sweep's cells run: one after another, ``--jobs N`` at a time on this machine, or as Ray tasks.

Every cell is an ordinary ``coordinator start`` (``--resume`` when its run directory holds a checkpoint) in its own
process. Before it runs, the cell is claimed (``plumbing.claims``: a create-exclusive file under ``OUT/claims``
with host, pid and a heartbeat), so that two sweep processes, on one machine or on several sharing the
filesystem, never run the same cell; a cell another live process holds is left to it. A failed cell is tried once
more (it resumes from its checkpoint) and then recorded in ``OUT/failed.jsonl`` without ending the sweep. With
``--backend ray`` each cell is a Ray task asking for ``local_agents + 1`` CPUs (a process fleet) or
``fleet.workers + 1`` (``--cell-mode simulated``), run on whichever node has them: every node needs the same
Fedge, torch and Ray and the output directory on a shared filesystem (docs/scale.md). Knows no algorithm by name.
"""

from __future__ import annotations

import concurrent.futures as futures
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedge.coordinator.config import ConfigError, from_dict, to_toml
from fedge.plumbing.claims import Claim, ClaimHeld

ATTEMPTS = 2  # a failed cell is tried once more, then recorded as failed
SIMULATED_WORKERS = 2  # a simulated cell's workers when its grid does not say


@dataclass(frozen=True)
class Plan:
    """How the cells run."""

    jobs: int = 1
    backend: str = "local"       # local or ray
    cell_mode: str = "process"   # process or simulated
    ray_address: str = ""
    quiet: bool = True


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``I/N`` (1 <= I <= N) as (I, N); ConfigError otherwise."""
    if not text:
        return None
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ConfigError(f"--shard wants I/N (for example 2/8), got {text!r}") from None
    if not 1 <= index <= count:
        raise ConfigError(f"--shard {text}: I must be between 1 and N")
    return index, count


def cell_config(raw: dict[str, Any], cell_mode: str) -> dict[str, Any]:
    """The cell's configuration in the mode the sweep asks for (a simulated cell with its own local workers)."""
    raw = json.loads(json.dumps(raw))
    if cell_mode == "simulated":
        fleet = raw.setdefault("fleet", {})
        fleet.update(mode="simulated", backend="local", workers=int(fleet.get("workers") or SIMULATED_WORKERS))
    from_dict(raw)
    return raw


def cpus_of(raw: dict[str, Any]) -> int:
    """What a cell occupies: its agent processes (or its workers) and its coordinator."""
    config = from_dict(raw)
    if config.fleet.mode == "simulated":
        return max(config.fleet.workers, 1) + 1
    return config.fleet.local_agents + 1


def start_command(key: str, raw: dict[str, Any], out: Path, cell_mode: str) -> list[str]:
    """The cell's ``coordinator start`` arguments (after ``python -m fedge.runtime.cli``)."""
    run_dir = out / "runs" / key
    if (run_dir / "checkpoint.npz").exists():
        return ["start", "--resume", str(run_dir), "--quiet"]
    config_path = out / "configs" / f"{key}.toml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(to_toml(from_dict(cell_config(raw, cell_mode))))
    return ["start", "--config", str(config_path), "--run-dir", str(run_dir), "--quiet"]


def run_start(arguments: list[str], quiet: bool) -> int:
    """Run ``coordinator start`` in a process of its own (here, or on a Ray node); its exit status."""
    output = subprocess.DEVNULL if quiet else None
    return subprocess.run([sys.executable, "-m", "fedge.runtime.cli", *arguments], stdout=output).returncode


def is_done(run_dir: Path) -> bool:
    report = run_dir / "report.json"
    return report.exists() and json.loads(report.read_text()).get("status") == "done"


class CellRunner:
    """Claims, runs and retries cells; ``launch(arguments, cpus)`` runs one start and returns its exit status."""

    def __init__(self, out: Path, plan: Plan, launch: Callable[[list[str], int], int]) -> None:
        self.out = out
        self.plan = plan
        self.launch = launch

    def run(self, key: str, raw: dict[str, Any]) -> str:
        run_dir = self.out / "runs" / key
        if is_done(run_dir):
            return "skipped (done)"
        try:
            claim = Claim.take(self.out / "claims" / f"{key}.claim")
        except ClaimHeld as held:
            return f"skipped ({held})"
        with claim:
            errors = []
            for _attempt in range(ATTEMPTS):
                code = self.launch(start_command(key, raw, self.out, self.plan.cell_mode),
                                   cpus_of(cell_config(raw, self.plan.cell_mode)))
                if code == 0 and is_done(run_dir):
                    return "ran"
                errors.append(f"exit code {code}")
            self.record_failure(key, errors)
            return f"failed ({', then '.join(errors)}; see {run_dir})"

    def record_failure(self, key: str, errors: list[str]) -> None:
        line = json.dumps({"cell": key, "errors": errors, "at": time.time(), "host": os.uname().nodename})
        with (self.out / "failed.jsonl").open("a") as handle:
            handle.write(line + "\n")


def run_cells(cells: Sequence[Any], out: Path, plan: Plan, report: Callable[[int, str, str], None]) -> list[str]:
    """Run every cell (``key``, ``raw``) under the plan; ``report(number, key, outcome)`` as each ends. Returns
    the outcomes in the cells' order."""
    if plan.backend == "ray":
        launch, jobs, close = ray_launcher(plan)
    else:
        def launch(arguments: list[str], _cpus: int) -> int:
            return run_start(arguments, plan.quiet)

        jobs, close = plan.jobs, (lambda: None)
    runner = CellRunner(out, plan, launch)
    outcomes = [""] * len(cells)
    try:
        with futures.ThreadPoolExecutor(max(1, jobs)) as pool:
            running = {pool.submit(runner.run, cell.key, cell.raw): number for number, cell in enumerate(cells)}
            for future in futures.as_completed(running):
                number = running[future]
                outcomes[number] = future.result()
                report(number + 1, cells[number].key, outcomes[number])
    finally:
        close()
    return outcomes


def ray_launcher(plan: Plan) -> tuple[Callable[[list[str], int], int], int, Callable[[], None]]:
    """Run each start as a Ray task of the CPUs it needs; as many cells in flight as the cluster has CPUs."""
    from fedge.simulation.ray_backend import ray_module, start_local_ray, stop_local_ray

    ray = ray_module()
    owned = False
    if plan.ray_address:
        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(address=plan.ray_address, log_to_driver=False, configure_logging=False)
    else:
        owned = start_local_ray()
    remote = ray.remote(run_start)
    total = int(ray.cluster_resources().get("CPU", 1))

    def launch(arguments: list[str], cpus: int) -> int:
        # A cell larger than the whole cluster would wait forever: it gets the cluster (oversubscribed) instead.
        return int(ray.get(remote.options(num_cpus=min(cpus, total)).remote(arguments, plan.quiet)))

    jobs = max(plan.jobs, total)
    return launch, jobs, (stop_local_ray if owned else (lambda: None))
