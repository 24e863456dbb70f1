"""A device's work budget: training ends early, normally, with the update of the steps taken (not a cancel);
the agent's settings refuse a bad budget in one line; the Ansible role writes the budget of a device class."""

from __future__ import annotations

import pytest
import torch

from fedge.algorithms.base import TrainSettings
from fedge.algorithms.contract import BaseClient
from fedge.algorithms.loop import train_local
from fedge.edge_agent.config import AgentSettings
from fedge.models import build
from tests.algo_helpers import TINY_MLP, client_data


def trained(spent: object, epochs: int = 2) -> tuple[int, torch.nn.Module]:
    model = build(TINY_MLP, seed=0)
    inputs, labels = client_data(TINY_MLP, 1, samples=48)[0]
    settings = TrainSettings(epochs=epochs, batch_size=8, lr=0.01, optimizer="sgd")
    stats = train_local(model, BaseClient(), inputs, labels, settings, seed=1, spent=spent)  # type: ignore[arg-type]
    return stats.steps, model


def test_a_step_budget_ends_training_after_that_many_steps_across_epochs() -> None:
    assert trained(None)[0] == 12  # 2 epochs of 6 batches
    steps, partial = trained(lambda done: done >= 8)
    assert steps == 8
    assert trained(lambda done: done >= 1)[0] == 1  # at least one step, always
    _, full = trained(None)
    assert any(not torch.equal(a, b) for a, b in zip(partial.state_dict().values(), full.state_dict().values(),
                                                     strict=True))


def test_the_same_budget_gives_the_same_model() -> None:
    a, b = trained(lambda done: done >= 5)[1], trained(lambda done: done >= 5)[1]
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


@pytest.mark.parametrize(("field", "value", "message"), [
    ("max_steps", -1, "agent.max_steps must be an integer >= 0"),
    ("max_steps", 2.5, "agent.max_steps must be an integer >= 0"),
    ("max_seconds", -3.0, "agent.max_seconds must be a number >= 0"),
    ("step_delay_s", 100.0, "agent.step_delay_s must be a number of seconds in [0, 60]"),
])
def test_a_bad_budget_is_refused_in_one_line(field: str, value: object, message: str) -> None:
    settings = AgentSettings(coordinator="tcp://127.0.0.1:5555", client_id="pi-01", data="x.npz",
                             **{field: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        settings.validate()
