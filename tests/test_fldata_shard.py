"""Shard files read back bit-exact, and damaged or malformed ones are refused with the file's name."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fedge.fldata import ClientShard, DataError, load_dataset, partition, read_shard, write_shard


@pytest.fixture(scope="module")
def shard() -> ClientShard:
    return partition(load_dataset("fmnist-demo"), "feature-shift", 8, seed=21)[3]


def test_round_trip_is_bit_exact(tmp_path: Path, shard: ClientShard) -> None:
    path = tmp_path / "client-003.npz"
    write_shard(path, shard)
    back = read_shard(path)
    for part in ("train_x", "train_y", "test_x", "test_y"):
        a, b = getattr(shard, part), getattr(back, part)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    assert (back.index, back.dataset, back.partition, back.seed, back.num_classes) == (
        3, "fmnist-demo", "feature-shift", 21, 10)
    assert back.mean == shard.mean and back.std == shard.std
    assert back.meta == shard.meta and back.label_counts() == shard.label_counts()
    assert not list(tmp_path.glob("*.tmp"))


def test_file_layout(tmp_path: Path, shard: ClientShard) -> None:
    path = tmp_path / "s.npz"
    write_shard(path, shard)
    with zipfile.ZipFile(path) as zf:
        assert sorted(zf.namelist()) == ["meta.npy", "test_x.npy", "test_y.npy", "train_x.npy", "train_y.npy"]
        assert all(info.compress_type == zipfile.ZIP_STORED for info in zf.infolist())
        meta = np.load(io.BytesIO(zf.read("meta.npy")), allow_pickle=False)
    doc = json.loads(str(meta))
    assert doc["format_version"] == 1 and doc["index"] == 3 and doc["meta"]["transform"]


def rewrite(path: Path, shard: ClientShard, **changes: object) -> None:
    arrays: dict[str, object] = {part: getattr(shard, part) for part in ("train_x", "train_y", "test_x", "test_y")}
    meta = {"format_version": 1, "index": 0, "dataset": "d", "partition": "iid", "seed": 0, "num_classes": 10,
            "mean": list(shard.mean), "std": list(shard.std), "meta": {}}
    for key, value in changes.items():
        if key.startswith("meta_"):
            meta[key[5:]] = value
        elif value is None:
            arrays.pop(key)
        else:
            arrays[key] = value
    if "meta" not in changes:
        arrays["meta"] = np.array(json.dumps(meta))
    np.savez(path, **arrays)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"train_y": None}, "shard arrays must be"),
        ({"extra": np.zeros(3)}, "shard arrays must be"),
        ({"train_y": np.zeros(1, np.int32)}, "train_y must have dtype <i8"),
        ({"test_x": np.zeros((2, 1, 28, 28), np.float32)}, "test_x must have dtype |u1"),
        ({"test_x": np.zeros((1, 28, 28), np.uint8), "test_y": np.zeros(1, np.int64)}, "differ from train samples"),
        ({"train_x": np.zeros((2,), np.uint8)}, "sample shape"),
        ({"meta": np.array("{not json")}, "not valid JSON"),
        ({"meta": np.array([1, 2])}, "single unicode string"),
        ({"meta_format_version": 3}, "format version 3"),
        ({"train_x": np.zeros((2, 1, 28, 28), np.float32)}, "train_x must have dtype |u1"),
        ({"meta_num_classes": 3}, "labels must lie in"),
        ({"meta_seed": "zero"}, "meta\\['seed'\\]"),
        ({"meta_std": [0.0]}, "std > 0"),
        ({"meta_mean": [0.1, 0.2]}, "1 values each"),
        ({"meta_colour": "red"}, "meta keys must be"),
    ],
)
def test_malformed_shards_are_refused(tmp_path: Path, shard: ClientShard, changes: dict[str, object],
                                      message: str) -> None:
    path = tmp_path / "bad-shard.npz"
    rewrite(path, shard, **changes)
    with pytest.raises(DataError, match=message) as info:
        read_shard(path)
    assert "bad-shard.npz" in str(info.value)


def test_well_formed_rewrite_is_accepted(tmp_path: Path, shard: ClientShard) -> None:
    rewrite(tmp_path / "ok.npz", shard)
    assert read_shard(tmp_path / "ok.npz").num_classes == 10


@pytest.mark.parametrize("where", ["header", "train_x", "test_y", "directory"])
def test_corrupted_bytes_are_refused(tmp_path: Path, shard: ClientShard, where: str) -> None:
    path = tmp_path / "client-007.npz"
    write_shard(path, shard)
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        infos = {i.filename: i for i in zf.infolist()}
    if where == "header":
        spot = 0
    elif where == "directory":
        spot = len(data) - 30
    else:
        info = infos[f"{where}.npy"]
        spot = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.file_size // 2
    data[spot] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match="client-007.npz"):
        read_shard(path)


@pytest.mark.parametrize("cut", [0, 100, 5000])
def test_truncated_or_missing_files_are_refused(tmp_path: Path, shard: ClientShard, cut: int) -> None:
    path = tmp_path / "client-001.npz"
    write_shard(path, shard)
    path.write_bytes(path.read_bytes()[:cut])
    with pytest.raises(DataError, match="client-001.npz"):
        read_shard(path)
    path.unlink()
    with pytest.raises(DataError, match="client-001.npz"):
        read_shard(path)


def test_pickled_arrays_are_refused(tmp_path: Path, shard: ClientShard) -> None:
    path = tmp_path / "pickled.npz"
    rewrite(path, shard, test_y=np.array([object()], dtype=object))
    with pytest.raises(DataError, match="pickled.npz"):
        read_shard(path)


def test_single_npy_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plain.npz"
    with open(path, "wb") as f:
        np.save(f, np.zeros(3))
    with pytest.raises(DataError, match=r"plain.npz.*single .npy"):
        read_shard(path)
