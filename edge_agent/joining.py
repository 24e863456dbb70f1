"""Joining a session: the welcome checked against this device's rules and data, and the session built from it.

``join_session`` refuses (``Refused``: a code and a one-line reason) a welcome that names a plugin this device does
not allow (checked from package metadata before anything is imported, ``fedge.plugins.check_allowed``) or whose
distribution or version differs from the coordinator's, data that does not fit the model or the loss (one batch is
passed through both), or a session that carries no normalisation for data that has none. Otherwise it builds the
model, the task and the algorithm's client half, and the device's data as normalised tensors (``data_tensors``).
No sockets, no threads, no files. Must not know any algorithm by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedge.algorithms import make_client
from fedge.algorithms.loop import TrainSettings, task_of
from fedge.algorithms.task import BUILTIN_LOSSES, Task
from fedge.edge_agent.config import AgentSettings
from fedge.edge_agent.data import DeviceData
from fedge.fldata import DataError, normalize
from fedge.models import MODELS, ModelSpec, build, definition_hash
from fedge.plugins import PluginError, PluginRef, check_allowed, describe, version_mismatch


@dataclass
class Session:
    """What the welcome told this agent, and what it built from it."""

    run_id: str
    index: int
    meta: dict[str, Any]
    model: torch.nn.Module
    client: Any
    train: TrainSettings
    task: Task
    mean: tuple[float, ...]
    std: tuple[float, ...]
    heartbeat_s: float
    liveness_s: float


@dataclass
class Tensors:
    """This device's data for the session: normalised inputs and labels, training and test."""

    inputs: torch.Tensor
    labels: torch.Tensor
    test_inputs: torch.Tensor
    test_labels: torch.Tensor


class Refused(Exception):
    """The welcome asks for something this device will not or cannot do: (code, one-line reason)."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code



def check_plugins(settings: AgentSettings, meta: dict[str, Any], spec: ModelSpec, loss: str) -> None:
    """Every plugin the welcome names must pass this device's rule before anything is imported, and match the
    coordinator's distribution and version unless the device allows a mismatch."""
    described = meta.get("plugins") or {}
    named = [(kind, name) for kind, name in (("model", spec.name), ("loss", loss))
             if name not in (MODELS if kind == "model" else BUILTIN_LOSSES)]
    for kind, name in named:
        try:
            check_allowed(kind, name, settings.allow_plugins)
            here = describe(kind, name)
        except PluginError as exc:
            raise Refused("plugin-refused", str(exc)) from None
        if settings.allow_plugin_mismatch:
            continue
        if kind not in described:
            raise Refused("plugin-mismatch", f"the welcome does not describe the {kind} plugin {name!r}")
        problem = version_mismatch(PluginRef.from_dict(described[kind]), here)
        if problem:
            raise Refused("plugin-mismatch", problem)

def join_session(settings: AgentSettings, data: DeviceData, device: torch.device,
             meta: dict[str, Any]) -> tuple[Session, Tensors]:
    """The session the welcome describes, built after every check; Refused naming what does not fit."""
    spec = ModelSpec.from_dict(meta["model"])
    train = TrainSettings(**meta["train"])
    check_plugins(settings, meta, spec, train.loss)
    if data.input_shape != spec.input_shape or data.num_outputs != spec.num_classes:
        kind = "targets" if data.has_targets else "classes"
        raise Refused("data-mismatch", f"this device's data is {data.input_shape} with {data.num_outputs} "
                      f"{kind}; the session's model wants {spec.input_shape} with {spec.num_classes} outputs")
    normalization = meta.get("normalization") or {}
    partition = data.partition_stats
    mean = tuple(normalization.get("mean") or (data.mean if partition else ()))
    std = tuple(normalization.get("std") or (data.std if partition else ()))
    if not mean:
        raise Refused("no-normalization", "this device's data comes from a callable and the session carries "
                      "no normalisation: set data.mean and data.std on the coordinator")
    try:
        if definition_hash(spec) != meta["model_hash"]:
            raise Refused("model-mismatch", "this agent builds the model differently from the coordinator "
                          "(different Fedge, torch or plugin versions?)")
        model = build(spec, seed=int(meta["seed"])).to(device)
        task = task_of(train, torch.from_numpy(data.train_y[:1]))
    except (PluginError, ValueError) as exc:
        raise Refused("model-failed", f"cannot build the session's model or loss here: {exc}") from None
    algorithm = dict(meta["algorithm"])
    name = algorithm.pop("name")
    client = make_client(name, algorithm, int(meta["client_index"]))
    session = Session(run_id=meta["run_id"], index=int(meta["client_index"]), meta=meta, model=model,
                      client=client, train=train, task=task, mean=tuple(float(v) for v in mean),
                      std=tuple(float(v) for v in std), heartbeat_s=float(meta["heartbeat_s"]),
                      liveness_s=float(meta["liveness_s"]))
    tensors = data_tensors(session, data, device)
    batch = min(2, int(tensors.labels.shape[0]))
    try:
        with torch.no_grad():
            model.eval()
            task.check(model(tensors.inputs[:batch]), tensors.labels[:batch])
    except ValueError as exc:
        raise Refused("data-mismatch", str(exc)) from None
    return session, tensors

def data_tensors(session: Session, data: DeviceData, device: torch.device) -> Tensors:
    """The device's arrays as normalised tensors (the session's statistics), on the training device."""
    limit = int(session.meta.get("data", {}).get("train_limit", 0))
    count = data.train_y.shape[0] if limit <= 0 else min(limit, data.train_y.shape[0])
    try:
        inputs = torch.from_numpy(normalize(data.train_x[:count], session.mean, session.std)).to(device)
        test_inputs = torch.from_numpy(normalize(data.test_x, session.mean, session.std)).to(device)
    except DataError as exc:
        raise Refused("data-mismatch", f"cannot normalise this device's data: {exc}") from None
    return Tensors(inputs, torch.from_numpy(np.ascontiguousarray(data.train_y[:count])).to(device), test_inputs,
                   torch.from_numpy(np.ascontiguousarray(data.test_y)).to(device))

