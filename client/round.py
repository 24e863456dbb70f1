"""THE client-round function: one task in, one update out, on a joined session's model, data and device state.

``play_task`` is what a client does with a task, wherever it runs (an edge agent's training thread, a simulated
fleet's worker): the client half loaded from the committed device state (anything a round left uncommitted is
discarded first), ``on_receive``, the evaluations the task asks for, THE training loop with the session's seed for
this client and round (an asynchronous task: its base version + 1 and its attempt), the client half's update, its body encoded once, and the round's state written as pending.
``update_frame`` joins that body to the Update header. The meter is optional (a simulated fleet meters nothing);
so is the cancel check. No sockets, threads or clocks of its own beyond timing the training; no algorithm by name.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from fedge import codec
from fedge.algorithms.base import Arrays, Payload, model_arrays
from fedge.algorithms.loop import attempt_seed, round_seed, train_local
from fedge.algorithms.task import evaluate_task
from fedge.client.joining import JoinedSession, Tensors
from fedge.client.metering import mask_figures
from fedge.client.state import DeviceState
from fedge.meter import ParamSnapshot
from fedge.secagg.encoding import value_grid


class RoundMeter(Protocol):
    """What ``play_task`` tells a meter (``fedge.meter.AgentMeter`` is one)."""

    def phase(self, name: str) -> contextlib.AbstractContextManager[Any]: ...

    def add_training(self, *args: Any, **kwargs: Any) -> None: ...


@dataclass
class TaskResult:
    """A trained task: the update, its body encoded, the runtime's fields of the Update, and the model an
    inference uses (after training, or as received for an algorithm that says so)."""

    round: int
    update: Payload
    body: bytes
    fields: dict[str, Any]
    inference: Arrays


@contextlib.contextmanager
def _no_phase() -> Iterator[None]:
    yield


def play_task(session: JoinedSession, tensors: Tensors, state: DeviceState, task: codec.Task,
              meter: RoundMeter | None = None, cancelled: Callable[[], bool] | None = None,
              inference_meta: dict[str, Any] | None = None,
              spent: Callable[[int], bool] | None = None,
              received: Callable[[Payload, Any], None] | None = None) -> TaskResult:
    """Train one task and write its state as pending (``state.write_pending``); TrainingCancelled when
    ``cancelled`` says so before a step; fewer steps when the device's work budget (``spent``) says so;
    ``received`` sees the task's payload and the model after ``on_receive`` (the in-process driver's ``inspect``)."""

    def phase(name: str) -> contextlib.AbstractContextManager[Any]:
        return meter.phase(name) if meter is not None else _no_phase()

    client, model = session.client, session.model
    with phase("receive"):
        state.discard_unconfirmed(session.run_id, task.last_accepted_round)
        client.load_state_dict(state.committed(session.run_id))
        payload = Payload(groups=dict(task.groups), meta=dict(task.meta))
        client.on_receive(task.round, payload, model)
        client.on_bounds(task.round, dict(task.norm_bounds))
        client.on_value_grid(task.round, *value_grid(task.secagg))
        if received is not None:
            received(payload, model)
    inference = None if client.inference_after_training else model_arrays(model)
    fields: dict[str, Any] = {}
    if (task.personal_eval or task.evaluate) and tensors.test_labels.numel():
        metrics = evaluate_task(model, tensors.test_inputs, tensors.test_labels, session.task)
        if task.evaluate:  # the session has no test set of its own: the clients' evaluations stand in
            fields["evaluation"], fields["eval_samples"] = metrics, int(tensors.test_labels.shape[0])
        if task.personal_eval and metrics["accuracy"] is not None:
            fields["personal_accuracy"] = metrics["accuracy"]
    started = time.monotonic()
    seed = round_seed(session.welcome.seed, task.round, session.index) if task.base_version is None else \
        round_seed(attempt_seed(session.welcome.seed, task.attempt), task.base_version + 1, session.index)
    with phase("train"):
        snapshot = ParamSnapshot(model) if meter is not None else None
        stats = train_local(model, client, tensors.inputs, tensors.labels, session.train, seed,
                            cancelled=cancelled, task=session.task, spent=spent)
    train_s = time.monotonic() - started
    if meter is not None and snapshot is not None:
        t = session.train
        claim, densities = mask_figures(client, model)
        meter.add_training(model, tuple(tensors.inputs.shape[1:]), stats.batch_sizes, t.optimizer, t.momentum,
                           t.weight_decay, updated_elements=snapshot.changed(model), mask_claim=claim,
                           densities=densities)
    fields.update(num_samples=int(tensors.labels.shape[0]), steps=stats.steps, train_loss=float(stats.loss),
                  train_s=float(train_s))
    with phase("encode"):
        update = client.make_update(task.round, model, stats)
        fields["clip_scale"] = min(1.0, max(0.0, float(client.clip_scale())))
        body = codec.encode_body(update.groups, update.meta)
    if inference is None:
        inference = model_arrays(model)
    state.write_pending(session.run_id, task.round, client.state_dict(), inference, inference_meta)
    return TaskResult(task.round, update, body, fields, inference)


def update_frame(session: JoinedSession, sender: str, result: TaskResult, record: dict[str, Any] | None = None) -> bytes:
    """The Update packet of a trained task: the client half's groups and meta (the body encoded in
    ``play_task``) and the runtime's fields, the meter's record among them when there is one (in the header)."""
    fields = dict(result.fields)
    if record is not None:
        fields["record"] = record
    message = codec.Update(run_id=session.run_id, round=result.round, sender=sender, groups=dict(result.update.groups),
                           meta=dict(result.update.meta), **fields)
    return codec.encode(message, body=result.body)
