"""CIFAR-10 python batches, pickled as the real ones are, load exactly; broken batches name themselves."""

from __future__ import annotations

import io
import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedge.fldata import DataError, load_dataset

BATCHES = [f"data_batch_{i}" for i in range(1, 6)]


_PurePickler: Any = pickle._Pickler  # the pure-Python pickler, whose opcode table a subclass may extend


class Py2Pickler(_PurePickler):  # type: ignore[misc]
    """Writes str and bytes as Python 2's str opcodes, as the cPickle that made the real files did."""

    dispatch = dict(_PurePickler.dispatch)

    def save_py2_str(self, obj: str | bytes) -> None:
        raw = obj if isinstance(obj, bytes) else obj.encode("latin-1")
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str
    dispatch[str] = save_py2_str


def batch(rng: np.random.Generator, n: int, name: str) -> dict[bytes, Any]:
    return {
        b"batch_label": name.encode(),
        b"labels": [int(v) for v in rng.integers(0, 10, n)],
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        b"filenames": [f"img_{i}.png".encode() for i in range(n)],
    }


def py2_dumps(obj: object) -> bytes:
    buf = io.BytesIO()
    Py2Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue().replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")


def write_cifar(root: Path, style: str = "py3") -> dict[str, dict[bytes, Any]]:
    directory = root / "cifar-10-batches-py"
    directory.mkdir()
    rng = np.random.default_rng(2)
    batches = {name: batch(rng, 7, name) for name in [*BATCHES, "test_batch"]}
    for name, content in batches.items():
        data = pickle.dumps(content, protocol=2) if style == "py3" else py2_dumps(content)
        (directory / name).write_bytes(data)
    return batches


@pytest.mark.parametrize("style", ["py3", "py2"])
def test_round_trip(tmp_path: Path, style: str) -> None:
    batches = write_cifar(tmp_path, style)
    ds = load_dataset("cifar10", str(tmp_path))
    assert ds.input_shape == (3, 32, 32) and ds.num_classes == 10 and len(ds.train_y) == 35
    data = np.concatenate([batches[n][b"data"] for n in BATCHES])
    np.testing.assert_array_equal(ds.train_x.reshape(35, 3072), data)
    np.testing.assert_array_equal(ds.train_y, sum((batches[n][b"labels"] for n in BATCHES), []))
    np.testing.assert_array_equal(ds.test_x.reshape(7, 3072), batches["test_batch"][b"data"])
    # The row holds the red plane first, row-major: pixel (r, c) of red is column 32 * r + c.
    assert ds.train_x[0, 0, 1, 2] == data[0, 34] and ds.train_x[0, 2, 0, 0] == data[0, 2048]
    assert len(ds.mean) == 3 and len(ds.std) == 3


def test_batches_directory_itself(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    assert len(load_dataset("cifar10", str(tmp_path / "cifar-10-batches-py")).test_y) == 7


def test_missing_batch_is_named(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_4").unlink()
    with pytest.raises(DataError, match="data_batch_4"):
        load_dataset("cifar10", str(tmp_path))


def test_no_directory_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FEDGE_CIFAR10_DIR", raising=False)
    with pytest.raises(DataError, match="cifar10 needs a data directory"):
        load_dataset("cifar10")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ([1, 2, 3], "expected a pickled dict"),
        ({b"labels": [1]}, "b'data'"),
        ({b"data": np.zeros((2, 100), np.uint8), b"labels": [1, 2]}, "uint8 array"),
        ({b"data": np.zeros((2, 3072), np.float32), b"labels": [1, 2]}, "uint8 array"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [1]}, "2 images but 1 labels"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [1, 10]}, "labels must lie in 0..9"),
    ],
)
def test_malformed_batch_is_named(tmp_path: Path, content: object, message: str) -> None:
    write_cifar(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_2").write_bytes(pickle.dumps(content, protocol=2))
    with pytest.raises(DataError, match=message) as info:
        load_dataset("cifar10", str(tmp_path))
    assert "data_batch_2" in str(info.value)


def test_truncated_pickle_is_named(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "test_batch"
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(DataError, match="test_batch"):
        load_dataset("cifar10", str(tmp_path))
