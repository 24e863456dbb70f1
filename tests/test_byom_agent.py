"""A device with its own data callable, in process: refresh every task, its own evaluation when the coordinator has
no test set, predictions with the committed plugin model; model.init; coordinator partition on float shards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedge import codec
from fedge.algorithms import make_server
from fedge.algorithms.base import ModelLayout, ServerContext
from fedge.client.data import DeviceData
from fedge.coordinator.config import ConfigError, from_dict
from fedge.edge_agent.agent import Agent
from fedge.edge_agent.config import AgentSettings
from fedge.fldata import ClientShard, normalize, write_shard
from fedge.models import ModelSpec, arrays_to_state, build, state_to_arrays
from fedge.runtime.plan import plan_session
from tests.byom import PLUGIN, ROOT, welcome
from tests.plugin_models import sensor_windows


def test_a_refreshing_callable_is_called_each_task_and_the_agent_evaluates_for_a_dataless_coordinator(
        tmp_path: Path) -> None:
    calls: list[int] = []

    def windows() -> dict[str, Any]:
        calls.append(1)
        return sensor_windows(count=60, seed=len(calls))

    settings = AgentSettings(coordinator="tcp://127.0.0.1:9", client_id="pi", data="in-process",
                             state_dir=str(tmp_path / "state"), allow_plugins=(PLUGIN,), data_refresh="every-task")
    agent = Agent(settings, data=DeviceData.from_function(windows, "in-process"))
    meta = welcome(normalization={"mean": [3.0] * 3, "std": [1.5] * 3})
    session = agent.join(meta)
    agent.session = session
    agent.begin_session(session)
    model = build(ModelSpec.from_dict(meta.model), seed=0)
    server = make_server("fedavg", {}, state_to_arrays(model),
                         ServerContext(num_clients=1, layout=ModelLayout.of(model)))
    frames = []
    for round_number in (1, 2):
        down = server.downlink(round_number, 0)
        task = codec.Task(run_id="r1", round=round_number, sender="coordinator", groups=dict(down.groups),
                          meta=dict(down.meta), last_accepted_round=round_number - 1, evaluate=True)
        agent.train_round(session, task, 0.0)
        assert agent.outcome is not None and agent.outcome.frame is not None, agent.outcome
        frames.append(codec.decode(agent.outcome.frame))
        agent.state.confirm("r1", round_number)
    assert len(calls) == 3  # at start, then before each of the two rounds
    for update in frames:
        assert isinstance(update, codec.Update)
        assert update.eval_samples == 10 and 0 <= update.evaluation["accuracy"] <= 1
        assert update.evaluation["mse"] is None and update.evaluation["f1_macro"] is not None
        assert update.record["round"] == update.round and update.meta == {}  # the runtime's fields are typed

    from fedge.edge_agent.predict import Predictor

    predictor = Predictor.open(settings.state_dir)
    samples = sensor_windows(count=12, seed=9)["test_x"]
    committed = build(ModelSpec.from_dict(predictor.state.model_meta["model"]))
    arrays_to_state(committed, predictor.state.model, strict=False)
    expected = committed.eval()(torch.from_numpy(normalize(samples, (3.0,) * 3, (1.5,) * 3))).detach().numpy()
    np.testing.assert_allclose(predictor.logits(samples), expected, atol=1e-4)
    assert predictor.task == "classification"


def test_model_init_starts_from_saved_weights_checked_against_the_layout(tmp_path: Path) -> None:
    from fedge.coordinator.rundir import save_arrays

    base = {"model": {"name": PLUGIN, "options": {"width": 8}}, "data": {"dataset": "tests.plugin_models:sensor_windows"},
            "fleet": {"local_agents": 2}}
    model = build(plan_session(from_dict(base)).spec, seed=7)
    saved = state_to_arrays(model)
    (tmp_path / "run").mkdir()
    save_arrays(tmp_path / "run" / "model.npz", saved, {"round": 3})
    plan = plan_session(from_dict({**base, "model": {**base["model"], "init": str(tmp_path / "run")}}))
    assert plan.initial is not None and all(np.array_equal(plan.initial[k], saved[k]) for k in saved)
    save_arrays(tmp_path / "other.npz", {**saved, "body.stem.weight": saved["body.stem.weight"][:1]}, {})
    with pytest.raises(ConfigError, match="body.stem.weight has shape"):
        plan_session(from_dict({**base, "model": {**base["model"], "init": str(tmp_path / "other.npz")}}))
    with pytest.raises(ConfigError, match="not a readable Fedge model file"):
        plan_session(from_dict({**base, "model": {**base["model"], "init": str(tmp_path / "missing.npz")}}))


def test_coordinator_partition_reads_float_shards_and_regression_targets(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``coordinator partition`` through its ``main`` in this process (the command as a process: tests/e2e.py's
    ``shards``)."""
    from fedge.runtime.cli import main

    rng = np.random.default_rng(0)
    x = rng.standard_normal((400, 3, 16)).astype(np.float32)
    y = np.stack([x[:, 0].mean(1), x[:, 1].mean(1)], 1).astype(np.float32)
    source = tmp_path / "all"
    source.mkdir()
    write_shard(source / "whole.npz", ClientShard(index=0, train_x=x[:300], train_y=y[:300], test_x=x[300:],
                                                 test_y=y[300:], num_classes=2, mean=(0.0,) * 3, std=(1.0,) * 3,
                                                 dataset="sensor", partition="none", seed=0))
    code = main(["partition", "--dataset", "npz", "--data-dir", str(source), "--partition", "dirichlet",
                 "--clients", "4", "--json", "--out", str(tmp_path / "shards")])
    out = capsys.readouterr()
    assert code == 0, out.err
    summary = json.loads(out.out)
    assert sum(c["train_size"] for c in summary["clients"]) == 300
    from fedge.fldata import read_shard

    shard = read_shard(tmp_path / "shards" / "client-000.npz")
    assert shard.train_y.dtype == np.float32 and shard.train_y.shape[1] == 2 and shard.has_targets


