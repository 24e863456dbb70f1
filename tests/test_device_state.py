"""The device's two-phase state (client.state): a model equal to the state's arrays is stored once, and a round reads
its committed state from memory only while committed.npz is the file this process promoted."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from fedge.client.state import DeviceState

RUN = "run-1"


def state_arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"ef/public/fc.weight": rng.standard_normal((4, 3)).astype(np.float32),
            "ef/public/fc.bias": rng.standard_normal(4).astype(np.float32),
            "ef/residual": rng.standard_normal(16).astype(np.float32)}


def test_a_model_equal_to_the_states_arrays_is_stored_once_and_read_back_whole(tmp_path: Path) -> None:
    arrays = state_arrays(0)
    arrays["ef/public/fc.bias"][1] = 0.0
    model = {"fc.weight": arrays["ef/public/fc.weight"].copy(),  # equal: stored once
             "fc.bias": arrays["ef/public/fc.bias"].copy()}
    model["fc.bias"][1] = -0.0  # equal values, other bits: stored as it is
    state = DeviceState(tmp_path / "state")
    state.write_pending(RUN, 1, arrays, model, {"spec": "x"})
    assert state.confirm(RUN, 1)
    with np.load(state.committed_path) as stored:
        assert "n/fc.weight" not in stored.files and "n/fc.bias" in stored.files
    committed = DeviceState(tmp_path / "state").committed_model()  # a fresh reader: from the file
    assert committed is not None and set(committed.model) == set(model)
    for name, value in model.items():
        assert committed.model[name].tobytes() == value.tobytes()
    assert np.signbit(committed.model["fc.bias"][1])


def test_the_committed_state_comes_from_memory_only_while_the_file_is_the_one_promoted(tmp_path: Path) -> None:
    state = DeviceState(tmp_path / "state")
    first, second = state_arrays(1), state_arrays(2)
    state.write_pending(RUN, 1, first)
    first["ef/residual"][:] = 7.0  # the client goes on changing its own arrays: what was written stays
    assert state.confirm(RUN, 1)
    read = state.committed(RUN)
    assert state.held is not None  # served from memory
    assert np.array_equal(read["ef/residual"], state_arrays(1)["ef/residual"])
    read["ef/residual"][:] = 9.0  # a round that changes what it read, then is cancelled, changes nothing held
    assert np.array_equal(state.committed(RUN)["ef/residual"], state_arrays(1)["ef/residual"])
    assert state.committed("another-run") == {}

    other = DeviceState(tmp_path / "other")  # another state file put in its place: read from the file
    other.write_pending(RUN, 1, second)
    other.confirm(RUN, 1)
    shutil.copyfile(other.committed_path, state.committed_path)
    assert np.array_equal(state.committed(RUN)["ef/residual"], second["ef/residual"])
    state.committed_path.unlink()  # the state lost: nothing
    assert state.committed(RUN) == {}

    fresh = DeviceState(tmp_path / "fresh")  # a pending state dropped, not promoted: nothing held from it
    fresh.write_pending(RUN, 3, first)
    fresh.discard_unconfirmed(RUN, 2)
    assert fresh.written is None and fresh.held is None and fresh.committed(RUN) == {}


def test_an_older_reader_of_a_file_that_shares_arrays_finds_no_model_rather_than_part_of_one(tmp_path: Path) -> None:
    """An agent from before model_aliases read the model as every ``m/`` array: here there is none."""
    arrays = state_arrays(3)
    state = DeviceState(tmp_path / "state")
    state.write_pending(RUN, 1, arrays, {"fc.weight": arrays["ef/public/fc.weight"].copy(),
                                         "fc.extra": np.ones(3, np.float32)})
    assert state.confirm(RUN, 1)
    with np.load(state.committed_path) as stored:
        assert not [name for name in stored.files if name.startswith("m/")]
    committed = state.committed_model()
    assert committed is not None and sorted(committed.model) == ["fc.extra", "fc.weight"]
