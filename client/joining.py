"""Joining a session: the welcome checked against this device's rules and data, and the session built from it.

``join_session`` refuses (``Refused``: a code and a one-line reason) a welcome that names a plugin this device does
not allow (checked from package metadata before anything is imported, ``fedge.plugins.check_allowed``) or whose
distribution or version differs from the coordinator's, data that does not fit the model or the loss (one batch is
passed through both), or a session that carries no normalisation for data that has none. Otherwise it builds the
model, the task and the algorithm's client half, and the device's data as normalised tensors (``data_tensors``).
No sockets, no threads, no files. Must not know any algorithm by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from fedge import codec
from fedge.algorithms import REGISTRY, make_client
from fedge.algorithms.loop import TrainSettings, task_of
from fedge.algorithms.task import BUILTIN_LOSSES, Task
from fedge.client.data import DeviceData
from fedge.codec import vocabulary as words
from fedge.fldata import DataError, normalize
from fedge.models import MODELS, ModelSpec, build, definition_hash, state_to_arrays
from fedge.plugins import PluginError, PluginRef, check_allowed, describe, version_mismatch


class PluginRule(Protocol):
    """This device's rule for plugins a welcome names (an agent's settings; a simulated fleet's own)."""

    @property
    def allow_plugins(self) -> tuple[str, ...]: ...

    @property
    def allow_plugin_mismatch(self) -> bool: ...


@dataclass
class JoinedSession:
    """What the welcome told this agent, and what it built from it."""

    run_id: str
    index: int
    welcome: codec.Welcome
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



def training_device(choice: str) -> torch.device:
    """The device an agent trains on: ``agent.device`` (auto: CUDA when this torch build and board have it)."""
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def check_plugins(settings: PluginRule, described: Mapping[str, Any], spec: ModelSpec, loss: str,
                  algorithm: str) -> None:
    """Every plugin the welcome names must pass this device's rule before anything is imported, and match the
    coordinator's distribution and version (``described``: the welcome's plugins) unless the device allows a
    mismatch."""
    builtin = {"model": set(MODELS), "loss": set(BUILTIN_LOSSES), "algorithm": set(REGISTRY)}
    named = [(kind, name) for kind, name in (("model", spec.name), ("loss", loss), ("algorithm", algorithm))
             if name not in builtin[kind]]
    for kind, name in named:
        try:
            check_allowed(kind, name, settings.allow_plugins)
            here = describe(kind, name)
        except PluginError as exc:
            raise Refused(words.PLUGIN_REFUSED, str(exc)) from None
        if settings.allow_plugin_mismatch:
            continue
        if kind not in described:
            raise Refused(words.PLUGIN_MISMATCH, f"the welcome does not describe the {kind} plugin {name!r}")
        problem = version_mismatch(PluginRef.from_dict(described[kind]), here)
        if problem:
            raise Refused(words.PLUGIN_MISMATCH, problem)

def join_session(settings: PluginRule, data: DeviceData, device: torch.device,
                 welcome: codec.Welcome) -> tuple[JoinedSession, Tensors]:
    """The session the welcome describes, built after every check; Refused naming what does not fit."""
    try:
        spec = ModelSpec.from_dict(welcome.model)
        train = TrainSettings(**welcome.train)
    except (TypeError, ValueError) as exc:
        raise Refused(words.BAD_WELCOME, f"the welcome's model or train settings cannot be used: {exc}") from None
    check_plugins(settings, welcome.plugins, spec, train.loss, welcome.algorithm)
    if data.input_shape != spec.input_shape or data.num_outputs != spec.num_classes:
        kind = "targets" if data.has_targets else "classes"
        raise Refused(words.DATA_MISMATCH, f"this device's data is {data.input_shape} with {data.num_outputs} "
                      f"{kind}; the session's model wants {spec.input_shape} with {spec.num_classes} outputs")
    normalization = welcome.normalization
    partition = data.partition_stats
    mean = tuple(normalization.get("mean") or (data.mean if partition else ()))
    std = tuple(normalization.get("std") or (data.std if partition else ()))
    if not mean:
        raise Refused(words.NO_NORMALIZATION, "this device's data comes from a callable and the session carries "
                      "no normalisation: set data.mean and data.std on the coordinator")
    try:
        if definition_hash(spec) != welcome.model_hash:
            raise Refused(words.MODEL_MISMATCH, "this agent builds the model differently from the coordinator "
                          "(different Fedge, torch or plugin versions?)")
        model = build(spec, seed=welcome.seed).to(device)
        task = task_of(train, torch.from_numpy(data.train_y[:1]))
    except (PluginError, ValueError, RuntimeError, TypeError) as exc:
        raise Refused(words.MODEL_FAILED, f"cannot build the session's model or loss here: {exc}") from None
    try:
        client = make_client(welcome.algorithm, dict(welcome.algorithm_options), welcome.client_index)
    except (KeyError, TypeError, ValueError) as exc:
        raise Refused(words.BAD_WELCOME, f"cannot build the client half of {welcome.algorithm!r}: {exc}") from None
    client.initial_model(state_to_arrays(model))
    session = JoinedSession(run_id=welcome.run_id, index=welcome.client_index, welcome=welcome, model=model,
                      client=client, train=train, task=task, mean=tuple(float(v) for v in mean),
                      std=tuple(float(v) for v in std), heartbeat_s=welcome.heartbeat_s,
                      liveness_s=welcome.liveness_s)
    tensors = data_tensors(session, data, device)
    batch = min(2, int(tensors.labels.shape[0]))
    try:
        with torch.no_grad():
            model.eval()
            task.check(model(tensors.inputs[:batch]), tensors.labels[:batch])
    except (ValueError, RuntimeError) as exc:
        raise Refused(words.DATA_MISMATCH, f"one batch of this device's data does not pass through the session's "
                      f"model and loss: {exc}") from None
    return session, tensors

def inference_meta(session: JoinedSession, data: DeviceData) -> dict[str, Any]:
    """What ``edge-agent predict`` needs beside the weights, written with a round's state by an agent and by a
    simulated fleet's worker alike: the model spec and hash, the normalisation the device trained with, the
    features' type, the task and the algorithm."""
    return {"model": dict(session.welcome.model), "model_hash": session.welcome.model_hash,
            "mean": list(session.mean), "std": list(session.std), "features": str(data.train_x.dtype),
            "task": session.task.kind, "algorithm": session.welcome.algorithm}


def data_tensors(session: JoinedSession, data: DeviceData, device: torch.device) -> Tensors:
    """The device's arrays as normalised tensors (the session's statistics), on the training device."""
    limit = session.welcome.train_limit
    count = data.train_y.shape[0] if limit <= 0 else min(limit, data.train_y.shape[0])
    try:
        inputs = torch.from_numpy(normalize(data.train_x[:count], session.mean, session.std)).to(device)
        test_inputs = torch.from_numpy(normalize(data.test_x, session.mean, session.std)).to(device)
    except DataError as exc:
        raise Refused(words.DATA_MISMATCH, f"cannot normalise this device's data: {exc}") from None
    return Tensors(inputs, torch.from_numpy(np.ascontiguousarray(data.train_y[:count])).to(device), test_inputs,
                   torch.from_numpy(np.ascontiguousarray(data.test_y)).to(device))