def test_an_agent_that_declines_frees_its_index_unless_it_trained() -> None:
    import re

    from fedge.protocol.registry import AgentRegistry

    registry = AgentRegistry(capacity=2, liveness_s=5.0)
    assert registry.index_of("refuses") == 0 and registry.index_of("pi-1") == 1 and registry.index_of("pi-2") is None
    assert registry.release("refuses") and registry.index_of("pi-2") == 0
    registry.get("pi-1").last_accepted_round = 3  # type: ignore[union-attr]
    assert not registry.release("pi-1") and registry.index_of("pi-1") == 1
    names = set(re.findall(r"Refused\(words\.([A-Z_]+)", (ROOT / "client" / "joining.py").read_text()))
    codes = {getattr(codec.vocabulary, name) for name in names}
    assert len(codes) >= 6 and codes <= codec.vocabulary.JOIN_REFUSALS, codes - codec.vocabulary.JOIN_REFUSALS


def test_the_watchdog_follows_training_steps_while_a_round_trains(tmp_path: Path) -> None:
    import threading

    settings = AgentSettings(coordinator="tcp://127.0.0.1:9", client_id="pi", data="in-process",
                             state_dir=str(tmp_path / "state"))
    agent = Agent(settings, data=DeviceData.from_function(lambda: sensor_windows(count=30), "in-process"))
    idle = agent.watchdog_count()
    agent.progress += 5
    assert agent.watchdog_count() != idle  # idle: the main loop's turns count
    hung = threading.Event()
    agent.worker = threading.Thread(target=hung.wait, daemon=True)
    agent.worker.start()
    try:
        training = agent.watchdog_count()
        agent.progress += 100  # the main loop keeps turning while the step hangs: no progress for the watchdog
        assert agent.watchdog_count() == training
        assert agent.step() is False and agent.watchdog_count() == training + 1
    finally:
        hung.set()
        agent.worker.join(5)


