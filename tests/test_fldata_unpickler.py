"""The restricted unpickler refuses every global a CIFAR batch does not need, without running anything."""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from fedge.fldata import DataError, load_dataset
from fedge.fldata.cifar import restricted_loads


class RunsCommand:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (self.command,))


def call_global(module: str, name: str, arg: str) -> bytes:
    """A protocol 2 pickle that calls module.name(arg)."""
    text = arg.encode()
    return (b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"X" + struct.pack("<I", len(text)) + text
            + pickle.TUPLE1 + pickle.REDUCE + pickle.STOP)


def cifar_dir_with(tmp_path: Path, payload: bytes) -> Path:
    directory = tmp_path / "cifar-10-batches-py"
    directory.mkdir()
    good = pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [0]}, protocol=2)
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        (directory / name).write_bytes(good)
    (directory / "data_batch_3").write_bytes(payload)
    return directory


@pytest.mark.parametrize("protocol", [2, 4])
def test_os_system_is_refused_and_not_run(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "pwned"
    evil = {b"data": np.zeros((1, 3072), np.uint8), b"labels": [RunsCommand(f"touch {marker}")]}
    cifar_dir_with(tmp_path, pickle.dumps(evil, protocol=protocol))
    with pytest.raises(DataError, match=r"data_batch_3.*not allowed") as info:
        load_dataset("cifar10", str(tmp_path))
    assert "system" in str(info.value)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("module", "name"),
    [("os", "system"), ("posix", "system"), ("builtins", "eval"), ("builtins", "getattr"),
     ("subprocess", "call"), ("numpy", "load"), ("numpy", "frombuffer"), ("numpy.core.multiarray", "scalar"),
     ("numpy.testing", "assert_"), ("copyreg", "_reconstructor"), ("_codecs", "decode")],
)
def test_other_globals_are_refused(module: str, name: str) -> None:
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        restricted_loads(call_global(module, name, "x"))


def test_codecs_encode_only_to_latin1() -> None:
    good = (b"\x80\x02c_codecs\nencode\nX\x02\x00\x00\x00hiX\x06\x00\x00\x00latin1" + pickle.TUPLE2
            + pickle.REDUCE + pickle.STOP)
    assert restricted_loads(good) == b"hi"
    with pytest.raises(pickle.UnpicklingError, match="latin1"):
        restricted_loads(good.replace(b"latin1", b"zlib__"))


def test_array_reconstruction_only_builds_plain_arrays() -> None:
    payload = pickle.dumps(np.ma.masked_array([1, 2]), protocol=2)
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        restricted_loads(payload)


def test_object_arrays_are_refused() -> None:
    with pytest.raises(pickle.UnpicklingError, match="object dtypes"):
        restricted_loads(pickle.dumps(np.array([1, "a"], dtype=object), protocol=2))
