"""The algorithm registry: a dict literal from name to the module that holds its Config, Server and Client.

Also the three factories the runtime uses, so that neither the coordinator nor the agent names an algorithm.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from fedge.algorithms import dssa, ef, fedavg, fedbn, fedcos, fedprox, heurpfedla, pfedla, scaffold
from fedge.algorithms.base import Arrays, ClientHalf, ServerContext, ServerHalf, config_from_options


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


if TYPE_CHECKING:  # mypy checks every shipped half against the contract it is called through
    SERVER_HALVES: tuple[type[ServerHalf], ...] = (fedavg.Server, fedbn.Server, scaffold.Server, pfedla.Server,
                                                   fedcos.Server, dssa.Server, ef.Server)
    CLIENT_HALVES: tuple[type[ClientHalf], ...] = (fedavg.Client, fedprox.Client, fedbn.Client, scaffold.Client,
                                                   pfedla.Client, fedcos.Client, dssa.Client, ef.Client)


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


def make_server(name: str, options: Mapping[str, Any], initial: Arrays, context: ServerContext) -> ServerHalf:
    spec = spec_of(name)
    config = make_config(name, options)
    if spec.base is None:
        server: ServerHalf = spec.module.Server(config, initial, context)
    else:
        server = spec.module.Server(config, initial, context, spec.base)
    return server


def make_client(name: str, options: Mapping[str, Any], client_index: int) -> ClientHalf:
    spec = spec_of(name)
    config = make_config(name, options)
    if spec.base is None:
        client: ClientHalf = spec.module.Client(config, client_index)
    else:
        client = spec.module.Client(config, client_index, spec.base)
    return client
