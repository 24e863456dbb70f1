"""The algorithm registry: a dict literal from name to the module that holds its Config, Server and Client.

Also the three factories the runtime uses, so that neither the coordinator nor the agent names an algorithm.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from fedge.algorithms import dssa, ef, fedavg, fedbn, fedcos, fedprox, heurpfedla, pfedla, scaffold
from fedge.algorithms.base import Arrays, ServerContext, config_from_options


@dataclass(frozen=True)
class AlgorithmSpec:
    """An algorithm module and, for wrappers (DSSA, ef-*), the base module it wraps."""

    module: ModuleType
    base: ModuleType | None = None


REGISTRY: dict[str, AlgorithmSpec] = {
    "fedavg": AlgorithmSpec(fedavg),
    "fedprox": AlgorithmSpec(fedprox),
    "scaffold": AlgorithmSpec(scaffold),
    "dssa-fedavg": AlgorithmSpec(dssa, fedavg),
    "dssa-fedprox": AlgorithmSpec(dssa, fedprox),
    "dssa-scaffold": AlgorithmSpec(dssa, scaffold),
    "ef-fedavg": AlgorithmSpec(ef, fedavg),
    "ef-fedprox": AlgorithmSpec(ef, fedprox),
    "fedbn": AlgorithmSpec(fedbn),
    "pfedla": AlgorithmSpec(pfedla),
    "heurpfedla": AlgorithmSpec(heurpfedla),
    "fedcos": AlgorithmSpec(fedcos),
}


def spec_of(name: str) -> AlgorithmSpec:
    if name not in REGISTRY:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def make_config(name: str, options: Mapping[str, Any]) -> Any:
    """The algorithm's frozen Config from the [algorithm] options (without 'name'); unknown keys are an error."""
    spec = spec_of(name)
    if spec.base is None:
        return config_from_options(spec.module.Config, options)
    return spec.module.make_config(spec.base, options)


def make_server(name: str, options: Mapping[str, Any], initial: Arrays, context: ServerContext) -> Any:
    spec = spec_of(name)
    config = make_config(name, options)
    if spec.base is None:
        return spec.module.Server(config, initial, context)
    return spec.module.Server(config, initial, context, spec.base)


def make_client(name: str, options: Mapping[str, Any], client_index: int) -> Any:
    spec = spec_of(name)
    config = make_config(name, options)
    if spec.base is None:
        return spec.module.Client(config, client_index)
    return spec.module.Client(config, client_index, spec.base)
