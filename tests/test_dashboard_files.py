"""The dashboard's readers of a run directory being written: a partial last line, a file rewritten by --resume (a
new inode, or shorter), a large clients.jsonl read from near its end with a cap, links that would lead out of the
tree, and which directories are runs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from fedge.dashboard.runfiles import JsonlTail, read_json
from fedge.dashboard.runs import MAX_DEPTH, RunView, find_runs, headline, run_state


def line(n: int) -> str:
    return json.dumps({"round": n, "test_accuracy": n / 10}) + "\n"


def test_a_partial_last_line_waits_for_its_end(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(line(1) + line(2)[:9])
    tail = JsonlTail(path)
    tail.refresh()
    assert [r["round"] for r in tail.rows] == [1] and tail.skipped == 0
    with open(path, "a") as handle:
        handle.write(line(2)[9:] + line(3))
    tail.refresh()
    assert [r["round"] for r in tail.since(1)] == [2, 3] and tail.total == 3


def test_a_file_rewritten_by_a_resume_starts_a_new_generation(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(line(n) for n in range(1, 6)))
    tail = JsonlTail(path)
    tail.refresh()
    first = tail.generation
    # --resume truncates to the checkpoint's round by writing a new file: a new inode, here just as long
    replacement = tmp_path / "metrics.jsonl.new"
    replacement.write_text("".join(line(n) for n in (1, 2, 3, 4, 50)))
    os.replace(replacement, path)
    tail.refresh()
    assert tail.generation == first + 1 and [r["round"] for r in tail.since(0)] == [1, 2, 3, 4, 50]
    with open(path, "r+") as handle:  # the same file cut shorter than what was read
        handle.truncate(len(line(1)))
    tail.refresh()
    assert tail.generation == first + 2 and [r["round"] for r in tail.since(0)] == [1]
    path.unlink()
    tail.refresh()
    assert tail.generation == first + 3 and tail.total == 0


def test_a_large_file_is_read_from_near_its_end_and_only_the_newest_rows_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "clients.jsonl"
    path.write_text("".join(line(n) for n in range(1, 2001)))
    tail = JsonlTail(path, keep=50, start_within=4096)
    tail.refresh()
    rows = list(tail.rows)
    assert len(rows) == 50 and rows[-1]["round"] == 2000 and tail.skipped == 0  # began at a line's start
    assert tail.total < 2000
    with open(path, "a") as handle:
        handle.write(line(2001))
    tail.refresh()
    assert tail.since(tail.total - 1) == [{"round": 2001, "test_accuracy": 200.1}]


def test_links_are_not_followed_out_of_the_tree(tmp_path: Path) -> None:
    secret = tmp_path / "outside.json"
    secret.write_text('{"password": "hunter2"}\n')
    run = tmp_path / "served" / "run"
    run.mkdir(parents=True)
    (run / "provenance.json").write_text("{}")
    (run / "status.json").symlink_to(secret)
    (run / "metrics.jsonl").symlink_to(secret)
    assert read_json(run / "status.json") is None
    detail = RunView("run", run, tmp_path / "served").detail(0, -1)
    assert detail["rows"] == [] and "hunter2" not in json.dumps(detail)
    (tmp_path / "served" / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "provenance.json").write_text("{}")
    assert list(find_runs(tmp_path / "served")) == ["run"]


def test_runs_are_the_directories_with_provenance_at_most_three_levels_down(tmp_path: Path) -> None:
    for rel in ("a", "sweep/cell-1", "sweep/cell-2", "x/y/z", "x/y/z/w", "a/agents/agent-00"):
        (tmp_path / rel).mkdir(parents=True, exist_ok=True)
        (tmp_path / rel / "provenance.json").write_text("{}")
    assert MAX_DEPTH == 3
    assert list(find_runs(tmp_path)) == ["a", "sweep/cell-1", "sweep/cell-2", "x/y/z"]
    assert list(find_runs(tmp_path / "a")) == ["."]


def test_a_run_is_running_until_report_json_says_otherwise_or_its_status_goes_stale() -> None:
    now = time.time()
    assert run_state({"updated_at": now - 5}, {}, now) == "running"
    assert run_state({"updated_at": now - 600}, {}, now) == "not running"
    assert run_state({"updated_at": now - 600}, {"status": "budget"}, now) == "budget"
    assert run_state({}, {}, now) == "starting"


def test_a_file_that_grew_past_what_is_worth_reading_is_taken_from_near_its_end(tmp_path: Path) -> None:
    path = tmp_path / "clients.jsonl"
    path.write_text(line(1))
    tail = JsonlTail(path, keep=50, start_within=4096)
    tail.refresh()
    first = tail.generation
    with open(path, "a") as handle:
        handle.write("".join(line(n) for n in range(2, 3001)))
    tail.refresh()
    assert tail.generation == first + 1 and list(tail.rows)[-1]["round"] == 3000 and tail.total < 3000


def test_hostile_lines_and_files_are_skipped_and_the_rows_after_them_kept(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(line(1) + "[" * 100_000 + "\n" + "[1, 2]\n" + "\xff\xfe\n" + line(2))
    tail = JsonlTail(path)
    tail.refresh()
    assert [r["round"] for r in tail.rows] == [1, 2] and tail.skipped == 3
    for content in ("[1, 2, 3]", '"text"', "[" * 100_000, "{", "null"):
        (tmp_path / "status.json").write_text(content)
        assert read_json(tmp_path / "status.json") is None
    os.mkfifo(tmp_path / "report.json")  # a FIFO would block a reader that opened it plainly
    assert read_json(tmp_path / "report.json") is None
    os.mkfifo(tmp_path / "pipe.jsonl")
    fifo = JsonlTail(tmp_path / "pipe.jsonl")
    fifo.refresh()
    assert fifo.total == 0


def test_a_run_directory_swapped_for_a_link_is_no_longer_read(tmp_path: Path) -> None:
    root = tmp_path / "served"
    (root / "run").mkdir(parents=True)
    (root / "run" / "provenance.json").write_text("{}")
    view = RunView("run", root / "run", root)
    assert view.in_place()
    (tmp_path / "outside").mkdir()
    (root / "run").rename(root / ".old")
    (root / "run").symlink_to(tmp_path / "outside", target_is_directory=True)
    assert not view.in_place()


def test_the_headline_figure_is_accuracy_else_the_tasks_own() -> None:
    assert headline([{"test_accuracy": None}, {"test_accuracy": 0.5, "test_mse": 1.0}]) == "test_accuracy"
    assert headline([{"test_accuracy": None, "test_mse": 2.0}]) == "test_mse"
    assert headline([{"test_exact_match": 0.1, "test_label_accuracy": 0.9}]) == "test_exact_match"
    assert headline([{"round": 1}]) is None


def test_the_agent_table_is_sent_again_only_when_it_changed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "provenance.json").write_text("{}")
    (run / "agents.json").write_text(json.dumps({"updated_at": 1.0, "agents": [{"client_id": "a"}]}))
    view = RunView("run", run, tmp_path)
    first = view.detail(0, -1)
    assert first["agents"] == [{"client_id": "a"}]
    assert view.detail(0, -1, first["agents_key"])["agents"] is None
    time.sleep(0.01)
    (run / "agents.json").write_text(json.dumps({"updated_at": 2.0, "agents": [{"client_id": "a"}, {"client_id": "b"}]}))
    again = view.detail(0, -1, first["agents_key"])
    assert [a["client_id"] for a in again["agents"]] == ["a", "b"] and again["agents_key"] != first["agents_key"]
