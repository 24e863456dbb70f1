"""A directory of shard files loads as one dataset, so users can bring their own data in the shard format."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedge.fldata import ClientShard, DataError, load_dataset, partition, write_shard


def write_shards(directory: Path) -> list[ClientShard]:
    directory.mkdir(exist_ok=True)
    shards = partition(load_dataset("fmnist-demo"), "dirichlet", 4, seed=0, alpha=1.0)
    for s in shards:
        write_shard(directory / f"client-{s.index:03d}.npz", s)
    return shards


def test_shards_join_into_a_dataset(tmp_path: Path) -> None:
    shards = write_shards(tmp_path / "mine")
    ds = load_dataset("npz", str(tmp_path / "mine"))
    assert ds.name == "npz" and ds.num_classes == 10 and ds.input_shape == (1, 28, 28)
    np.testing.assert_array_equal(ds.train_x, np.concatenate([s.train_x for s in shards]))
    np.testing.assert_array_equal(ds.train_y, np.concatenate([s.train_y for s in shards]))
    np.testing.assert_array_equal(ds.test_y, np.concatenate([s.test_y for s in shards]))
    assert ds.mean == shards[0].mean and ds.std == shards[0].std
    again = partition(ds, "iid", 3, seed=1)
    assert sum(len(s.train_y) for s in again) == 12000


def test_single_shard_file(tmp_path: Path) -> None:
    write_shards(tmp_path)
    assert len(load_dataset("npz", str(tmp_path / "client-002.npz")).train_y) > 0


def test_mismatched_shards_are_named(tmp_path: Path) -> None:
    shards = write_shards(tmp_path)
    odd = shards[1]
    other = ClientShard(index=9, train_x=odd.train_x[:, :, :14], train_y=odd.train_y,
                        test_x=odd.test_x[:, :, :14], test_y=odd.test_y, num_classes=10, mean=odd.mean,
                        std=odd.std, dataset="x", partition="iid", seed=0, meta={})
    write_shard(tmp_path / "client-009.npz", other)
    with pytest.raises(DataError, match="client-009.npz"):
        load_dataset("npz", str(tmp_path))


@pytest.mark.parametrize("setup", ["empty", "missing", "none"])
def test_no_shards_is_an_error(tmp_path: Path, setup: str) -> None:
    path = {"empty": str(tmp_path), "missing": str(tmp_path / "absent"), "none": None}[setup]
    with pytest.raises(DataError, match="shard"):
        load_dataset("npz", path)
