"""The session plan: every check a configuration must pass, done before anything is written.

``plan_session`` turns a ``Config`` into a ``SessionPlan``: the algorithm's options validated, the data set loaded
(or none, for a session bound for real devices), the model spec (input shape and outputs from ``[model]`` or the
data), the plugins the session uses resolved (and, for processes, importable by path), the model built and one
batch passed through it and the loss, the session's normalisation, and the initial weights of ``model.init`` (the
model's checks: ``runtime.model_checks``), the simulated clock's device timing and trace.
Every problem is a one-line ``ConfigError``; no run directory, shard, key or port exists yet. Knows no algorithm
by name and imports no transport.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedge.coordinator.config import Config, ConfigError, SessionDataError, local_clients
from fedge.plugins import PluginError, PluginRef, describe, is_path, load, registered
from fedge.runtime.model_checks import (
    build_checked,
    check_batch,
    frame_limit,
    initial_weights,
    model_spec,
    statistics,
)

log = logging.getLogger("fedge.coordinator")


@dataclass(frozen=True)
class SessionPlan:
    """What a checked configuration resolves to; ``Session`` and the local fleet are built from it."""

    config: Config
    spec: Any                                   # fedge.models.ModelSpec
    dataset: Any | None                         # fedge.fldata.Dataset, or None: a session without data
    plugins: dict[str, PluginRef] = field(default_factory=dict)
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    initial: dict[str, np.ndarray] | None = None
    shards: list[Any] = field(default_factory=list)  # a local fleet's client shards, partitioned in memory
    max_frame_bytes: int = 64 << 20  # the largest frame the coordinator accepts (frame_limit)
    privacy: Any | None = None  # fedge.coordinator.privacy.PrivacyPlan under privacy.mode = "central"

    @property
    def local(self) -> bool:
        return not self.config.fleet.bind

    @property
    def normalization(self) -> dict[str, list[float]] | None:
        """What the welcome carries, or None (agents then use their shards' partition statistics)."""
        if self.mean is None or self.std is None:
            return None
        return {"mean": list(self.mean), "std": list(self.std)}

    def welcome_extra(self) -> dict[str, Any]:
        return {"plugins": {kind: ref.as_dict() for kind, ref in self.plugins.items()},
                "normalization": self.normalization or {}}


def device_timing(config: Config) -> Any:
    """A simulated clock's device timing (``simulation.timing.DeviceTiming``) from ``[fleet]``, checked; None on the
    real clock."""
    fleet = config.fleet
    if fleet.clock != "simulated":
        return None
    from fedge.simulation.timing import DeviceTiming, DeviceTrace

    trace = None
    if fleet.trace:
        try:
            text = Path(fleet.trace).read_text()
        except OSError as exc:
            raise ConfigError(f"fleet.trace: cannot read {fleet.trace}: {exc.strerror or exc}") from None
        try:
            trace = DeviceTrace.parse(text, local_clients(config))
        except ValueError as exc:
            raise ConfigError(f"fleet.trace {fleet.trace}: {exc}") from None
    try:
        return DeviceTiming(step_s=fleet.step_s, speeds=fleet.speeds, speed_sigma=fleet.speed_sigma,
                            bandwidth_bps=fleet.bandwidth_bps, seed=config.run.seed, max_seconds=fleet.max_seconds,
                            trace=trace)
    except ValueError as exc:
        raise ConfigError(f"[fleet] {exc}") from None


def check_algorithm(config: Config) -> Config:
    """Build the algorithm's Config from [algorithm] now, so that a bad option is refused in one line before any
    run directory, shard or key exists (the session builds the same Config again)."""
    from fedge.algorithms.registry import make_config

    options = {key: value for key, value in config.algorithm.items() if key != "name"}
    try:
        make_config(config.algorithm_name, options)
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(f"[algorithm] {config.algorithm_name}: {exc}") from None
    check_device_state(config)
    return config


def check_device_state(config: Config) -> None:
    """An asynchronous session of an algorithm whose devices keep state (``device_state``: ef's) holds each device to
    one uncommitted update, so a version of ``asynchronous.buffer`` updates needs that many devices."""
    from fedge.algorithms.registry import spec_of

    if config.round.mode != "async" or not getattr(spec_of(config.algorithm_name).module.Server, "device_state",
                                                   False):
        return
    fleet = local_clients(config) if not config.fleet.bind else config.fleet.expect
    buffer = config.asynchronous.buffer
    if fleet and fleet < buffer:
        raise ConfigError(f"{config.algorithm_name}'s devices keep state, so each holds at most one uncommitted update "
                          f"and a version of asynchronous.buffer = {buffer} updates needs {buffer} devices; the fleet "
                          f"has {fleet}")


def check_training(config: Config) -> None:
    """[train] as the agents will build it (optimizer, epochs, batch size, rate), refused in one line now."""
    from fedge.algorithms.loop import TrainSettings

    t = config.train
    try:
        TrainSettings(epochs=t.epochs, batch_size=t.batch_size, lr=t.lr, optimizer=t.optimizer, momentum=t.momentum,
                      weight_decay=t.weight_decay, loss=t.loss, class_weights=tuple(t.class_weights))
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def by_import_path(config: Config) -> Config:
    """Names registered in code replaced by their import paths, so that agents in other processes (and the saved
    config.toml, for a resume) name what they can import; a lambda or closure is a one-line error here."""
    model, loss = config.model.name, config.train.loss
    try:
        if model in registered("model"):
            model = describe("model", model, for_processes=True).target
        if loss in registered("loss"):
            loss = describe("loss", loss, for_processes=True).target
    except PluginError as exc:
        raise ConfigError(str(exc)) from None
    return dataclasses.replace(config, model=dataclasses.replace(config.model, name=model),
                               train=dataclasses.replace(config.train, loss=loss))


def is_plugin_data(name: str) -> bool:
    """True when data.dataset names a data callable rather than a built-in loader."""
    return is_path(name) or name in registered("data")


def load_data(config: Config) -> tuple[Any | None, PluginRef | None]:
    """The coordinator's data set (None without one) and the data plugin it came from."""
    from fedge.fldata import DataError, dataset_from_arrays, load_dataset

    name = config.data.dataset
    if not name:
        return None, None
    try:
        if is_plugin_data(name):
            ref = describe("data", name, for_processes=False)
            fn = load(ref)
            try:
                arrays = fn()
            except Exception as exc:
                raise SessionDataError(f"data.dataset {name!r} raised {type(exc).__name__}: {exc}") from None
            return dataset_from_arrays(name, arrays), ref
        return load_dataset(name, config.data.path or None), None
    except PluginError as exc:
        raise ConfigError(f"data.dataset: {exc}") from None
    except DataError as exc:
        raise SessionDataError(f"data.dataset {name!r}: {exc}") from None


def plan_session(config: Config, dataset: Any | None = None, spent: Sequence[Any] = (), completed: int = 0) -> SessionPlan:
    """Check everything; see the module docstring."""
    check_algorithm(config)
    check_training(config)
    device_timing(config)
    if config.fleet.agent_python and not (Path(config.fleet.agent_python).is_file() and
                                          os.access(config.fleet.agent_python, os.X_OK)):
        raise ConfigError(f"fleet.agent_python {config.fleet.agent_python!r} is not an executable file")
    if config.fleet.mode == "simulated" and config.fleet.backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("fleet.backend = \"ray\" needs Ray on this machine: bash scripts/install.sh --ray (or "
                          "pip install -c constraints/ray.txt 'fedge[ray]')")
    config = by_import_path(config)
    plugins: dict[str, PluginRef] = {}
    if dataset is None:
        dataset, data_ref = load_data(config)
        if data_ref is not None:
            plugins["data"] = data_ref
    spec = model_spec(config, dataset)
    local = not config.fleet.bind
    try:
        model_ref = spec.plugin(for_processes=local)
        if model_ref is not None:
            plugins["model"] = model_ref
        if config.train.loss not in ("cross_entropy", "mse", "bce"):
            plugins["loss"] = describe("loss", config.train.loss, for_processes=local)
        from fedge.algorithms.registry import is_builtin

        if not is_builtin(config.algorithm_name):
            plugins["algorithm"] = describe("algorithm", config.algorithm_name, for_processes=local)
    except PluginError as exc:
        raise ConfigError(str(exc)) from None
    mean, std = statistics(config, dataset, spec)
    model = build_checked(config, spec)
    check_batch(config, spec, model, dataset, mean, std)
    initial = initial_weights(config, model) if config.model.init else None
    limit = frame_limit(model)
    privacy = private_plan(config, model, dataset, spent, completed) if config.privacy.mode == "central" else None
    if config.privacy.mode == "distributed":
        from fedge.coordinator.privacy import dp_accounting

        dp_accounting()  # the accountant's conversion: installed, or refused now in one line
    if config.secagg.enabled:
        check_secure(model)
    shards = local_shards(config, dataset) if local else []
    plan = SessionPlan(config, spec, dataset, plugins, mean, std, initial, shards, limit, privacy)
    check_welcome(plan)
    return plan


def private_plan(config: Config, model: Any, dataset: Any | None, spent: Sequence[Any] = (),
                 completed: int = 0) -> Any:
    """The privacy plan (the noise multiplier calibrated now, for the planned rounds, or, on a resume, from the
    ledger's ``spent`` events and the ``completed`` rounds: ``coordinator.privacy.make_plan``), after the checks only the
    built model and the data can answer: integer buffers (their lower median is not private) and evaluations
    on the devices (sent unclipped and unnoised) are refused."""
    from fedge.coordinator.privacy import make_plan

    integers = [name for name, tensor in model.state_dict().items() if not tensor.is_floating_point()]
    if integers:
        raise ConfigError(f"privacy.mode = \"central\" refuses a model with integer buffers ({', '.join(integers[:3])}"
                          f"): their lower median is not private; use a model without BatchNorm counters")
    if dataset is None or not len(dataset.test_y):
        raise ConfigError("privacy.mode = \"central\" needs a test set on the coordinator (data.dataset): the "
                          "devices' own evaluations would be released unnoised")
    plan = make_plan(config, spent, completed)
    warn_noisy_step(config, plan, sum(int(t.numel()) for t in model.parameters()))
    return plan


def warn_noisy_step(config: Config, plan: Any, size: int) -> None:
    """One warning line when the noise on the mean is large (z sqrt(d) / m above 1/2 of the clip) and the server
    step aggressive (lr / (1 - momentum) above 3): momentum then random-walks the weights, the update norms and the
    adaptive clip grow, and the noise with them (docs/privacy.md, "Choosing the server step")."""
    noise = plan.mechanism.noise_multiplier * math.sqrt(size) / plan.cohort
    step = config.server.lr / max(1.0 - config.server.momentum, 1e-12)
    if noise > 0.5 and step > 3:
        log.warning("privacy: the noise on the mean is %.3g of the clip (z sqrt(d) / m) and the server step "
                    "lr / (1 - momentum) = %.3g: momentum will random-walk the weights under this noise; lower "
                    "server.lr or server.momentum (docs/privacy.md, \"Choosing the server step\")", noise, step)


def check_secure(model: Any) -> None:
    """Secure aggregation sums the model's float tensors: a model with integer buffers is refused (the coordinator
    could not take their median of updates it never sees)."""
    integers = [name for name, tensor in model.state_dict().items() if not tensor.is_floating_point()]
    if integers:
        raise ConfigError(f"secagg.enabled refuses a model with integer buffers ({', '.join(integers[:3])}): "
                          "the devices mask float changes only; use a model without BatchNorm counters")


def check_welcome(plan: SessionPlan) -> None:
    """The session's settings must fit a Welcome (typed fields, the header's limits): refused now, in one line,
    rather than when the first agent says hello."""
    from fedge import codec
    from fedge.coordinator.welcome import welcome_fields
    from fedge.models import definition_hash

    try:
        codec.encode(codec.Welcome(run_id="plan", round=0, sender="coordinator", **{
            **welcome_fields(plan.config, plan.spec, definition_hash(plan.spec), 0, max(plan.config.data.clients, 1)),
            **plan.welcome_extra()}))
    except codec.CodecError as exc:
        raise ConfigError(f"the session's settings do not fit the welcome agents receive: {exc}") from None


def local_shards(config: Config, dataset: Any) -> list[Any]:
    """The local fleet's shards, one per agent (checked here; ``launch`` writes them into the run directory)."""
    from fedge.fldata import DataError, partition

    clients = local_clients(config)
    try:
        return partition(dataset, config.data.partition, clients, seed=config.run.seed, alpha=config.data.alpha,
                         classes_per_client=config.data.classes_per_client,
                         classes_layout=config.data.classes_layout, min_size=config.data.min_size)
    except DataError as exc:
        raise SessionDataError(f"data.partition {config.data.partition!r}: {exc}") from None
