"""Algorithms as plugins: named by path or entry point, checked against the contract when loaded, run by the same
runtime (the in-process driver), described in the welcome, and imported by a device only when its rule allows."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from fedge.algorithms import registry
from fedge.algorithms.loop import TrainSettings
from fedge.simulation.inprocess import global_arrays, make_fleet, run_round
from tests.algo_helpers import TINY_MLP, client_data

PLUGIN = "tests.plugin_algorithms:ServerStep"
DATA = client_data(TINY_MLP, 2, samples=24)
SGD = TrainSettings(epochs=1, batch_size=8, lr=0.05, optimizer="sgd")


def test_a_plugin_algorithm_runs_on_the_runtime_and_its_options_are_checked() -> None:
    full = make_fleet(PLUGIN, {"server_lr": 1.0}, TINY_MLP, clients=2, seed=3)
    plain = make_fleet("fedavg", {}, TINY_MLP, clients=2, seed=3)
    half = make_fleet(PLUGIN, {"server_lr": 0.5}, TINY_MLP, clients=2, seed=3)
    start = global_arrays(half)
    assert run_round(full, 1, DATA, SGD, seed=3) == {"server_lr": 1.0}
    run_round(plain, 1, DATA, SGD, seed=3)
    run_round(half, 1, DATA, SGD, seed=3)
    ours, theirs, halfway = global_arrays(full), global_arrays(plain), global_arrays(half)
    assert all(np.array_equal(ours[k], theirs[k]) for k in ours)  # eta = 1 is FedAvg bit for bit
    name = "fc1.weight"
    np.testing.assert_allclose(halfway[name], start[name] + 0.5 * (theirs[name] - start[name]), atol=1e-6)
    with pytest.raises(ValueError, match="server_lr must be in"):
        registry.make_config(PLUGIN, {"server_lr": 2.0})
    with pytest.raises(ValueError, match="unknown option"):
        registry.make_config(PLUGIN, {"server_rate": 0.5})


def test_a_plugin_is_checked_against_the_contract_when_loaded() -> None:
    with pytest.raises(ValueError, match=r"its Server lacks select, check_update, aggregate.*subclass "
                                         r"fedge.algorithms.contract.BaseServer"):
        registry.spec_of("tests.plugin_algorithms:Broken")
    with pytest.raises(ValueError, match="unknown algorithm 'nope'"):
        registry.spec_of("nope")
    with pytest.raises(ValueError, match="cannot import tests.no_such_module"):
        registry.spec_of("tests.no_such_module:Algo")


def test_the_session_describes_it_and_a_device_imports_it_only_when_allowed(tmp_path: Path) -> None:
    from fedge import codec
    from fedge.client.joining import Refused
    from fedge.coordinator.config import from_dict
    from fedge.coordinator.plan import plan_session
    from tests.test_byom_sessions import agent, welcome

    plan = plan_session(from_dict({"algorithm": {"name": PLUGIN}, "data": {"dataset": "fmnist-demo"},
                                   "fleet": {"local_agents": 2}}))
    assert plan.plugins["algorithm"].target == PLUGIN
    sys.modules.pop("tests.plugin_algorithms_unimported", None)
    base = welcome()
    unknown = codec.Welcome(**{**base.__dict__, "algorithm": "tests.plugin_algorithms_unimported:Algo"})
    with pytest.raises(Refused, match="not in agent.allow_plugins") as info:
        agent(tmp_path).join(unknown)
    assert info.value.code == "plugin-refused" and "tests.plugin_algorithms_unimported" not in sys.modules
    described = {**base.plugins, "algorithm": plan.plugins["algorithm"].as_dict()}
    allowed = codec.Welcome(**{**base.__dict__, "algorithm": PLUGIN, "plugins": described})
    from tests.test_byom_sessions import PLUGIN as MODEL_PLUGIN

    session = agent(tmp_path, allow_plugins=(MODEL_PLUGIN, PLUGIN)).join(allowed)
    assert type(session.client).__name__ == "Client" and session.welcome.algorithm == PLUGIN
