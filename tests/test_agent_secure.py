"""The agent's side of a securely aggregated round (``protocol.agent`` with ``protocol.secure_device``), against the
coordinator's (``protocol.secure_round``), every message a real packet: keys go out with the training, an update
finished before its shares came waits for them, the masked Update carries nothing computed from the device's data or
its change, the unmask request is
answered after the update, and the coordinator's mean is exactly the survivors' quantised mean change; a secure
task the agent cannot mask, or a stage it refuses, fails the round and sends nothing in the clear."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fedge import codec
from fedge.protocol.agent import AgentProtocol, AgentState, DeviceFacts
from fedge.protocol.events import Masked, Send, SendFrame, Train
from fedge.protocol.secure_device import masked_words
from fedge.protocol.secure_round import SecureRound, peers_by_id
from fedge.secagg import field
from fedge.secagg.aggregator import RoundStage
from fedge.secagg.encoding import grid_for, rounding_rng, setup_of, task_settings

FACTS = DeviceFacts(fedge_version="0", torch_version="none", dataset_size=10)
MODEL = {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), "b": np.zeros(3, np.float32)}
SIZES = [12, 3]
SEED = 11


def agent(name: str, index: int) -> AgentProtocol:
    protocol = AgentProtocol(name, 3.0, facts=FACTS)
    protocol.joined("r1", index, 1.0, 60.0, seed=SEED)
    return protocol


def secure_task(**changes: Any) -> codec.Task:
    settings = task_settings(grid_for(16, 0.5, SIZES, 4), 0.6, 50, 2, 0)
    return codec.Task("r1", 3, "coordinator", groups={"model": codec.TensorGroup(dense=MODEL)}, secagg=settings,
                      **changes)


def trained(name: str, change: np.ndarray, evaluation: dict[str, Any] | None = None) -> bytes:
    """The plaintext update a FedAvg device's training produces: the trained model."""
    model = {"w": MODEL["w"] + change[:12].reshape(3, 4).astype(np.float32), "b": MODEL["b"] + change[12:].astype(
        np.float32)}
    return codec.encode(codec.Update("r1", 3, name, groups={"model": codec.TensorGroup(dense=model)}, num_samples=50,
                                     evaluation=evaluation or {}, personal_accuracy=0.8, train_loss=0.7,
                                     clip_scale=0.25, steps=4, record={"params_updated": 15, "flops_opt_updated": 780, "flops_train": 99}))


def sends(actions: list[Any]) -> list[codec.Message]:
    return [a.message for a in actions if isinstance(a, Send)]


