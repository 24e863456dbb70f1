"""The functions behind ``fedge.api``: sessions, agents, registrations and loading a run's model.

Each is a thin composition of the runtime's own pieces (``runtime.plan`` and ``runtime.launch`` for a
session, ``edge_agent.agent`` for an agent, ``fedge.plugins`` for registrations), so that the CLI and the API run
the same code. Must not hold protocol or algorithm logic of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from fedge.coordinator.config import Config, ConfigError, from_dict
from fedge.plugins import register
from fedge.runtime.model_checks import model_file_arrays
from fedge.runtime.plan import SessionPlan, plan_session

ModelFactory = Callable[[tuple[int, ...], int, dict[str, Any]], nn.Module]


def session_config(**sections: Mapping[str, Any]) -> Config:
    """A checked session configuration from keyword sections, as in a TOML file: ``run={"rounds": 3}``,
    ``model={"name": "pkg.mod:factory", "options": {...}}``, ``algorithm={"name": "fedavg"}``; unknown sections or
    keys are a ``ConfigError`` naming them."""
    return from_dict({name: dict(values) for name, values in sections.items()})


def check_session(config: Config) -> SessionPlan:
    """Every check ``coordinator start`` makes before writing anything; ``ConfigError`` in one line."""
    return plan_session(config)


def run_session(config: Config, run_dir: str | Path | None = None, quiet: bool = True,
                resume: bool = False) -> dict[str, Any]:
    """Run a session (a local fleet of agent processes, or bound for real devices with ``fleet.bind``) to its end
    and return its report (report.json). ``resume``: continue the run in ``run_dir`` from its checkpoint."""
    from fedge.coordinator.config import load_config
    from fedge.coordinator.rundir import RunDir
    from fedge.runtime.launch import play

    path = Path(run_dir or config.run.run_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{config.algorithm_name}")
    if resume:
        if not (path / "checkpoint.npz").exists():
            raise ConfigError(f"{path} has no checkpoint.npz to resume from")
    elif (path / "checkpoint.npz").exists():
        raise ConfigError(f"{path} already holds a run: resume it or choose another run_dir")
    from fedge.runtime.launch import hold_run_dir, plan_resume

    # (a resume runs the run's own config.toml, its privacy planned from its ledger: coordinator.resume_rules)
    plan = plan_resume(path, load_config(path / "config.toml")) if resume else plan_session(config)
    run = RunDir(path)
    lock = hold_run_dir(run)
    try:
        return play(plan, run, resuming=resume, quiet=quiet)
    finally:
        lock.close()


def run_agent(coordinator: str, client_id: str, data: str | Callable[[], Any] | Mapping[str, Any],
              state_dir: str | Path, *, allow_plugins: Sequence[str] = (), allow_plugin_mismatch: bool = False,
              refresh: str = "once", **settings: Any) -> int:
    """Run an edge agent in this process until its session ends (``after_session="wait"``: until it is stopped,
    serving session after session); returns its exit code (0: done). ``data`` is a
    shard path, a ``package.module:callable`` name, a callable returning arrays, or the arrays themselves (a dict
    with train_x, train_y and optionally test_x, test_y, num_classes). Other settings as in the agent's TOML
    (``curve``, ``keys_dir``, ``coordinator_public_key``, ``device``, ``energy``)."""
    from dataclasses import replace

    from fedge.client.data import DeviceData
    from fedge.edge_agent.agent import Agent
    from fedge.edge_agent.config import AgentSettings

    source = data if isinstance(data, str) else f"in-process data of {client_id}"
    agent_settings = replace(AgentSettings(), coordinator=coordinator, client_id=client_id, data=source,
                             state_dir=str(state_dir), allow_plugins=tuple(allow_plugins),
                             allow_plugin_mismatch=allow_plugin_mismatch, data_refresh=refresh,
                             **{"after_session": "exit", **settings})
    agent_settings.validate()
    if isinstance(data, str):
        device_data = DeviceData.open(data)
    elif callable(data):
        device_data = DeviceData.from_function(data, source)
    else:
        arrays = dict(data)
        device_data = DeviceData.from_function(lambda: arrays, source)
    return Agent(agent_settings, data=device_data).run()


def register_model(name: str, factory: ModelFactory) -> str:
    """``model.name = name`` builds ``factory(input_shape, num_outputs, options)``. Returns the import path that
    agents in other processes will import ("" for a lambda or closure: then a session with processes refuses it)."""
    return register("model", name, factory)


def register_dataset(name: str, loader: Callable[[], Any]) -> str:
    """``data.dataset = name`` calls ``loader()``, which returns arrays (``fldata.dataset_from_arrays``)."""
    return register("data", name, loader)


def register_loss(name: str, loss: Callable[..., Any]) -> str:
    """``train.loss = name`` trains with ``loss(outputs, targets)``, a scalar tensor."""
    return register("loss", name, loss)


def load_model(source: str | Path, module: nn.Module) -> nn.Module:
    """Load a run's final model (a run directory or its model.npz) into ``module``, your own instance of the same
    architecture; names and shapes must match (ValueError naming the first that does not). Returns ``module`` in
    eval mode."""
    from fedge.models import arrays_to_state

    arrays_to_state(module, model_file_arrays(source, module, "this module"), strict=False)
    return module.eval()
