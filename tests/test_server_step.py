"""The server step ([server] lr, momentum) on the one aggregation path: the defaults leave the aggregate as it
is, bit for bit; otherwise the global model moves by lr times the velocity, which survives a checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from fedge.algorithms.base import ModelLayout, ServerContext
from fedge.algorithms.registry import make_server
from fedge.codec import TensorGroup
from fedge.coordinator.config import ConfigError, load_config
from fedge.protocol.payload import ClientUpdate, Payload
from fedge.protocol.server_half import Aggregation
from fedge.protocol.server_step import ServerStep


def server():  # type: ignore[no-untyped-def]
    layout = ModelLayout(names=("w",), prunable=("w",), batch_norm=(), layers={"w": ("w",)}, parameters=("w",))
    return make_server("fedavg", {"upload": "delta", "weighting": "uniform"}, {"w": np.zeros(3, np.float32)},
                       ServerContext(num_clients=4, layout=layout))


def round_of(half, number: int, change: list[float], step: ServerStep) -> np.ndarray:  # type: ignore[no-untyped-def]
    aggregation = Aggregation(half, number, step=step)
    aggregation.fold(ClientUpdate("a", 0, 1, Payload(groups={"delta": TensorGroup(
        dense={"w": np.asarray(change, np.float32)})})))
    aggregation.close()
    return np.array(half.global_model()["w"])


def test_the_default_step_is_the_aggregate_itself() -> None:
    plain, stepped = server(), server()
    assert np.array_equal(round_of(plain, 1, [0.1, 0.2, 0.3], ServerStep()),
                          round_of(stepped, 1, [0.1, 0.2, 0.3], ServerStep(1.0, 0.0)))


def test_lr_and_momentum_move_the_model_by_the_velocity_which_a_checkpoint_keeps() -> None:
    half, step = server(), ServerStep(lr=0.5, momentum=0.9)
    first = round_of(half, 1, [1.0, 0.0, -2.0], step)
    assert np.allclose(first, [0.5, 0.0, -1.0])
    resumed = ServerStep(lr=0.5, momentum=0.9)
    resumed.load_state_dict(step.state_dict())
    second = round_of(half, 2, [1.0, 0.0, -2.0], resumed)  # v = 0.9 * [1, 0, -2] + [1, 0, -2]
    assert np.allclose(second, first + 0.5 * 1.9 * np.array([1.0, 0.0, -2.0]))


def test_a_server_step_is_refused_where_there_is_no_global_model() -> None:
    with pytest.raises(ConfigError, match="server.lr and server.momentum move a global model"):
        load_config(None, ["algorithm.name=\"pfedla\"", "server.lr=0.5"])
    with pytest.raises(ConfigError, match="server.momentum in"):
        load_config(None, ["server.momentum=1.0"])
