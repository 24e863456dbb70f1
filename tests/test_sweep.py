"""The reproduction harness: a tiny grid runs its sessions, tabulates them, skips finished runs and resumes
unfinished ones; the same table one cell at a time, two at a time and as Ray tasks; shards; claimed cells are left to
their holder; a failing cell is retried, recorded and does not end the sweep. Every cell is a ``coordinator start``
process of its own, as a sweep runs it, whose fleet is simulated in that process (the fleet is not what a sweep is
about). The sweep command itself runs in this process (``coordinator``'s ``main``), but for Ray's, which starts and
stops a Ray cluster of its own."""

from __future__ import annotations

import contextlib
import csv
import io
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from fedge.runtime.cli import main as coordinator
from fedge.sweep.grid import expand

GRID = """
[sweep]
seeds = [0]
baseline = "fedavg"
[base]
run = { rounds = 2, export_onnx = false }
fleet = { local_agents = 2, mode = "simulated", backend = "inline" }
data = { dataset = "fmnist-demo", partition = "iid", train_limit = 100 }
model = { name = "mlp" }
[[method]]
label = "fedavg"
algorithm = { name = "fedavg" }
[[method]]
label = "ef"
algorithm = { name = "ef-fedavg", keep = 0.1 }
"""


class Swept(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def sweep(grid: Path, out: Path, *extra: str) -> Swept:
    """``coordinator sweep --grid GRID --out OUT ...`` in this process: its exit status and what it printed."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = coordinator(["sweep", "--grid", str(grid), "--out", str(out), *extra])
    return Swept(code, stdout.getvalue(), stderr.getvalue())


def table(out: Path) -> list[dict[str, str]]:
    return sorted(csv.DictReader((out / "summary.csv").open()), key=lambda row: row["method"])


def test_grid_expands_seed_major_with_axes() -> None:
    import tomllib

    grid = tomllib.loads(GRID + '[axes]\n"data.alpha" = [0.1, 1.0]\n')
    grid["sweep"]["seeds"] = [0, 1]
    cells, baseline = expand(grid)
    assert baseline == "fedavg" and len(cells) == 2 * 2 * 2
    assert [c.seed for c in cells] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert cells[1].key == "fedavg_alpha1.0_seed0" and cells[1].raw["data"]["alpha"] == 1.0


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The grid swept once, cell after cell: its output directory (beside the grid file)."""
    root = tmp_path_factory.mktemp("sweep")
    (root / "grid.toml").write_text(GRID)
    first = sweep(root / "grid.toml", root / "out")
    assert first.returncode == 0, first.stdout + first.stderr
    return root / "out"


@pytest.mark.xdist_group("sweep")
def test_a_sweep_runs_and_tabulates(swept: Path) -> None:
    rows = list(csv.DictReader((swept / "summary.csv").open()))
    assert {r["method"] for r in rows} == {"fedavg", "ef"}
    ef = next(r for r in rows if r["method"] == "ef")
    assert float(ef["byte_reduction"]) > 0.5 and 0 <= float(ef["final_accuracy_mean"]) <= 1
    assert (swept / "summary.md").read_text().count("|") > 10 and (swept / "accuracy_vs_bytes.png").stat().st_size


@pytest.mark.xdist_group("sweep")
def test_two_cells_at_a_time_give_the_same_table(swept: Path, tmp_path: Path) -> None:
    again = sweep(swept.parent / "grid.toml", tmp_path / "jobs", "--jobs", "2")
    assert again.returncode == 0, again.stdout + again.stderr
    assert table(tmp_path / "jobs") == table(swept)  # to the last byte: a simulated fleet meters nothing


@pytest.mark.xdist_group("sweep")
def test_cells_as_ray_tasks_give_the_same_table(swept: Path, tmp_path: Path) -> None:
    """In a process of its own: the sweep starts and stops a private Ray cluster."""
    again = subprocess.run([sys.executable, "-m", "fedge.runtime.cli", "sweep", "--grid", str(swept.parent / "grid.toml"),
                            "--out", str(tmp_path / "ray"), "--backend", "ray"], capture_output=True, text=True,
                           timeout=400)
    assert again.returncode == 0, again.stdout + again.stderr
    assert table(tmp_path / "ray") == table(swept)


@pytest.mark.xdist_group("sweep")
def test_a_sweep_again_skips_finished_runs_and_resumes_the_unfinished(swept: Path) -> None:
    (swept / "runs" / "ef_seed0" / "report.json").unlink()  # as if the sweep had been killed during this run
    second = sweep(swept.parent / "grid.toml", swept)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "fedavg_seed0: skipped (done)" in second.stdout and "ef_seed0: ran" in second.stdout
    assert (swept / "runs" / "ef_seed0" / "report.json").exists()


def test_shards_split_the_grid_and_a_bad_shard_is_refused(tmp_path: Path) -> None:
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID.replace("seeds = [0]", "seeds = [0, 1]"))
    listed = []
    for shard in ("1/2", "2/2"):
        out = sweep(grid, tmp_path / "out", "--dry-run", "--shard", shard)
        assert out.returncode == 0, out.stderr
        listed.append([line.strip() for line in out.stdout.splitlines() if line.startswith("  ")])
    assert listed == [["fedavg_seed0", "fedavg_seed1"], ["ef_seed0", "ef_seed1"]]
    bad = sweep(grid, tmp_path / "out", "--dry-run", "--shard", "3/2")
    assert bad.returncode == 2 and "--shard 3/2" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    missing = sweep(tmp_path / "nope.toml", tmp_path / "out", "--dry-run")
    assert missing.returncode == 2 and "grid file not found" in missing.stderr


