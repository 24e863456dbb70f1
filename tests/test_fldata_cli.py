"""`python -m fedge.fldata partition`: the JSON summary schema, the table, shard output, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedge.fldata import load_dataset, partition, read_shard, summary
from fedge.fldata.cli import main

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fedge.fldata", "partition", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_json_schema() -> None:
    done = run("--dataset", "fmnist-demo", "--partition", "dirichlet", "--clients", "5", "--alpha", "0.5",
               "--seed", "3", "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert list(info) == ["dataset", "partition", "seed", "clients"]
    assert (info["dataset"], info["partition"], info["seed"]) == ("fmnist-demo", "dirichlet", 3)
    assert [c["id"] for c in info["clients"]] == [0, 1, 2, 3, 4]
    for client in info["clients"]:
        assert list(client) == ["id", "train_size", "test_size", "label_counts"]
        assert len(client["label_counts"]) == 10 and all(type(n) is int for n in client["label_counts"])
        assert sum(client["label_counts"]) == client["train_size"]
    assert sum(c["train_size"] for c in info["clients"]) == 12000
    shards = partition(load_dataset("fmnist-demo"), "dirichlet", 5, seed=3, alpha=0.5)
    assert info == summary("fmnist-demo", "dirichlet", 3, shards)


def test_table_and_shards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "shards"
    code = main(["partition", "--dataset", "fmnist-demo", "--partition", "classes", "--clients", "4",
                 "--classes-per-client", "3", "--seed", "1", "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "classes partition, 3 classes per client" in text and "seed 1" in text
    assert text.splitlines()[-2].split()[:2] == ["total", "12000"]
    assert f"wrote 4 shards to {out}" in text
    files = sorted(p.name for p in out.iterdir())
    assert files == ["client-000.npz", "client-001.npz", "client-002.npz", "client-003.npz"]
    shard = read_shard(out / "client-002.npz")
    assert shard.index == 2 and shard.partition == "classes" and len(shard.meta["classes"]) == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dataset", "fmnist-demo", "--partition", "iid", "--clients", "0"], "clients must be a positive"),
        (["--dataset", "cifar10", "--partition", "iid", "--clients", "2", "--data-dir", "/nonexistent/cifar"],
         "/nonexistent/cifar"),
    ],
)
def test_errors_are_one_line(args: list[str], message: str) -> None:
    done = run(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr
    assert "Traceback" not in done.stderr
