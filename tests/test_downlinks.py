"""A round's shared downlink is compressed once and joined to each client's own header; per-client payloads are
encoded for their client alone; every frame is the same bytes as encoding its Task whole."""

from __future__ import annotations

import numpy as np
import pytest

from fedge import codec
from fedge.algorithms import make_server
from fedge.algorithms.base import ModelLayout, ServerContext
from fedge.coordinator.downlinks import DownlinkBodies
from fedge.models import ModelSpec, build, state_to_arrays

SPEC = ModelSpec.from_dict({"name": "mlp", "input_shape": [1, 28, 28], "num_classes": 10, "pan": "off",
                            "pan_a": 0.1, "pan_t": 1.0, "options": {}})


def tasks(name: str, clients: int, round_number: int = 1, options: dict | None = None) -> list[codec.Task]:
    model = build(SPEC, seed=0)
    server = make_server(name, options or {}, state_to_arrays(model),
                         ServerContext(num_clients=clients, layout=ModelLayout.of(model), seed=0))
    out = []
    for index in range(clients):
        payload = server.downlink(round_number, index)
        out.append(codec.Task(run_id="r", round=round_number, sender="coordinator", groups=dict(payload.groups),
                              meta=dict(payload.meta), committed_round=round_number - 1,
                              last_accepted_round=index % 2, deadline_s=30.0))
    return out


@pytest.mark.parametrize("name", ["fedavg", "scaffold", "fedprox"])
def test_one_model_for_all_is_compressed_once(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = codec.encode_body
    monkeypatch.setattr(codec, "encode_body", lambda *a, **k: calls.append(1) or real(*a, **k))
    bodies = DownlinkBodies()
    round_tasks = tasks(name, 5)
    frames = [bodies.frame(task) for task in round_tasks]
    assert len(calls) == 1 and bodies.encoded == 1 and bodies.shared == 4
    assert frames == [real_encode(task) for task in round_tasks]  # the same bytes as encoding each whole
    decoded = codec.decode(frames[3])
    assert isinstance(decoded, codec.Task) and decoded.last_accepted_round == 1


def real_encode(task: codec.Task) -> bytes:
    return codec.encode(task)


def test_different_payloads_are_not_shared_and_a_new_round_starts_afresh() -> None:
    bodies = DownlinkBodies()
    first, second = tasks("fedavg", 2)
    other = codec.Task(run_id="r", round=1, sender="coordinator",
                       groups={"model": codec.TensorGroup(dense={k: v + 1 for k, v in first.groups["model"].dense.items()})},
                       meta={}, committed_round=0, last_accepted_round=0, deadline_s=30.0)
    frames = [bodies.frame(first), bodies.frame(other), bodies.frame(second)]
    assert bodies.encoded == 2 and bodies.shared == 1
    assert codec.decode(frames[1]).groups["model"].dense["fc1.bias"][0] == \
        np.float32(first.groups["model"].dense["fc1.bias"][0] + 1)
    later = tasks("fedavg", 1, round_number=2)[0]
    bodies.frame(later)
    assert bodies.key == ("round", 2) and bodies.encoded == 1 and bodies.shared == 0


def test_asynchronous_tasks_on_one_version_share_its_body_whatever_their_task_ids() -> None:
    import dataclasses

    bodies = DownlinkBodies()
    first, second = tasks("fedavg", 2)
    on_version = [dataclasses.replace(task, round=7 + i, base_version=3) for i, task in enumerate((first, second))]
    frames = [bodies.frame(task) for task in on_version]
    assert bodies.encoded == 1 and bodies.shared == 1
    assert [codec.decode(frame).round for frame in frames] == [7, 8]  # each keeps its own header
    bodies.frame(dataclasses.replace(first, round=9, base_version=4))
    assert bodies.key == ("version", 4) and bodies.encoded == 1 and bodies.shared == 0
