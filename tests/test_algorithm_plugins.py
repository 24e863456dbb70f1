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
    with pytest.raises(ValueError, match=r"its Server lacks select, check_update, fold, close_round.*subclass "
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
    from fedge.runtime.plan import plan_session
    from tests.byom import PLUGIN as MODEL_PLUGIN
    from tests.byom import agent, welcome

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
    session = agent(tmp_path, allow_plugins=(MODEL_PLUGIN, PLUGIN)).join(allowed)
    assert type(session.client).__name__ == "Client" and session.welcome.algorithm == PLUGIN


def test_a_half_mixing_streaming_and_batch_hooks_is_refused_at_load_in_one_line() -> None:
    from fedge.algorithms.contract import HeldServer, aggregation_refusal
    from fedge.algorithms.fedavg import Server as FedAvgServer

    with pytest.raises(ValueError, match=r"^algorithm plugin 'tests.plugin_algorithms:Mixed': "
                                         r"tests.plugin_algorithms.OldStepServer.aggregate is not a hook"):
        registry.spec_of("tests.plugin_algorithms:Mixed")

    class Batch(HeldServer):  # a batch half that also streams: its fold would never see the held updates
        def aggregate_held(self, round_number, updates):  # type: ignore[no-untyped-def]
            return {}

        def fold(self, round_number, update):  # type: ignore[no-untyped-def]
            return None

    class Streaming(FedAvgServer):  # a streaming half with the batch hook, which no streaming path calls
        def aggregate_held(self, round_number, updates):  # type: ignore[no-untyped-def]
            return {}

    assert "subclasses the batch base HeldServer but overrides fold" in aggregation_refusal(Batch)
    assert "aggregate_held is the batch hook" in aggregation_refusal(Streaming)
    for message in (aggregation_refusal(Batch), aggregation_refusal(Streaming)):
        assert "\n" not in message and "test_a_half_mixing" in message  # one line, naming the class
    for name in registry.REGISTRY:  # every built-in half is on the one path
        assert aggregation_refusal(registry.spec_of(name).module.Server) == "", name


def test_the_server_step_acts_in_a_session_as_under_the_in_process_driver(tmp_path: Path) -> None:
    """Two devices, two rounds of the session `coordinator start` plays (``runtime.launch.play``, here on the
    inline simulated fleet: every task trained by the client-round function an agent runs; that fleet equals agent
    processes bit for bit, tests/test_simulated_fleet.py): its model.npz is the in-process driver's model bit for
    bit (so a hook the driver calls is one production calls), and a server step of 0.5 is not FedAvg."""
    import torch

    from fedge.client.data import DeviceData
    from fedge.coordinator.config import load_config
    from fedge.fldata import normalize
    from fedge.runtime.plan import plan_session
    from fedge.simulation.worker import one_torch_thread
    from tests.simfleet import records, run_here

    sets = ["model.name=mlp", "fleet.local_agents=2", "data.train_limit=100", "run.rounds=2", "run.seed=4",
            "run.export_onnx=false", f"algorithm.name={PLUGIN}", "algorithm.server_lr=0.5", "fleet.mode=simulated",
            "fleet.backend=inline"]
    run_dir = tmp_path / "run"
    run_here(sets, run_dir)
    plan = plan_session(load_config(None, sets))
    data = []
    for shard in sorted((run_dir / "data").glob("client-*.npz")):
        device = DeviceData.open(str(shard))
        mean, std = plan.mean or device.mean, plan.std or device.std
        data.append((torch.from_numpy(normalize(device.train_x[:100], mean, std)),
                     torch.from_numpy(np.ascontiguousarray(device.train_y[:100]))))
    train = plan.config.train
    settings = TrainSettings(epochs=train.epochs, batch_size=train.batch_size, lr=train.lr, optimizer=train.optimizer)
    stepped = make_fleet(PLUGIN, {"server_lr": 0.5}, plan.spec, clients=2, seed=4)
    plain = make_fleet("fedavg", {}, plan.spec, clients=2, seed=4)
    with one_torch_thread():  # as an agent trains (thread counts change bits)
        for number in (1, 2):
            run_round(stepped, number, data, settings, seed=4)
            run_round(plain, number, data, settings, seed=4)
    served = {k[2:]: v for k, v in records(run_dir)["model"].items() if k.startswith("a/")}
    here, fedavg_model = global_arrays(stepped), global_arrays(plain)
    assert served.keys() == here.keys()
    assert all(np.array_equal(served[k], here[k]) for k in here), "the session and the driver differ"
    assert not all(np.array_equal(served[k], fedavg_model[k]) for k in here), "the server step did nothing"