def test_a_cancel_stops_the_training_thread_at_its_next_step(tmp_path: Path) -> None:
    import time

    from fedge.protocol.events import CancelTraining

    settings = AgentSettings(coordinator="tcp://127.0.0.1:9", client_id="pi", data="in-process",
                             state_dir=str(tmp_path / "state"), allow_plugins=(PLUGIN,))
    agent = Agent(settings, data=DeviceData.from_function(lambda: sensor_windows(count=600, seed=1), "in-process"))
    meta = welcome(normalization={"mean": [3.0] * 3, "std": [1.5] * 3})
    slow = codec.Welcome(**{**meta.__dict__, "train": {**meta.train, "epochs": 10_000, "batch_size": 4}})
    session = agent.join(slow)
    agent.session = session
    agent.begin_session(session)
    agent.protocol.joined(session.run_id, session.index, 1.0, 5.0)
    model = build(ModelSpec.from_dict(slow.model), seed=0)
    down = make_server("fedavg", {}, state_to_arrays(model), ServerContext(1, ModelLayout.of(model))).downlink(1, 0)
    task = codec.Task(run_id="r1", round=1, sender="coordinator", groups=dict(down.groups))
    (train,) = [a for a in agent.protocol.receive(codec.encode(task), 0.0) if type(a).__name__ == "Train"]
    agent.start_task(train.task, 0.0)  # type: ignore[attr-defined]
    while agent.train_steps < 3:
        time.sleep(0.01)
    agent.act(None, [CancelTraining(1)])  # type: ignore[arg-type]
    assert agent.worker is not None
    agent.worker.join(timeout=30)
    assert not agent.worker.is_alive() and agent.outcome is None and agent.train_steps < 10_000
    assert not agent.state.pending_path.exists()  # nothing of the cancelled round was kept


class RecordingTransport:
    """What the driver hands the socket, kept in order (a test double for the DEALER socket only)."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.handshakes, self.curve = 0, False

    def send(self, frame: bytes) -> bool:
        self.frames.append(frame)
        return True


def test_a_trained_update_waiting_for_its_grant_outlives_the_ticks_after_training(tmp_path: Path) -> None:
    """The driver's clock drops a task whose training thread ended with no outcome; an update that finished and waits
    (for a paced upload's grant, or a secure round's delivery of shares) has no thread either and must be kept
    (CI saw a secure round wait forever for the update an agent had dropped this way)."""
    from fedge.protocol.agent import AgentState

    settings = AgentSettings(coordinator="tcp://127.0.0.1:9", client_id="pi", data="in-process",
                             state_dir=str(tmp_path / "state"), allow_plugins=(PLUGIN,))
    agent = Agent(settings, data=DeviceData.from_function(lambda: sensor_windows(count=60, seed=1), "in-process"))
    session = agent.join(welcome(normalization={"mean": [3.0] * 3, "std": [1.5] * 3}))
    agent.session = session
    agent.begin_session(session)
    agent.protocol.joined(session.run_id, session.index, 1.0, 5.0)
    model = build(ModelSpec.from_dict(session.welcome.model), seed=0)
    down = make_server("fedavg", {}, state_to_arrays(model), ServerContext(1, ModelLayout.of(model))).downlink(1, 0)
    task = codec.Task(run_id="r1", round=1, sender="coordinator", groups=dict(down.groups), paced=True)
    transport = RecordingTransport()
    agent.act(transport, agent.protocol.receive(codec.encode(task), 0.0))  # type: ignore[arg-type]
    assert agent.worker is not None
    agent.worker.join(timeout=60)
    for _ in range(3):  # the tick that sees the outcome, then ticks with no training thread and no outcome
        agent.tick(transport)  # type: ignore[arg-type]
    assert agent.protocol.state is AgentState.AWAITING_GRANT and agent.protocol.holding == 1
    transport.frames.clear()
    agent.handle(transport, codec.encode(codec.Grant(run_id="r1", round=1, sender="coordinator")))  # type: ignore[arg-type]
    (sent,) = transport.frames
    assert isinstance(codec.decode(sent), codec.Update) and agent.protocol.holding is None
