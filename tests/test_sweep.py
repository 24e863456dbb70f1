"""The reproduction harness: a tiny grid runs real sessions, tabulates them, skips finished runs and resumes
unfinished ones."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from fedge.coordinator.sweep import expand

GRID = """
[sweep]
seeds = [0]
baseline = "fedavg"
[base]
run = { rounds = 2 }
fleet = { local_agents = 2, heartbeat_s = 0.5 }
data = { dataset = "fmnist-demo", partition = "iid", train_limit = 100 }
model = { name = "mlp" }
[[method]]
label = "fedavg"
algorithm = { name = "fedavg" }
[[method]]
label = "ef"
algorithm = { name = "ef-fedavg", keep = 0.1 }
"""


def sweep(grid: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fedge.coordinator.cli", "sweep", "--grid", str(grid), "--out", str(out)],
                          capture_output=True, text=True, timeout=400)


def test_grid_expands_seed_major_with_axes() -> None:
    import tomllib

    grid = tomllib.loads(GRID + '[axes]\n"data.alpha" = [0.1, 1.0]\n')
    grid["sweep"]["seeds"] = [0, 1]
    cells, baseline = expand(grid)
    assert baseline == "fedavg" and len(cells) == 2 * 2 * 2
    assert [c.seed for c in cells] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert cells[1].key == "fedavg_alpha1.0_seed0" and cells[1].raw["data"]["alpha"] == 1.0


def test_a_sweep_runs_tabulates_skips_and_resumes(tmp_path: Path) -> None:
    grid, out = tmp_path / "grid.toml", tmp_path / "out"
    grid.write_text(GRID)
    first = sweep(grid, out)
    assert first.returncode == 0, first.stdout + first.stderr
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert {r["method"] for r in rows} == {"fedavg", "ef"}
    ef = next(r for r in rows if r["method"] == "ef")
    assert float(ef["byte_reduction"]) > 0.5 and 0 <= float(ef["final_accuracy_mean"]) <= 1
    assert (out / "summary.md").read_text().count("|") > 10 and (out / "accuracy_vs_bytes.png").stat().st_size
    (out / "runs" / "ef_seed0" / "report.json").unlink()  # as if the sweep had been killed during this run
    second = sweep(grid, out)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "fedavg_seed0: skipped (done)" in second.stdout and "ef_seed0: ran" in second.stdout
    assert (out / "runs" / "ef_seed0" / "report.json").exists()
