"""ef's sub-protocol is one typed structure with a schema of its own: every field present, no sentinel versions, and
anything else (another schema, a missing or extra field, a wrong type, a chain that does not end at its keyframe)
refused in one line; checkpoints and device states written before it are refused in one line too."""

from __future__ import annotations

import numpy as np
import pytest

from fedge.algorithms import ef, fedprox
from fedge.algorithms.base import ModelLayout, ServerContext
from fedge.algorithms.ef_meta import EfTask, EfUpdate, Source
from fedge.algorithms.keyframes import Replica
from fedge.models import build, state_to_arrays
from tests.algo_helpers import TINY_MLP

TASK = EfTask(version=7, crc=11, keyframe=5, keyframe_crc=13, source=Source.CHAIN, start=2, chain=(4, 5),
              catchup=True, start_crc=17)


def test_the_structures_round_trip_and_carry_a_schema() -> None:
    assert EfTask.from_meta(TASK.to_meta()) == TASK
    assert TASK.to_meta()["ef"][0] == 1
    assert EfUpdate.from_meta(EfUpdate(base=7, keyframe=5).to_meta()) == EfUpdate(7, 5)


@pytest.mark.parametrize(("meta", "reason"), [
    ({}, "meta.ef must be ef's structure"),
    ({"ef_to": 7, "ef_crc": 11}, "meta.ef must be ef's structure"),
    ({"ef": [2, *TASK.to_meta()["ef"][1:]]}, "is of schema 2"),
    ({"ef": TASK.to_meta()["ef"][:-1]}, "has 8 fields; schema 1 has 9"),
    ({"ef": [1, -1, 11, 5, 13, "chain", 2, [4, 5], True, 17]}, "meta.ef.version must be a version"),
    ({"ef": [1, 7, 2**40, 5, 13, "chain", 2, [4, 5], True, 17]}, "meta.ef.crc must be a CRC-32"),
    ({"ef": [1, 7, 11, 5, 13, "replica", 2, [4, 5], True, 17]}, "meta.ef.source must be one of"),
    ({"ef": [1, 7, 11, 5, 13, "chain", 2, [4], True, 17]}, "does not end at keyframe 5"),
    ({"ef": [1, 7, 11, 5, 13, "chain", 2, [4, 5], False, 17]}, "do not fit"),
    ({"ef": [1, 5, 11, 5, 13, "dense", 2, [], False, 17]}, "a dense keyframe carries no chain"),
])
def test_anything_else_is_refused_in_one_line(meta: dict[str, object], reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as info:
        EfTask.from_meta(meta)
    assert "\n" not in str(info.value)


def test_checkpoints_and_device_states_written_before_are_refused_in_one_line() -> None:
    model = build(TINY_MLP, seed=1)
    config = ef.make_config(fedprox, {})
    server = ef.Server(config, state_to_arrays(model), ServerContext(2, ModelLayout.of(model)), fedprox)
    arrays, meta = server.state_dict()
    older = {k: v for k, v in meta.items() if k != "schema"}
    with pytest.raises(ValueError, match=r"^this ef checkpoint is of schema 1, this Fedge reads schema 2"):
        server.load_state_dict(arrays, older)
    server.load_state_dict(arrays, meta)  # today's own is read back
    replica = Replica("f16")
    with pytest.raises(ValueError, match=r"^this device's ef state is of schema 1"):
        replica.load_state_dict({"ef/version": np.array(3), "ef/public/fc1.bias": np.zeros(2, np.float32)})
    replica.load_state_dict({})
    assert replica.version is None  # a new device holds no replica, and says so without a sentinel