def test_a_claimed_cell_is_left_to_its_holder_and_a_failing_cell_is_recorded(tmp_path: Path) -> None:
    import json
    import time

    grid, out = tmp_path / "grid.toml", tmp_path / "out"
    grid.write_text(GRID.replace('algorithm = { name = "ef-fedavg", keep = 0.1 }',
                                 'algorithm = { name = "fedavg", bogus = 1 }'))
    (out / "claims").mkdir(parents=True)
    (out / "claims" / "fedavg_seed0.claim").write_text(json.dumps({"host": "elsewhere", "pid": 1,
                                                                    "heartbeat": time.time()}))
    result = sweep(grid, out)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "fedavg_seed0: skipped (" in result.stdout and "claimed by elsewhere pid 1" in result.stdout
    assert "ef_seed0: failed (exit code 2, then exit code 2" in result.stdout
    assert [json.loads(line)["cell"] for line in (out / "failed.jsonl").read_text().splitlines()] == ["ef_seed0"]
    assert not (out / "claims" / "ef_seed0.claim").exists()  # released after its attempts


def test_the_gap_is_paired_by_seed_with_its_range_and_the_clients_are_checked(tmp_path: Path) -> None:
    import json

    import tomllib

    from fedge.sweep.grid import summarise

    grid = tomllib.loads(GRID)
    grid["sweep"]["seeds"] = [0, 1]
    cells, baseline = expand(grid)
    accuracy = {("fedavg", 0): 0.80, ("fedavg", 1): 0.70, ("ef", 0): 0.81, ("ef", 1): 0.68}
    for cell in cells:
        run = tmp_path / "runs" / cell.key
        run.mkdir(parents=True)
        clients = [[0, 1]] * 6 if (cell.label, cell.seed) != ("ef", 1) else [[0, 1]] * 5 + [[1]]
        run.joinpath("metrics.jsonl").write_text("".join(
            json.dumps({"round": r + 1, "test_accuracy": accuracy[(cell.label, cell.seed)], "bytes_down": 10,
                        "bytes_up": 10, "accepted": clients[r]}) + "\n" for r in range(6)))
    rows = {row["method"]: row for row in summarise(cells, baseline, tmp_path)}
    ef = rows["ef"]
    assert abs(ef["accuracy_gap_points"] - 0.5) < 1e-9  # seed 0: -1 point, seed 1: +2 points
    assert abs(ef["gap_min_points"] + 1) < 1e-9 and abs(ef["gap_max_points"] - 2) < 1e-9
    assert ef["same_clients_as_baseline"] is False and rows["fedavg"]["same_clients_as_baseline"] is True
    assert "+0.50 (-1.00 .. +2.00) | no |" in (tmp_path / "summary.md").read_text()