def test_a_round_of_four_agents_gives_the_coordinator_their_quantised_mean_change() -> None:
    names = [f"a{i}" for i in range(4)]
    agents = {name: agent(name, i) for i, name in enumerate(names)}
    task = codec.encode(secure_task())
    coordinator = SecureRound("r1", 3, 0, setup_of("r1", 3, secure_task().secagg or {}, sum(SIZES)), names,
                              peers_by_id({n: n.encode() for n in names}), 10.0, now=0.0)
    outbox: list[Any] = []
    for name in names:
        actions = agents[name].receive(task, 0.0)
        assert [type(a).__name__ for a in actions if not isinstance(a, Send)] == ["Train"]
        (keys,) = sends(actions)
        outbox += coordinator.receive(name, codec.decode(codec.encode(keys)), 0.0)
    rng = np.random.default_rng(0)
    changes = {name: rng.normal(0, 0.01, sum(SIZES)) for name in names}
    # a0 finishes before its shares come: its masked update waits for them
    assert agents["a0"].finished(3, trained("a0", changes["a0"], {"accuracy": 0.9})) == []
    assert agents["a0"].state is AgentState.AWAITING_SHARES and agents["a0"].holding == 3
    agents["a0"].abandoned()  # the driver's clock: no training thread and no outcome, yet the update is kept
    assert agents["a0"].state is AgentState.AWAITING_SHARES
    updates: dict[str, bytes] = {}
    while outbox:  # roster, then deliveries
        send = outbox.pop(0)
        name = send.peer.decode()
        actions = agents[name].receive(codec.encode(send.message), 0.1)
        updates.update((name, a.frame) for a in actions if isinstance(a, SendFrame))
        assert [a for a in actions if isinstance(a, (Masked, SendFrame))][:1] in ([], [Masked("r1", 3)])
        for reply in sends(actions):
            outbox += coordinator.receive(name, codec.decode(codec.encode(reply)), 0.1)
    assert set(updates) == {"a0"} and agents["a0"].state is AgentState.IDLE
    for name in names[1:3]:  # a3 never finishes: it is dropped
        finished = agents[name].finished(3, trained(name, changes[name]))
        assert [type(a) for a in finished] == [Masked, SendFrame]  # remembered durably before it goes out
        updates[name] = finished[1].frame  # type: ignore[union-attr]
    for name, frame in updates.items():
        update = codec.decode(frame)
        assert isinstance(update, codec.Update) and set(update.groups) == {"secagg"}
        # nothing computed from its data or its change (the clip scale would give its norm); its work is kept
        assert (update.evaluation, update.personal_accuracy, update.train_loss, update.clip_scale) == ({}, None, 0.0, 1.0)
        assert (update.num_samples, update.steps) == (50, 4)
        assert update.record == {"params_updated": None, "flops_opt_updated": None, "flops_train": 99}  # its work,
        # not what it moved
        words, why = masked_words(update.groups, sum(SIZES), 16)
        assert words is not None and coordinator.masked(name, words) == "", why
    for send in coordinator.close_inputs(0.2):
        name = send.peer.decode()
        for reply in sends(agents[name].receive(codec.encode(send.message), 0.2)):
            coordinator.receive(name, codec.decode(codec.encode(reply)), 0.2)
    total = coordinator.total()
    assert coordinator.stage is RoundStage.SUMMED and total is not None
    grid = grid_for(16, 0.5, SIZES, 4)
    quantised = sum(field.signed(grid.encode(changes[name], rounding_rng(SEED, 3, i, 0)), 16).astype(np.int64)
                    for i, name in enumerate(names[:3]))
    step = grid.clip_per_coordinate() / grid.levels
    assert np.array_equal(np.round(grid.mean(total, 3) * 3 / step).astype(np.int64), quantised)
    assert agents["a3"].secure is not None  # still training: its unmask request never came
    assert all(agents[name].secure is None for name in names[:3])  # answered once
    # the restart rule: the round again (a coordinator that restarted, with fresh keys) is refused by a device that
    # masked an input of it, and nothing is trained or sent but the failure
    retry = dataclasses.replace(secure_task(), secagg={**(secure_task().secagg or {}), "attempt": 1})
    again = agents["a1"].receive(codec.encode(retry), 1.0)
    assert [type(a).__name__ for a in again] == ["Noted", "Send"]
    assert "masked an input of round 3 already" in sends(again)[0].reason  # type: ignore[attr-defined]


def test_a_secure_task_it_cannot_mask_fails_the_round_and_nothing_is_trained() -> None:
    for task in (codec.Task("r1", 3, "coordinator", secagg=secure_task().secagg),  # no model to measure from
                 secure_task(paced=True)):
        protocol = agent("a0", 0)
        actions = protocol.receive(codec.encode(task), 0.0)
        assert not any(isinstance(a, Train) for a in actions) and protocol.holding is None
        (error,) = sends(actions)
        assert isinstance(error, codec.ErrorMessage) and error.code == "round-failed"


def test_a_refused_stage_drops_the_round_and_its_update_is_never_sent() -> None:
    protocol = agent("a0", 0)
    protocol.receive(codec.encode(secure_task()), 0.0)
    roster = codec.SecAggRoster("r1", 3, "coordinator", attempt=0, keys=())  # lacks this device's own keys
    actions = protocol.receive(codec.encode(roster), 0.1)
    (error,) = sends(actions)
    assert isinstance(error, codec.ErrorMessage) and error.code == "round-failed" and "own keys" in error.reason
    assert protocol.holding is None and protocol.secure is None
    assert protocol.finished(3, trained("a0", np.zeros(sum(SIZES)))) [0].text.endswith("nothing is sent")  # type: ignore[union-attr]
